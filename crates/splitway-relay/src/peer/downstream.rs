//! The downstream end of a relay leg: it accepts on a `peer` listener,
//! authenticates the upstream relay (challenge or 0-RTT Hello inside the
//! replay window) and reads the header.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ServerConfig;
use splitway_control::metrics::{
    AuthFailureReason, LegSide, Metrics, PeerHandshake, ZeroRttOutcome,
};
use splitway_proto::auth::{Acceptor, AuthError, FRAME_HELLO, Psk};
use splitway_proto::header::{Header, ReplyStatus};
use splitway_proto::zero_rtt::{self, Hello, Refusal, ReplayWindow};
use tokio::net::TcpStream;

use crate::config::Timeouts;
use crate::error::ConnError;
use crate::tls::{LegIo, TlsLeg};

use super::{FrameError, hello_kind, nonce, read_frame, reply_bytes, unix_ms};

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
    on_authenticated: impl FnOnce(),
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
        crate::bytes::take_ready_bytes(stream, &mut first_bytes)
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
    // Known as a relay from here on, also while pooled before its header.
    on_authenticated();
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
