//! The PROXY protocol at the relay's edges: reading the header a trusted
//! load balancer puts in front of a connection (`[[listen]]
//! accept_proxy_protocol`), and writing one to the server on a direct route
//! (`[[route]] proxy_protocol`).
//!
//! Reading never takes a byte past the header: it peeks, and consumes only
//! what the decoder attributes to the header (all of what it peeked while
//! the header is incomplete, since that is all header), so the listener's
//! own handshake then reads the socket as if the header had not been there.

use std::net::SocketAddr;
use std::time::Duration;

use crate::metrics::CloseReason;
use splitway_proto::proxy_protocol::{self, MAX_HEADER_LEN, ProxyError, V2_SIGNATURE};
use tokio::net::TcpStream;
use tracing::{debug, info};

use crate::config::{Listener, Route};
use crate::policy::REFUSALS;
use crate::route::allowed;

mod metrics;

pub use metrics::{ProxyProtocolMetrics, ProxyRefusal};

/// Why a connection's PROXY header was refused. Always the client's (the
/// load balancer's, or whoever forged it) fault.
#[derive(Debug, thiserror::Error)]
pub enum ProxyRefused {
    #[error("client {source_addr}: PROXY protocol: {error}")]
    Bad {
        source_addr: SocketAddr,
        error: ProxyError,
    },
    #[error("client {source_addr}: no PROXY header within {timeout:?}")]
    Timeout {
        source_addr: SocketAddr,
        timeout: Duration,
    },
    #[error("client {source_addr}: read while expecting a PROXY header: {error}")]
    Io {
        source_addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("client {source_addr} sent a PROXY header but is not in accept_proxy_protocol")]
    Untrusted { source_addr: SocketAddr },
    /// An untrusted explicit-proxy client sent nothing at all: the
    /// handshake timeout, spent here rather than twice.
    #[error("client {source_addr}: nothing received within {timeout:?}")]
    Silent {
        source_addr: SocketAddr,
        timeout: Duration,
    },
}

impl ProxyRefused {
    /// The refusal's metric label; `None` for a silent client, which is a
    /// handshake timeout and no PROXY matter.
    pub fn reason(&self) -> Option<ProxyRefusal> {
        Some(match self {
            ProxyRefused::Bad { error, .. } => match error {
                ProxyError::BadSignature => ProxyRefusal::Missing,
                ProxyError::Truncated(_) => ProxyRefusal::Truncated,
                ProxyError::V1TooLong | ProxyError::LengthTooLong(_) => ProxyRefusal::TooLong,
                _ => ProxyRefusal::Malformed,
            },
            ProxyRefused::Timeout { .. } => ProxyRefusal::Timeout,
            // A reset inside the header is a truncated header.
            ProxyRefused::Io { .. } => ProxyRefusal::Truncated,
            ProxyRefused::Untrusted { .. } => ProxyRefusal::Untrusted,
            ProxyRefused::Silent { .. } => return None,
        })
    }
}

/// Reads one PROXY header from `stream`, consuming exactly its bytes.
pub async fn read_header(
    stream: &TcpStream,
    source_addr: SocketAddr,
) -> Result<proxy_protocol::ProxyHeader, ProxyRefused> {
    let bad = |error| ProxyRefused::Bad { source_addr, error };
    let io = |error| ProxyRefused::Io { source_addr, error };
    let mut header = Vec::new();
    let mut peeked = vec![0u8; MAX_HEADER_LEN];
    loop {
        // Never more than the decoder could still call header.
        let room = MAX_HEADER_LEN - header.len();
        let n = stream.peek(&mut peeked[..room]).await.map_err(io)?;
        if n == 0 {
            return Err(bad(ProxyError::Truncated(header.len())));
        }
        let held = header.len();
        header.extend_from_slice(&peeked[..n]);
        match proxy_protocol::decode(&header).map_err(bad)? {
            Some((parsed, used)) => {
                // The header ends inside what we peeked: take exactly its rest.
                let mut rest = vec![0u8; used - held];
                stream.read_exact_ref(&mut rest).await.map_err(io)?;
                return Ok(parsed);
            }
            None => {
                // All of it is header: consume it, so the next peek waits
                // for new bytes instead of returning these again.
                stream.read_exact_ref(&mut peeked[..n]).await.map_err(io)?;
            }
        }
    }
}

/// `read_exact` on a shared `&TcpStream` (tokio implements AsyncRead for
/// `&mut TcpStream` only; readiness-based reads need no exclusive borrow).
trait ReadExactRef {
    async fn read_exact_ref(&self, buf: &mut [u8]) -> std::io::Result<()>;
}

impl ReadExactRef for TcpStream {
    async fn read_exact_ref(&self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            self.readable().await?;
            match self.try_read(&mut buf[done..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Whether `first` (a connection's first bytes) holds a PROXY signature.
/// Needs the whole signature: "P" alone may be a client's "POST".
fn has_signature(first: &[u8]) -> bool {
    first.starts_with(proxy_protocol::V1_PREFIX) || first.starts_with(&V2_SIGNATURE)
}

/// Applies a listener's `accept_proxy_protocol` to a new connection from
/// `source`: the client the relay should take it for, or, when it is
/// refused (already logged and reset), how its close counts ([`refused`]).
pub async fn admit(
    timeout: Duration,
    spec: &Listener,
    client_speaks_first: bool,
    stream: &TcpStream,
    source: SocketAddr,
) -> Result<SocketAddr, Option<ProxyRefusal>> {
    if spec.accept_proxy_protocol.is_empty() {
        return Ok(source);
    }
    let trusted = allowed(&spec.accept_proxy_protocol, source.ip(), false);
    let outcome = if trusted {
        match tokio::time::timeout(timeout, read_header(stream, source)).await {
            Ok(Ok(header)) => {
                // LOCAL (a balancer's health check) and UNKNOWN carry no
                // client: the connection is the balancer's own.
                let client = header
                    .source()
                    .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
                    .unwrap_or(source);
                debug!(%source, %client, version = header.version.label(), "PROXY header accepted");
                Ok(client)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ProxyRefused::Timeout {
                source_addr: source,
                timeout,
            }),
        }
    } else {
        untrusted(client_speaks_first, stream, source, timeout).await
    };
    match outcome {
        Ok(client) => Ok(client),
        Err(e) => {
            // Throttled like denials: a forging client must not flood the log.
            let reason = e.reason().map_or("silent", ProxyRefusal::as_str);
            if let Some(l) = REFUSALS.admit(reason, source.ip()) {
                info!(listener = %spec.addr, mode = spec.mode.as_str(), reason, error = %e, suppressed = l.suppressed, suppressed_other = l.suppressed_other, "refused");
            }
            // A reset: nobody on the other side is owed an orderly answer.
            let _ = splitway_sys::sock::set_linger_zero(stream);
            Err(e.reason())
        }
    }
}

/// Counts a connection [`admit`] refused (`reason`: its header's fault;
/// none: the header never came) and says how its close counts.
pub fn refused(counts: &ProxyProtocolMetrics, reason: Option<ProxyRefusal>) -> CloseReason {
    match reason {
        Some(reason) => {
            counts.refused(reason);
            CloseReason::BadRequest
        }
        None => CloseReason::HandshakeTimeout,
    }
}

/// An untrusted source on a listener that takes PROXY headers: refused if
/// it opens with one. Explicit proxies' clients speak first, so their first
/// bytes are awaited; a transparent client's protocol may have the server
/// speak first, and a peer's dialer waits for our challenge (unless its
/// 0-RTT Hello came with the SYN), so for them only what already arrived
/// is looked at.
async fn untrusted(
    client_speaks_first: bool,
    stream: &TcpStream,
    source: SocketAddr,
    timeout: Duration,
) -> Result<SocketAddr, ProxyRefused> {
    let mut first = [0u8; V2_SIGNATURE.len()];
    let n = match client_speaks_first {
        // WouldBlock (nothing yet) or an error the session will meet.
        false => splitway_sys::sock::peek_now(stream, &mut first).unwrap_or(0),
        true => {
            match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
                Ok(Ok(n)) => n,
                // The handshake meets the error again and reports it.
                Ok(Err(_)) => 0,
                Err(_) => {
                    return Err(ProxyRefused::Silent {
                        source_addr: source,
                        timeout,
                    });
                }
            }
        }
    };
    if has_signature(&first[..n]) {
        return Err(ProxyRefused::Untrusted {
            source_addr: source,
        });
    }
    Ok(source)
}

/// The header a direct route with `proxy_protocol` sends the server before
/// the client's bytes: the chain's original client and the server.
pub fn for_route(route: &Route, origin: SocketAddr, server: SocketAddr) -> Option<Vec<u8>> {
    let version = route.reveal.proxy_protocol?;
    let mut out = Vec::with_capacity(64);
    proxy_protocol::encode(version, origin, server, &mut out);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitway_proto::proxy_protocol::{Addresses, Version};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A loopback connection: (the relay's accepted end, the sender's end).
    async fn pair() -> (TcpStream, TcpStream, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sender = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, from) = listener.accept().await.unwrap();
        (accepted, sender, from)
    }

    fn header(version: Version) -> Vec<u8> {
        let mut h = Vec::new();
        proxy_protocol::encode(
            version,
            "192.0.2.9:4242".parse().unwrap(),
            "198.51.100.1:443".parse().unwrap(),
            &mut h,
        );
        h
    }

    async fn rest(stream: &TcpStream, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        stream.read_exact_ref(&mut buf).await.unwrap();
        buf
    }

    #[tokio::test]
    async fn takes_exactly_the_header_sent_with_data() {
        for version in [Version::V1, Version::V2] {
            let (accepted, mut sender, from) = pair().await;
            let mut wire = header(version);
            wire.extend_from_slice(b"\x05\x01\x00 and the rest");
            sender.write_all(&wire).await.unwrap();
            let parsed = read_header(&accepted, from).await.unwrap();
            assert_eq!(parsed.source(), Some("192.0.2.9:4242".parse().unwrap()));
            assert_eq!(rest(&accepted, 16).await, b"\x05\x01\x00 and the rest");
        }
    }

    #[tokio::test]
    async fn waits_for_a_header_in_pieces() {
        use std::task::Poll;
        for version in [Version::V1, Version::V2] {
            let (accepted, mut sender, from) = pair().await;
            let wire = header(version);
            let reader = read_header(&accepted, from);
            tokio::pin!(reader);
            // Cut inside the signature and inside the addresses: the reader
            // sees each piece alone (it has arrived, and the reader is
            // polled before the next is sent) and must wait for more.
            for piece in [&wire[..3], &wire[3..20]] {
                sender.write_all(piece).await.unwrap();
                accepted.readable().await.unwrap();
                let polled = std::future::poll_fn(|cx| Poll::Ready(reader.as_mut().poll(cx))).await;
                assert!(polled.is_pending(), "{version:?}: done after a piece");
            }
            let mut last = wire[20..].to_vec();
            last.extend_from_slice(b"next");
            sender.write_all(&last).await.unwrap();
            let parsed = reader.await.unwrap();
            assert_eq!(parsed.version, version);
            assert!(matches!(parsed.addresses, Addresses::Tcp { .. }));
            assert_eq!(rest(&accepted, 4).await, b"next");
        }
    }

    #[tokio::test]
    async fn close_inside_the_header_is_truncated() {
        let (accepted, mut sender, from) = pair().await;
        let wire = header(Version::V2);
        sender.write_all(&wire[..20]).await.unwrap();
        drop(sender);
        match read_header(&accepted, from).await {
            Err(e @ ProxyRefused::Bad { .. }) => {
                assert_eq!(e.reason(), Some(ProxyRefusal::Truncated), "{e}");
                assert!(e.to_string().contains("after 20 bytes"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn bad_signature_is_missing() {
        let (accepted, mut sender, from) = pair().await;
        sender.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let e = read_header(&accepted, from).await.unwrap_err();
        assert_eq!(e.reason(), Some(ProxyRefusal::Missing), "{e}");
    }
}
