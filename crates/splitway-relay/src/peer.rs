//! Relay↔relay legs: the authenticated handshake on both ends.
//!
//! Dialer (upstream): connect, wait for the Challenge, send Response+Header
//! in one write, then (concurrently with forwarding client data) read the
//! ServerProof and the Reply. Acceptor (downstream): send the Challenge at
//! accept, verify the Response, send the ServerProof, read the Header.
//! By default (`[accel] zero_rtt` unset or on) the dialer speaks first
//! instead: a Hello with the Header, in its TCP Fast Open SYN where the
//! kernel allows it and in the first segment after the handshake otherwise,
//! and the acceptor acts on it at once, guarded by a replay window. The
//! challenge is the fallback for a peer that refuses the Hello.
//! `docs/protocol.md` has the frames byte by byte.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngCore;
use rustls::ServerConfig;
use splitway_control::metrics::{
    AuthFailureReason, LegSide, Metrics, PeerHandshake, ZeroRttOutcome,
};
use splitway_proto::auth::{
    Acceptor, AuthError, Dialer, FRAME_HELLO, NONCE_LEN, Psk, RejectReason,
};
use splitway_proto::header::{Header, Reply, ReplyStatus};
use splitway_proto::zero_rtt::{self, Hello, Refusal, ReplayWindow};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::{Peer, Timeouts};
use crate::error::ConnError;
use crate::tls::{LegIo, TlsLeg};
use crate::tuning::{self, PEER_KEEPALIVE_DEFAULT};

/// Why reading a frame stopped.
#[derive(Debug)]
pub enum FrameError<E> {
    /// The other side closed before the frame was complete.
    Closed,
    Io(io::Error),
    Bad(E),
}

/// Reads from `s` into `buf` until `decode` yields a frame; the frame's bytes
/// are removed from `buf` and whatever followed stays there (it belongs to
/// the data stream).
pub async fn read_frame<'a, T, E>(
    s: impl Into<LegIo<'a>>,
    buf: &mut Vec<u8>,
    mut decode: impl FnMut(&[u8]) -> Result<Option<(T, usize)>, E>,
) -> Result<T, FrameError<E>> {
    let s = s.into();
    loop {
        if !buf.is_empty()
            && let Some((v, n)) = decode(buf).map_err(FrameError::Bad)?
        {
            buf.drain(..n);
            return Ok(v);
        }
        let mut chunk = [0u8; 2048];
        match s.read(&mut chunk).await {
            Ok(0) => return Err(FrameError::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A TLS leg closed without close_notify: between frames that is
            // a plain close (a pooled connection retired by its owner).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
}

fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

/// A connected, authenticated-by-us leg to the next relay whose own proof
/// and Reply are still to be read.
pub struct PeerLeg {
    pub stream: TcpStream,
    pub peer: String,
    dialer: Dialer,
    buf: Vec<u8>,
    /// Set on a `tls = true` peer: the leg's bytes go through it.
    pub tls: Option<TlsLeg>,
}

/// Opens a tuned connection to `peer`. `turbo_buffer` is turbo-start's
/// buffer size for peers whose config sets none. With `fast_open`, connect
/// returns at once when a TFO cookie is cached and the first write leaves in
/// the SYN (a 0-RTT Hello is sure to follow).
pub async fn connect(
    peer: &Peer,
    timeouts: &Timeouts,
    turbo_buffer: Option<usize>,
    fast_open: bool,
) -> Result<TcpStream, ConnError> {
    let io_err = |op, source| ConnError::PeerIo {
        peer: peer.name.clone(),
        op,
        source,
    };
    let sock = match peer.addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(|e| ConnError::Internal(format!("socket: {e}")))?;
    tuning::apply_with_buffers(
        &sock,
        &peer.tuning,
        Some(PEER_KEEPALIVE_DEFAULT),
        turbo_buffer,
    )
    .map_err(|e| ConnError::Internal(format!("tuning leg to peer {}: {e}", peer.name)))?;
    if fast_open {
        splitway_sys::sock::set_fastopen_connect(&sock)
            .map_err(|e| ConnError::Internal(e.to_string()))?;
    }
    match tokio::time::timeout(timeouts.connect, sock.connect(peer.addr)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(io_err("connect", e)),
        Err(_) => Err(ConnError::PeerTimeout {
            peer: peer.name.clone(),
            during: "connecting",
        }),
    }
}

/// The TLS handshake on a `tls = true` peer's leg (none otherwise).
async fn secure(
    stream: &TcpStream,
    peer: &Peer,
    timeouts: &Timeouts,
) -> Result<Option<TlsLeg>, ConnError> {
    let Some(cfg) = &peer.tls else {
        return Ok(None);
    };
    match tokio::time::timeout(timeouts.handshake, TlsLeg::connect(stream, cfg)).await {
        Ok(Ok(t)) => Ok(Some(t)),
        Ok(Err(e)) => Err(ConnError::PeerTls {
            peer: peer.name.clone(),
            detail: e.to_string(),
        }),
        Err(_) => Err(ConnError::PeerTimeout {
            peer: peer.name.clone(),
            during: "in the TLS handshake",
        }),
    }
}

/// Reads the peer's Challenge (or, inside TLS, derives its nonce from the
/// session) and computes our Response.
async fn answer_challenge(
    stream: LegIo<'_>,
    peer: &Peer,
    psk: &Psk,
    timeouts: &Timeouts,
) -> Result<(Dialer, Vec<u8>), ConnError> {
    let mut dialer = Dialer::new(psk.clone(), nonce());
    if let Some(tls) = stream.tls {
        let response = tls
            .binding_nonce()
            .and_then(|n| dialer.on_bound_nonce(n).map_err(io::Error::other))
            .map_err(|e| ConnError::Internal(format!("TLS binding for {}: {e}", peer.name)))?;
        return Ok((dialer, response));
    }
    let mut buf = Vec::new();
    let response = tokio::time::timeout(
        timeouts.handshake,
        read_frame(stream, &mut buf, |b| dialer.on_challenge(b)),
    )
    .await
    .map_err(|_| ConnError::PeerTimeout {
        peer: peer.name.clone(),
        during: "waiting for its challenge",
    })?
    .map_err(|e| peer_frame_error(&peer.name, "challenge", e))?;
    if !buf.is_empty() {
        return Err(ConnError::PeerProtocol {
            peer: peer.name.clone(),
            detail: "sent data before our response".into(),
        });
    }
    Ok((dialer, response))
}

/// Connects to `peer`, authenticates and sends `header` (and the client's
/// first bytes) in the same write as our Response; the peer's proof is read
/// later, with its Reply. With `zero_rtt` (plain legs only) a Hello replaces
/// the challenge, in the SYN with `fast_open`; a peer that refuses it is
/// dialed again with the challenge handshake, the same bytes resent.
#[allow(clippy::too_many_arguments)]
pub async fn dial(
    peer: &Peer,
    psk: &Psk,
    header: &Header,
    early_data: &[u8],
    timeouts: &Timeouts,
    turbo_buffer: Option<usize>,
    zero_rtt: bool,
    fast_open: bool,
    metrics: &Metrics,
) -> Result<PeerLeg, ConnError> {
    if zero_rtt && peer.tls.is_none() {
        match dial_hello(
            peer,
            psk,
            header,
            early_data,
            timeouts,
            turbo_buffer,
            fast_open,
        )
        .await
        {
            Ok(leg) => {
                metrics.zero_rtt(ZeroRttOutcome::Sent);
                metrics.peer_handshake(LegSide::Dial, hello_kind(&leg.stream));
                return Ok(leg);
            }
            Err(HelloDial::Refused(reason)) => {
                metrics.zero_rtt(ZeroRttOutcome::Fallback);
                tracing::info!(peer = %peer.name, %reason, "peer refused our 0-RTT hello; redialing with the challenge handshake");
            }
            Err(HelloDial::Failed(e)) => return Err(e),
        }
    }
    let stream = connect(peer, timeouts, turbo_buffer, false).await?;
    let tls = secure(&stream, peer, timeouts).await?;
    let io = LegIo::new(&stream, tls.as_ref());
    let (dialer, mut out) = answer_challenge(io, peer, psk, timeouts).await?;
    header.encode(&mut out);
    out.extend_from_slice(early_data);
    io.write_all(&out)
        .await
        .map_err(|source| ConnError::PeerIo {
            peer: peer.name.clone(),
            op: "send header",
            source,
        })?;
    metrics.peer_handshake(LegSide::Dial, PeerHandshake::Challenge);
    Ok(PeerLeg {
        stream,
        peer: peer.name.clone(),
        dialer,
        buf: Vec::new(),
        tls,
    })
}

/// Whether a Hello rode the SYN: the kernel knows whether SYN data was
/// acknowledged (taken by the listener), on both ends.
fn hello_kind(stream: &TcpStream) -> PeerHandshake {
    // A failed TCP_INFO read only loses the distinction, not the count.
    if splitway_sys::sock::syn_data_acked(stream).unwrap_or(false) {
        PeerHandshake::HelloSyn
    } else {
        PeerHandshake::Hello
    }
}

enum HelloDial {
    /// The peer answered with a Reject worth a retry with the challenge:
    /// stale (clock skew, restart), overloaded (replay window full), or it
    /// does not take 0-RTT Hellos at all.
    Refused(RejectReason),
    Failed(ConnError),
}

impl From<ConnError> for HelloDial {
    fn from(e: ConnError) -> Self {
        HelloDial::Failed(e)
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The 0-RTT dial: Hello ‖ Header ‖ first bytes as the first write (of a
/// TFO socket with `fast_open`), then the peer's proof. Waiting for the
/// proof costs nothing in the SYN: the acceptor sends it at the SYN, so it
/// comes back with the SYN-ACK, before which no further byte could leave
/// anyway. Without TFO it holds back only client bytes beyond the first
/// write, which the Reply (a round trip later still) would not release
/// sooner. Until the proof is in, the client bytes we were given are still
/// ours to resend on a fallback.
async fn dial_hello(
    peer: &Peer,
    psk: &Psk,
    header: &Header,
    early_data: &[u8],
    timeouts: &Timeouts,
    turbo_buffer: Option<usize>,
    fast_open: bool,
) -> Result<PeerLeg, HelloDial> {
    let stream = connect(peer, timeouts, turbo_buffer, fast_open).await?;
    let mut dialer = Dialer::new(psk.clone(), nonce());
    let mut encoded = Vec::with_capacity(header.encoded_len());
    header.encode(&mut encoded);
    let mut out = dialer
        .hello(unix_ms(), &encoded)
        .map_err(|e| ConnError::Internal(format!("hello for {}: {e}", peer.name)))?;
    out.extend_from_slice(early_data);
    let io = LegIo::new(&stream, None);
    io.write_all(&out)
        .await
        .map_err(|source| ConnError::PeerIo {
            peer: peer.name.clone(),
            op: "send hello",
            source,
        })?;
    let (proof, buf) = read_proof(io, &mut dialer, &peer.name, timeouts).await?;
    match proof {
        Ok(()) => Ok(PeerLeg {
            stream,
            peer: peer.name.clone(),
            dialer,
            buf,
            tls: None,
        }),
        Err(FrameError::Bad(AuthError::Rejected(
            r @ (RejectReason::Stale
            | RejectReason::Overloaded
            | RejectReason::Malformed
            | RejectReason::UnsupportedVersion),
        ))) => Err(HelloDial::Refused(r)),
        Err(e) => Err(HelloDial::Failed(proof_error(&peer.name, e))),
    }
}

/// Reads the peer's ServerProof within the handshake timeout: the read's
/// outcome, and the bytes that came after the proof.
async fn read_proof(
    io: LegIo<'_>,
    dialer: &mut Dialer,
    peer: &str,
    timeouts: &Timeouts,
) -> Result<(Result<(), FrameError<AuthError>>, Vec<u8>), ConnError> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(
        timeouts.handshake,
        read_frame(io, &mut buf, |b| {
            dialer.on_server_proof(b).map(|o| o.map(|n| ((), n)))
        }),
    )
    .await
    .map_err(|_| ConnError::PeerTimeout {
        peer: peer.to_owned(),
        during: "waiting for its proof",
    })?;
    Ok((read, buf))
}

/// A failed read of the peer's proof: its Reject, or what went wrong.
fn proof_error(peer: &str, e: FrameError<AuthError>) -> ConnError {
    match e {
        FrameError::Bad(AuthError::Rejected(r)) => ConnError::PeerRejected {
            peer: peer.to_owned(),
            reason: r.to_string(),
        },
        e => peer_frame_error(peer, "proof", e),
    }
}

/// The acceptor's memory of 0-RTT Hellos (`[accel] zero_rtt`), sharded by
/// nonce so concurrent accepts rarely meet on one lock.
pub struct HelloWindow {
    shards: Box<[Mutex<ReplayWindow>]>,
}

impl HelloWindow {
    const SHARDS: usize = 16;
    /// Nonces remembered at most (about 48 bytes each): beyond that Hellos
    /// are refused as overloaded and dialers use the challenge handshake.
    const CAPACITY: usize = 1 << 18;

    /// A window starting now: Hellos stamped before this process started
    /// are refused, since the nonces a previous process saw are gone.
    pub fn new(window: Duration) -> HelloWindow {
        let now = unix_ms();
        let window_ms = window.as_millis() as u64;
        let shards = (0..Self::SHARDS)
            .map(|_| {
                Mutex::new(ReplayWindow::new(
                    window_ms,
                    now,
                    Self::CAPACITY / Self::SHARDS,
                ))
            })
            .collect();
        HelloWindow { shards }
    }

    fn admit(&self, hello: &Hello) -> Result<(), Refusal> {
        let shard = &self.shards[usize::from(hello.nonce_c[0]) % Self::SHARDS];
        // A panic while holding the lock leaves the window consistent
        // (admit's updates are single inserts), so poisoning is ignored.
        let mut w = shard.lock().unwrap_or_else(|p| p.into_inner());
        w.admit(unix_ms(), hello.timestamp_ms, &hello.nonce_c)
    }
}

/// A connection to a peer that completed mutual authentication and waits,
/// idle, for the one split connection it will carry.
pub struct Pooled {
    pub stream: TcpStream,
    tls: Option<TlsLeg>,
    dialer: Dialer,
    pub born: std::time::Instant,
}

/// Opens and fully authenticates a connection for the pool.
pub async fn dial_pooled(
    peer: &Peer,
    psk: &Psk,
    timeouts: &Timeouts,
    turbo_buffer: Option<usize>,
) -> Result<Pooled, ConnError> {
    let stream = connect(peer, timeouts, turbo_buffer, false).await?;
    let tls = secure(&stream, peer, timeouts).await?;
    let io = LegIo::new(&stream, tls.as_ref());
    let (mut dialer, response) = answer_challenge(io, peer, psk, timeouts).await?;
    io.write_all(&response)
        .await
        .map_err(|source| ConnError::PeerIo {
            peer: peer.name.clone(),
            op: "send response",
            source,
        })?;
    let (proof, buf) = read_proof(io, &mut dialer, &peer.name, timeouts).await?;
    proof.map_err(|e| proof_error(&peer.name, e))?;
    if !buf.is_empty() {
        return Err(ConnError::PeerProtocol {
            peer: peer.name.clone(),
            detail: "sent data before our header".into(),
        });
    }
    Ok(Pooled {
        stream,
        tls,
        dialer,
        born: std::time::Instant::now(),
    })
}

impl Pooled {
    /// Whether the peer is still there: no FIN, no RST, no stray bytes (on
    /// TLS too: the acceptor sends nothing after its proof, not even a
    /// session ticket).
    pub fn is_alive(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Sends the header (and the client's first bytes, in the same
    /// segment); the connection is now this split connection's.
    pub async fn carry(
        self,
        peer: &str,
        header: &Header,
        early_data: &[u8],
    ) -> Result<PeerLeg, ConnError> {
        let mut out = Vec::new();
        header.encode(&mut out);
        out.extend_from_slice(early_data);
        LegIo::new(&self.stream, self.tls.as_ref())
            .write_all(&out)
            .await
            .map_err(|source| ConnError::PeerIo {
                peer: peer.to_owned(),
                op: "send header on pooled connection",
                source,
            })?;
        Ok(PeerLeg {
            stream: self.stream,
            peer: peer.to_owned(),
            dialer: self.dialer,
            buf: Vec::new(),
            tls: self.tls,
        })
    }
}

fn peer_frame_error<E: std::fmt::Display>(peer: &str, what: &str, e: FrameError<E>) -> ConnError {
    match e {
        FrameError::Closed => ConnError::PeerProtocol {
            peer: peer.to_owned(),
            detail: format!("closed before its {what}"),
        },
        FrameError::Io(source) => ConnError::PeerIo {
            peer: peer.to_owned(),
            op: "read",
            source,
        },
        FrameError::Bad(e) => ConnError::PeerProtocol {
            peer: peer.to_owned(),
            detail: format!("bad {what}: {e}"),
        },
    }
}

impl PeerLeg {
    /// Reads the peer's proof (mutual authentication) and its Reply. Returns
    /// the status and the data bytes that followed the Reply.
    pub async fn await_reply(
        stream: LegIo<'_>,
        peer: &str,
        mut dialer: Dialer,
        mut buf: Vec<u8>,
    ) -> Result<(ReplyStatus, Vec<u8>), ConnError> {
        if !dialer.is_authenticated() {
            read_frame(stream, &mut buf, |b| {
                dialer.on_server_proof(b).map(|o| o.map(|n| ((), n)))
            })
            .await
            .map_err(|e| proof_error(peer, e))?;
        }
        let reply = read_frame(stream, &mut buf, Reply::decode)
            .await
            .map_err(|e| peer_frame_error(peer, "reply", e))?;
        Ok((reply.status, buf))
    }

    /// Splits the leg into what forwarding needs.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(self) -> (TcpStream, String, Dialer, Vec<u8>, Option<TlsLeg>) {
        (self.stream, self.peer, self.dialer, self.buf, self.tls)
    }

    /// Puts a leg back together (strict mode read its Reply ahead and puts
    /// the bytes back in `buf` for forwarding to read again).
    pub fn from_parts(
        stream: TcpStream,
        peer: String,
        dialer: Dialer,
        buf: Vec<u8>,
        tls: Option<TlsLeg>,
    ) -> PeerLeg {
        PeerLeg {
            stream,
            peer,
            dialer,
            buf,
            tls,
        }
    }
}

/// What the downstream end of a peer leg learned from the upstream relay.
pub struct Accepted {
    pub header: Header,
    /// Client bytes that arrived right behind the header.
    pub early_data: Vec<u8>,
    /// The leg's TLS session, on a `tls = true` peer listener.
    pub tls: Option<TlsLeg>,
}

/// Runs the acceptor side of the handshake within `deadline`. Failures are
/// counted by reason and answered with a Reject frame where one helps the
/// operator on the other end (wrong key), never with anything forwarded.
/// `hellos`: this relay takes 0-RTT Hellos (plain legs only).
pub async fn accept(
    stream: &TcpStream,
    tls: Option<&Arc<ServerConfig>>,
    keys: &[Psk],
    timeouts: &Timeouts,
    metrics: &Metrics,
    hellos: Option<&HelloWindow>,
) -> Result<Accepted, ConnError> {
    let fail = |(reason, err): (Option<AuthFailureReason>, ConnError)| {
        if let Some(r) = reason {
            metrics.auth_failure(r);
        }
        err
    };
    // A TLS listener's first stage: anything that does not complete TLS in
    // time (no TLS at all, a certificate not from our CA, silence) counts
    // as reason "tls".
    let leg = match tls {
        Some(cfg) => {
            let tls_failed =
                |detail| fail((Some(AuthFailureReason::Tls), ConnError::ClientTls(detail)));
            match tokio::time::timeout(timeouts.handshake, TlsLeg::accept(stream, cfg)).await {
                Ok(Ok(leg)) => Some(leg),
                Ok(Err(e)) => return Err(tls_failed(e.to_string())),
                Err(_) => {
                    return Err(tls_failed(format!(
                        "handshake not finished within {:?}",
                        timeouts.handshake
                    )));
                }
            }
        }
        None => None,
    };
    let io = LegIo::new(stream, leg.as_ref());
    let hellos = hellos.filter(|_| leg.is_none());
    let mut first_bytes = Vec::new();
    if hellos.is_some() {
        // A Hello that rode the SYN (TCP Fast Open) is queued already at
        // accept: then no Challenge is sent.
        crate::session::take_ready_bytes(stream, &mut first_bytes)
            .map_err(|e| fail(client_io("read hello")(e)))?;
    }
    let authenticated = match tokio::time::timeout(
        timeouts.handshake,
        authenticate(io, keys, hellos, first_bytes, metrics),
    )
    .await
    {
        Ok(r) => r.map_err(fail)?,
        Err(_) => {
            return Err(fail((
                Some(AuthFailureReason::Timeout),
                ConnError::ClientTimeout(timeouts.handshake),
            )));
        }
    };
    let buf = match authenticated {
        Authenticated::Challenged(buf) => buf,
        Authenticated::Hello { header, rest } => {
            return Ok(Accepted {
                header,
                early_data: rest,
                tls: leg,
            });
        }
    };
    // Authenticated: an upstream pool may keep this connection idle for a
    // while before its header, so the header has its own, longer deadline.
    let (header, early_data) =
        read_header(io, buf, timeouts.pooled_header)
            .await
            .map_err(|(reason, err)| {
                // A pooled connection closed unused (upstream restart, retired
                // by age) is not an authentication failure.
                if let Some(r) = reason {
                    metrics.auth_failure(r);
                }
                err
            })?;
    Ok(Accepted {
        header,
        early_data,
        tls: leg,
    })
}

fn client_io(op: &'static str) -> impl Fn(io::Error) -> (Option<AuthFailureReason>, ConnError) {
    move |source| {
        (
            Some(AuthFailureReason::Closed),
            ConnError::ClientIo { op, source },
        )
    }
}

enum Authenticated {
    /// Version 1: the bytes after the Response (the Header comes next).
    Challenged(Vec<u8>),
    /// A fresh 0-RTT Hello: its Header, and the client bytes after it.
    Hello { header: Header, rest: Vec<u8> },
}

enum FirstFrame {
    Response(Vec<u8>),
    Hello(Hello),
}

/// Challenge, Response, proof; or a Hello and proof. Inside TLS the
/// Challenge is not sent: its nonce is the session's. A Hello that arrives
/// after the Challenge went out (no TFO cookie yet) is taken all the same.
async fn authenticate(
    stream: LegIo<'_>,
    keys: &[Psk],
    hellos: Option<&HelloWindow>,
    mut buf: Vec<u8>,
    metrics: &Metrics,
) -> Result<Authenticated, (Option<AuthFailureReason>, ConnError)> {
    let nonce_s = match stream.tls {
        Some(t) => t.binding_nonce().map_err(|e| {
            (
                Some(AuthFailureReason::Tls),
                ConnError::Internal(format!("TLS binding: {e}")),
            )
        })?,
        None => nonce(),
    };
    let mut acceptor = Acceptor::new(keys.to_vec(), nonce_s);
    let hello_queued = hellos.is_some() && buf.first() == Some(&FRAME_HELLO);
    if stream.tls.is_none() && !hello_queued {
        stream
            .write_all(&acceptor.challenge())
            .await
            .map_err(client_io("send challenge"))?;
    }
    let first = read_frame(stream, &mut buf, |b| match (b[0], hellos) {
        (FRAME_HELLO, Some(_)) => {
            zero_rtt::on_hello(keys, b).map(|o| o.map(|(h, n)| (FirstFrame::Hello(h), n)))
        }
        _ => acceptor
            .on_response(b)
            .map(|o| o.map(|(p, n)| (FirstFrame::Response(p), n))),
    })
    .await;
    let first = match first {
        Ok(f) => f,
        Err(FrameError::Bad(e)) => {
            if let Some(r) = e.reject_reason() {
                // Best effort: the connection is refused either way.
                let _ = stream.write_all(&Acceptor::reject(r)).await;
            }
            return Err((Some(auth_reason(&e)), ConnError::PeerAuth(e)));
        }
        Err(FrameError::Closed) => {
            return Err((
                Some(AuthFailureReason::Closed),
                ConnError::ClientProtocol("closed during authentication".into()),
            ));
        }
        Err(FrameError::Io(e)) => return Err(client_io("read response")(e)),
    };
    match first {
        FirstFrame::Response(proof) => {
            stream
                .write_all(&proof)
                .await
                .map_err(client_io("send proof"))?;
            metrics.peer_handshake(LegSide::Accept, PeerHandshake::Challenge);
            Ok(Authenticated::Challenged(buf))
        }
        FirstFrame::Hello(hello) => {
            let window = hellos.expect("a Hello is only decoded with a window");
            if let Err(refusal) = window.admit(&hello) {
                let (outcome, counted) = match refusal {
                    // A replay holds no key of its own: count it as an attack.
                    Refusal::Replayed => {
                        (ZeroRttOutcome::Replay, Some(AuthFailureReason::Rejected))
                    }
                    // A real peer retries with the challenge: not a failure.
                    Refusal::Stale => (ZeroRttOutcome::Stale, None),
                    Refusal::Full => (ZeroRttOutcome::Full, None),
                };
                metrics.zero_rtt(outcome);
                // Best effort: the connection is refused either way.
                let _ = stream
                    .write_all(&Acceptor::reject(refusal.reject_reason()))
                    .await;
                return Err((
                    counted,
                    ConnError::ClientProtocol(format!("0-RTT hello refused: {}", refusal.label())),
                ));
            }
            stream
                .write_all(hello.proof())
                .await
                .map_err(client_io("send proof"))?;
            metrics.zero_rtt(ZeroRttOutcome::Accepted);
            metrics.peer_handshake(LegSide::Accept, hello_kind(stream.tcp));
            Ok(Authenticated::Hello {
                header: hello.header,
                rest: buf,
            })
        }
    }
}

async fn read_header(
    stream: LegIo<'_>,
    mut buf: Vec<u8>,
    deadline: Duration,
) -> Result<(Header, Vec<u8>), (Option<AuthFailureReason>, ConnError)> {
    let header =
        match tokio::time::timeout(deadline, read_frame(stream, &mut buf, Header::decode)).await {
            Err(_) => {
                return Err((None, ConnError::ClientTimeout(deadline)));
            }
            Ok(Ok(h)) => h,
            Ok(Err(FrameError::Bad(e))) => {
                let _ = stream.write_all(&reply_bytes(ReplyStatus::BadHeader)).await;
                return Err((
                    Some(AuthFailureReason::Malformed),
                    ConnError::ClientProtocol(format!("bad header: {e}")),
                ));
            }
            Ok(Err(FrameError::Closed)) => return Err((None, ConnError::PooledUnused)),
            Ok(Err(FrameError::Io(source))) => {
                return Err((
                    None,
                    ConnError::ClientIo {
                        op: "read header",
                        source,
                    },
                ));
            }
        };
    Ok((header, buf))
}

fn auth_reason(e: &AuthError) -> AuthFailureReason {
    match e.reason_label() {
        "bad_magic" => AuthFailureReason::BadMagic,
        "bad_version" => AuthFailureReason::BadVersion,
        "bad_mac" => AuthFailureReason::BadMac,
        "rejected" => AuthFailureReason::Rejected,
        _ => AuthFailureReason::Malformed,
    }
}

/// An encoded Reply frame.
pub fn reply_bytes(status: ReplyStatus) -> Vec<u8> {
    let mut out = Vec::new();
    Reply { status }.encode(&mut out);
    out
}
