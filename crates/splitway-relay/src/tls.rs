//! Optional TLS 1.3 with mutual certificates on relay↔relay legs (rustls,
//! ring provider, private PKI: peers are verified against the configured CA
//! only).
//!
//! This kernel has no kTLS, so a TLS leg's records are sealed and opened in
//! user space and the leg cannot use splice. The rustls state machine is
//! driven directly over the leg's `TcpStream` (readiness plus
//! `try_read`/`try_write`) instead of through an owning AsyncRead/AsyncWrite
//! wrapper: the session keeps its `TcpStream` for socket options (SO_LINGER 0
//! on a reset, shutdown), and both forwarding directions of one task can use
//! one leg through `&self`. The lock is never held across an await.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{Error as PemError, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use splitway_proto::auth::NONCE_LEN;
use tokio::net::TcpStream;

use crate::source::Source;

/// TLS exporter label for the PSK handshake's channel binding (RFC 8446
/// §7.5): both ends derive the acceptor's nonce from it.
const EXPORTER_LABEL: &[u8] = b"EXPORTER-splitway-v1-psk-nonce";

/// This relay's certificate, key and the CA its peers' certificates must be
/// signed by, loaded and checked at config validation.
#[derive(Debug, Clone)]
pub struct TlsContext {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    /// For `[[peer]] tls = true` legs (we dial; our cert is the client's).
    pub client: Arc<ClientConfig>,
    /// For `[[listen]] mode = "peer"` with `tls = true` (client certs
    /// signed by `ca` required).
    pub server: Arc<ServerConfig>,
}

/// What a TLS peer leg dials with.
#[derive(Debug, Clone)]
pub struct PeerTls {
    /// The name the peer's certificate must carry (SAN).
    pub server_name: ServerName<'static>,
    pub config: Arc<ClientConfig>,
}

/// A certificate chain or key file is a few kilobytes; far more is a
/// wrong path (a device, a log), not PEM.
const MAX_PEM_FILE: u64 = 1 << 20;

/// A PEM file's bytes, read through the config's source; the error as
/// rustls' own file readers word it.
fn read_pem(source: &dyn Source, path: &Path) -> Result<Vec<u8>, PemError> {
    source
        .read(path, MAX_PEM_FILE, "a PEM file")
        .map_err(PemError::Io)
}

fn read_certs(source: &dyn Source, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(source, path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no CERTIFICATE in PEM", path.display()));
    }
    Ok(certs)
}

/// Loads and cross-checks the files, read through `source`; errors are
/// `(sub-key, message)`.
pub fn load(
    source: &dyn Source,
    cert: &Path,
    key: &Path,
    ca: &Path,
) -> Result<TlsContext, Vec<(&'static str, String)>> {
    let mut errs = Vec::new();
    let chain = read_certs(source, cert)
        .map_err(|e| errs.push(("cert", e)))
        .ok();
    let private = read_pem(source, key)
        .and_then(|pem| PrivateKeyDer::from_pem_slice(&pem))
        .map_err(|e| errs.push(("key", format!("{}: {e}", key.display()))))
        .ok();
    let roots = read_certs(source, ca)
        .and_then(|certs| {
            let mut roots = RootCertStore::empty();
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
            }
            Ok(Arc::new(roots))
        })
        .map_err(|e| errs.push(("ca", e)))
        .ok();
    let (Some(chain), Some(private), Some(roots)) = (chain, private, roots) else {
        return Err(errs);
    };
    build(chain, private, roots)
        .map(|(client, server)| TlsContext {
            cert: cert.to_owned(),
            key: key.to_owned(),
            ca: ca.to_owned(),
            client,
            server,
        })
        .map_err(|e| vec![e])
}

/// Dialing and accepting configs.
type Configs = (Arc<ClientConfig>, Arc<ServerConfig>);

fn build(
    chain: Vec<CertificateDer<'static>>,
    private: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
) -> Result<Configs, (&'static str, String)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls13 = &[&rustls::version::TLS13];
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| ("ca", format!("cannot verify peers with it: {e}")))?;
    // Our certificate serves both roles (client when dialing, server when
    // accepting); a certificate the peers would refuse is a config error.
    let (end, intermediates) = chain.split_first().expect("read_certs: not empty");
    verifier
        .verify_client_cert(end, intermediates, UnixTime::now())
        .map_err(|e| {
            (
                "cert",
                format!("not accepted by ca as a client certificate: {e}"),
            )
        })?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(tls13)
        .map_err(|e| ("cert", e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), private.clone_key())
        .map_err(|e| ("key", format!("does not fit cert: {e}")))?;
    // No session tickets: legs never resume, and a ticket arriving on an
    // idle pooled connection would look like a stray byte (is_alive).
    server.send_tls13_tickets = 0;
    let mut client = client_builder(provider)
        .map_err(|e| ("cert", e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, private)
        .map_err(|e| ("key", format!("does not fit cert: {e}")))?;
    client.resumption = Resumption::disabled();
    Ok((Arc::new(client), Arc::new(server)))
}

fn client_builder(
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, rustls::Error> {
    ClientConfig::builder_with_provider(provider).with_protocol_versions(&[&rustls::version::TLS13])
}

/// Parses a `server_name` (DNS name or IP address).
pub fn server_name(text: &str) -> Option<ServerName<'static>> {
    ServerName::try_from(text.to_owned()).ok()
}

/// The TLS state of one established leg; its bytes travel over the leg's
/// `TcpStream`, passed to every call.
pub struct TlsLeg {
    /// Boxed: rustls' state is over a kilobyte and legs move around.
    conn: Box<Mutex<Connection>>,
}

impl std::fmt::Debug for TlsLeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsLeg")
    }
}

/// `Read`/`Write` for rustls over a non-blocking tokio socket; WouldBlock
/// clears tokio's readiness so the next `readable()`/`writable()` waits.
struct Wire<'a>(&'a TcpStream);

impl Read for Wire<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for Wire<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TlsLeg {
    /// Client side of the handshake (we dial the peer).
    pub async fn connect(tcp: &TcpStream, peer: &PeerTls) -> io::Result<TlsLeg> {
        let conn = ClientConnection::new(peer.config.clone(), peer.server_name.clone())
            .map_err(tls_error)?;
        let leg = TlsLeg {
            conn: Box::new(Mutex::new(conn.into())),
        };
        leg.handshake(tcp).await?;
        Ok(leg)
    }

    /// Server side of the handshake (an upstream relay dialed us); its
    /// certificate must be signed by our CA.
    pub async fn accept(tcp: &TcpStream, config: &Arc<ServerConfig>) -> io::Result<TlsLeg> {
        let conn = rustls::ServerConnection::new(config.clone()).map_err(tls_error)?;
        let leg = TlsLeg {
            conn: Box::new(Mutex::new(conn.into())),
        };
        leg.handshake(tcp).await?;
        Ok(leg)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().expect("tls lock")
    }

    async fn handshake(&self, tcp: &TcpStream) -> io::Result<()> {
        loop {
            self.flush(tcp).await?;
            if !self.lock().is_handshaking() {
                return Ok(());
            }
            if !self.fill(tcp).await? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed during the TLS handshake",
                ));
            }
        }
    }

    /// The PSK handshake's acceptor nonce, bound to this TLS session.
    pub fn binding_nonce(&self) -> io::Result<[u8; NONCE_LEN]> {
        self.lock()
            .export_keying_material([0u8; NONCE_LEN], EXPORTER_LABEL, None)
            .map_err(tls_error)
    }

    /// Reads TLS bytes once and processes them. `Ok(false)`: TCP EOF.
    async fn fill(&self, tcp: &TcpStream) -> io::Result<bool> {
        loop {
            tcp.readable().await?;
            let mut conn = self.lock();
            match conn.read_tls(&mut Wire(tcp)) {
                Ok(0) => return Ok(false),
                Ok(_) => {
                    if let Err(e) = conn.process_new_packets() {
                        // rustls queued an alert for the peer: best effort.
                        while conn.wants_write() && conn.write_tls(&mut Wire(tcp)).is_ok() {}
                        return Err(tls_error(e));
                    }
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends every queued TLS record, in order (both directions may queue).
    async fn flush(&self, tcp: &TcpStream) -> io::Result<()> {
        loop {
            {
                let mut conn = self.lock();
                while conn.wants_write() {
                    match conn.write_tls(&mut Wire(tcp)) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                if !conn.wants_write() {
                    return Ok(());
                }
            }
            tcp.writable().await?;
        }
    }

    /// Reads plaintext. `Ok(0)` is the peer's close_notify (a clean
    /// half-close); a TCP FIN without it is an `UnexpectedEof` error (the
    /// stream may have been truncated), forwarded as a reset.
    pub async fn read(&self, tcp: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.lock().reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let open = self.fill(tcp).await?;
            // Processing may have queued records (alerts, key updates).
            self.flush(tcp).await?;
            if !open {
                // rustls now reports close_notify (0) or truncation (error).
                return match self.lock().reader().read(buf) {
                    Ok(n) => Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "TCP closed without TLS close_notify",
                    )),
                    Err(e) => Err(e),
                };
            }
        }
    }

    /// Seals and sends all of `data`.
    pub async fn write_all(&self, tcp: &TcpStream, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = self.lock().writer().write(data)?;
            data = &data[n..];
            self.flush(tcp).await?;
        }
        Ok(())
    }

    /// Half-close: close_notify, then FIN. Reading continues (TLS 1.3
    /// closes each direction on its own).
    pub async fn shutdown_write(&self, tcp: &TcpStream) -> io::Result<()> {
        self.lock().send_close_notify();
        self.flush(tcp).await?;
        splitway_sys::sock::shutdown_write(tcp)
    }
}
