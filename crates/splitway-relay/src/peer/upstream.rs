//! The upstream end of a relay leg: it dials (fresh, from the pool, or
//! with a 0-RTT Hello whose bytes are `zero_rtt`'s), authenticates and
//! sends the header.

use std::io;
use std::net::SocketAddr;

use crate::metrics::{LegSide, Metrics, PeerHandshake};
use splitway_proto::auth::{AuthError, Dialer, Psk, RejectReason};
use splitway_proto::header::{Header, Reply, ReplyStatus};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::{Peer, Timeouts};
use crate::error::ConnError;
use crate::leg_io::{FrameError, LegIo, read_frame};
use crate::tls::TlsLeg;
use crate::tuning::{self, PEER_KEEPALIVE_DEFAULT};

use super::{hello_kind, nonce, peer_frame_error};
use crate::zero_rtt::{self, ZeroRttMetrics, ZeroRttOutcome};

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

/// Writes `data` to the relay leg to `peer`; a failure is that peer's
/// (`op` says what was being sent).
async fn send(io: LegIo<'_>, peer: &str, op: &'static str, data: &[u8]) -> Result<(), ConnError> {
    io.write_all(data)
        .await
        .map_err(|source| ConnError::PeerIo {
            peer: peer.to_owned(),
            op,
            source,
        })
}

/// Opens a tuned connection to `peer`. `leg_buffer` is the relay legs'
/// buffer size ([`crate::config::Accel::relay_leg_buffer`]) for peers whose config sets none. With `fast_open`, connect
/// returns at once when a TFO cookie is cached and the first write leaves in
/// the SYN (a 0-RTT Hello is sure to follow).
pub async fn connect(
    peer: &Peer,
    timeouts: &Timeouts,
    leg_buffer: Option<usize>,
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
        leg_buffer,
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
/// later, with its Reply. With `zero_rtt` (plain legs only; where the
/// Hello's outcome is counted) a Hello replaces
/// the challenge, in the SYN with `fast_open`; a peer that refuses it is
/// dialed again with the challenge handshake, the same bytes resent.
#[expect(
    clippy::too_many_arguments,
    reason = "a relay leg's dial: the peer, its key, what to send and the session's switches"
)]
pub async fn dial(
    peer: &Peer,
    psk: &Psk,
    header: &Header,
    early_data: &[u8],
    timeouts: &Timeouts,
    leg_buffer: Option<usize>,
    zero_rtt: Option<&ZeroRttMetrics>,
    fast_open: bool,
    metrics: &Metrics,
) -> Result<PeerLeg, ConnError> {
    if let Some(hellos) = zero_rtt.filter(|_| peer.tls.is_none()) {
        match dial_hello(
            peer, psk, header, early_data, timeouts, leg_buffer, fast_open,
        )
        .await
        {
            Ok(leg) => {
                hellos.count(ZeroRttOutcome::Sent);
                metrics.peer_handshake(LegSide::Dial, hello_kind(&leg.stream));
                return Ok(leg);
            }
            Err(HelloDial::Refused(reason)) => {
                hellos.count(ZeroRttOutcome::Fallback);
                tracing::info!(peer = %peer.name, %reason, "peer refused our 0-RTT hello; redialing with the challenge handshake");
            }
            Err(HelloDial::Failed(e)) => return Err(e),
        }
    }
    let stream = connect(peer, timeouts, leg_buffer, false).await?;
    let tls = secure(&stream, peer, timeouts).await?;
    let io = LegIo::new(&stream, tls.as_ref());
    let (dialer, mut out) = answer_challenge(io, peer, psk, timeouts).await?;
    header.encode(&mut out);
    out.extend_from_slice(early_data);
    send(io, &peer.name, "send header", &out).await?;
    metrics.peer_handshake(LegSide::Dial, PeerHandshake::Challenge);
    Ok(PeerLeg {
        stream,
        peer: peer.name.clone(),
        dialer,
        buf: Vec::new(),
        tls,
    })
}

enum HelloDial {
    /// The peer answered with a Reject worth a retry with the challenge
    /// (`zero_rtt::refused`).
    Refused(RejectReason),
    Failed(ConnError),
}

impl From<ConnError> for HelloDial {
    fn from(e: ConnError) -> Self {
        HelloDial::Failed(e)
    }
}

/// The 0-RTT dial: the Hello (`zero_rtt::hello`) as the first write (of a
/// TFO socket with `fast_open`), then the peer's proof, then our Confirm
/// and any first bytes the Hello could not cover. Waiting for the proof
/// costs nothing in the SYN: the acceptor sends it at the SYN, so it comes
/// back with the SYN-ACK, before which no further byte could leave anyway.
/// Without TFO it holds back only client bytes beyond the first write,
/// which the Reply (a round trip later still) would not release sooner.
/// Until the proof is in, the client bytes we were given are still ours to
/// resend on a fallback.
async fn dial_hello(
    peer: &Peer,
    psk: &Psk,
    header: &Header,
    early_data: &[u8],
    timeouts: &Timeouts,
    leg_buffer: Option<usize>,
    fast_open: bool,
) -> Result<PeerLeg, HelloDial> {
    let stream = connect(peer, timeouts, leg_buffer, fast_open).await?;
    let mut dialer = Dialer::new(psk.clone(), nonce());
    let (out, covered) = zero_rtt::hello(&mut dialer, &peer.name, header, early_data)?;
    let io = LegIo::new(&stream, None);
    send(io, &peer.name, "send hello", &out).await?;
    let (proof, buf) = read_proof(io, &mut dialer, &peer.name, timeouts).await?;
    if let Err(e) = proof {
        return Err(match zero_rtt::refused(&e) {
            Some(reason) => HelloDial::Refused(reason),
            None => HelloDial::Failed(proof_error(&peer.name, e)),
        });
    }
    let confirm = zero_rtt::confirm(&mut dialer, &peer.name, early_data, covered)?;
    send(io, &peer.name, "send confirm", &confirm).await?;
    Ok(PeerLeg {
        stream,
        peer: peer.name.clone(),
        dialer,
        buf,
        tls: None,
    })
}

/// Reads the peer's ServerProof (or HelloProof) within the handshake timeout: the read's
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
    leg_buffer: Option<usize>,
) -> Result<Pooled, ConnError> {
    let stream = connect(peer, timeouts, leg_buffer, false).await?;
    let tls = secure(&stream, peer, timeouts).await?;
    let io = LegIo::new(&stream, tls.as_ref());
    let (mut dialer, response) = answer_challenge(io, peer, psk, timeouts).await?;
    send(io, &peer.name, "send response", &response).await?;
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
        let io = LegIo::new(&self.stream, self.tls.as_ref());
        send(io, peer, "send header on pooled connection", &out).await?;
        Ok(PeerLeg {
            stream: self.stream,
            peer: peer.to_owned(),
            dialer: self.dialer,
            buf: Vec::new(),
            tls: self.tls,
        })
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
