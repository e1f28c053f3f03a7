//! Relay↔relay legs: the authenticated handshake on both ends.
//!
//! Dialer (upstream): connect, wait for the Challenge, send Response+Header
//! in one write, then (concurrently with forwarding client data) read the
//! ServerProof and the Reply. Acceptor (downstream): send the Challenge at
//! accept, verify the Response, send the ServerProof, read the Header.
//! `docs/protocol.md` has the frames byte by byte.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rand::RngCore;
use splitway_control::metrics::{AuthFailureReason, Metrics};
use splitway_proto::auth::{Acceptor, AuthError, Dialer, NONCE_LEN, Psk};
use splitway_proto::header::{Header, Reply, ReplyStatus};
use tokio::net::{TcpSocket, TcpStream};

use crate::config::{Peer, Timeouts};
use crate::error::ConnError;
use crate::forward::write_all;
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
pub async fn read_frame<T, E>(
    s: &TcpStream,
    buf: &mut Vec<u8>,
    mut decode: impl FnMut(&[u8]) -> Result<Option<(T, usize)>, E>,
) -> Result<T, FrameError<E>> {
    loop {
        if !buf.is_empty()
            && let Some((v, n)) = decode(buf).map_err(FrameError::Bad)?
        {
            buf.drain(..n);
            return Ok(v);
        }
        s.readable().await.map_err(FrameError::Io)?;
        let mut chunk = [0u8; 2048];
        match s.try_read(&mut chunk) {
            Ok(0) => return Err(FrameError::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
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
}

/// Opens a tuned connection to `peer`.
pub async fn connect(peer: &Peer, timeouts: &Timeouts) -> Result<TcpStream, ConnError> {
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
    tuning::apply(&sock, &peer.tuning, Some(PEER_KEEPALIVE_DEFAULT))
        .map_err(|e| ConnError::Internal(format!("tuning leg to peer {}: {e}", peer.name)))?;
    match tokio::time::timeout(timeouts.connect, sock.connect(peer.addr)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(io_err("connect", e)),
        Err(_) => Err(ConnError::PeerTimeout {
            peer: peer.name.clone(),
            during: "connecting",
        }),
    }
}

/// Connects to `peer`, authenticates and sends `header`.
pub async fn dial(
    peer: &Peer,
    psk: &Psk,
    header: &Header,
    timeouts: &Timeouts,
) -> Result<PeerLeg, ConnError> {
    let stream = connect(peer, timeouts).await?;
    let mut dialer = Dialer::new(psk.clone(), nonce());
    let mut buf = Vec::new();
    let response = tokio::time::timeout(
        timeouts.handshake,
        read_frame(&stream, &mut buf, |b| dialer.on_challenge(b)),
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
    let mut out = response;
    header.encode(&mut out);
    write_all(&stream, &out)
        .await
        .map_err(|source| ConnError::PeerIo {
            peer: peer.name.clone(),
            op: "send header",
            source,
        })?;
    Ok(PeerLeg {
        stream,
        peer: peer.name.clone(),
        dialer,
        buf,
    })
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
        stream: &TcpStream,
        peer: &str,
        mut dialer: Dialer,
        mut buf: Vec<u8>,
    ) -> Result<(ReplyStatus, Vec<u8>), ConnError> {
        read_frame(stream, &mut buf, |b| {
            dialer.on_server_proof(b).map(|o| o.map(|n| ((), n)))
        })
        .await
        .map_err(|e| match e {
            FrameError::Bad(AuthError::Rejected(r)) => ConnError::PeerProtocol {
                peer: peer.to_owned(),
                detail: format!("refused our authentication: {r}"),
            },
            e => peer_frame_error(peer, "proof", e),
        })?;
        let reply = read_frame(stream, &mut buf, Reply::decode)
            .await
            .map_err(|e| peer_frame_error(peer, "reply", e))?;
        Ok((reply.status, buf))
    }

    /// Splits the leg into what forwarding needs.
    pub fn into_parts(self) -> (TcpStream, String, Dialer, Vec<u8>) {
        (self.stream, self.peer, self.dialer, self.buf)
    }
}

/// What the downstream end of a peer leg learned from the upstream relay.
pub struct Accepted {
    pub header: Header,
    /// Client bytes that arrived right behind the header.
    pub early_data: Vec<u8>,
}

/// Runs the acceptor side of the handshake within `deadline`. Failures are
/// counted by reason and answered with a Reject frame where one helps the
/// operator on the other end (wrong key), never with anything forwarded.
pub async fn accept(
    stream: &TcpStream,
    keys: &[Psk],
    deadline: Duration,
    metrics: &Metrics,
) -> Result<Accepted, ConnError> {
    let result = tokio::time::timeout(deadline, accept_inner(stream, keys)).await;
    let (reason, err) = match result {
        Ok(Ok(a)) => return Ok(a),
        Ok(Err(e)) => e,
        Err(_) => (
            AuthFailureReason::Timeout,
            ConnError::ClientTimeout(deadline),
        ),
    };
    metrics.auth_failure(reason);
    Err(err)
}

async fn accept_inner(
    stream: &TcpStream,
    keys: &[Psk],
) -> Result<Accepted, (AuthFailureReason, ConnError)> {
    let mut acceptor = Acceptor::new(keys.to_vec(), nonce());
    let client_io = |op| {
        move |source| {
            (
                AuthFailureReason::Closed,
                ConnError::ClientIo { op, source },
            )
        }
    };
    write_all(stream, &acceptor.challenge())
        .await
        .map_err(client_io("send challenge"))?;
    let mut buf = Vec::new();
    let proof = match read_frame(stream, &mut buf, |b| acceptor.on_response(b)).await {
        Ok(p) => p,
        Err(FrameError::Bad(e)) => {
            if let Some(r) = e.reject_reason() {
                // Best effort: the connection is refused either way.
                let _ = write_all(stream, &Acceptor::reject(r)).await;
            }
            return Err((auth_reason(&e), ConnError::PeerAuth(e)));
        }
        Err(FrameError::Closed) => {
            return Err((
                AuthFailureReason::Closed,
                ConnError::ClientProtocol("closed during authentication".into()),
            ));
        }
        Err(FrameError::Io(e)) => return Err(client_io("read response")(e)),
    };
    write_all(stream, &proof)
        .await
        .map_err(client_io("send proof"))?;
    let header = match read_frame(stream, &mut buf, Header::decode).await {
        Ok(h) => h,
        Err(FrameError::Bad(e)) => {
            let _ = write_all(stream, &reply_bytes(ReplyStatus::BadHeader)).await;
            return Err((
                AuthFailureReason::Malformed,
                ConnError::ClientProtocol(format!("bad header: {e}")),
            ));
        }
        Err(FrameError::Closed) => {
            return Err((
                AuthFailureReason::Closed,
                ConnError::ClientProtocol("closed before its header".into()),
            ));
        }
        Err(FrameError::Io(e)) => return Err(client_io("read header")(e)),
    };
    Ok(Accepted {
        header,
        early_data: buf,
    })
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
