//! The downstream end of a relay leg: it accepts on a `peer` listener,
//! authenticates the upstream relay (challenge or 0-RTT Hello inside the
//! replay window) and reads the header. An accepted Hello's Confirm is
//! read later, by the room's [`Unconfirmed`].

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{AuthFailureReason, LegSide, Metrics, PeerHandshake, auth_reason};
use rustls::ServerConfig;
use splitway_proto::auth::{Acceptor, FRAME_HELLO, Psk};
use splitway_proto::header::{Header, ReplyStatus};
use splitway_proto::zero_rtt::{self, Hello, Refusal};
use tokio::net::TcpStream;

use crate::config::Timeouts;
use crate::error::ConnError;
use crate::leg_io::{FrameError, LegIo, read_frame};
use crate::tls::TlsLeg;

use super::{hello_kind, nonce, reply_bytes};
use crate::zero_rtt::{HelloWindow, Unconfirmed};

/// What the downstream end of a peer leg learned from the upstream relay.
pub struct Accepted {
    pub header: Header,
    /// Client bytes that arrived right behind the header (after a 0-RTT
    /// Hello: only those its MAC covers).
    pub early_data: Vec<u8>,
    /// After a 0-RTT Hello: the Confirm still owed, and what came after
    /// the covered bytes.
    pub unconfirmed: Option<Unconfirmed>,
    /// The leg's TLS session, on a `tls = true` peer listener.
    pub tls: Option<TlsLeg>,
}

/// A TLS listener's first stage: anything that does not complete TLS in
/// time (no TLS at all, a certificate not from our CA, silence) counts as
/// reason "tls".
async fn accept_tls(
    stream: &TcpStream,
    cfg: &Arc<ServerConfig>,
    within: std::time::Duration,
) -> Result<TlsLeg, (Option<AuthFailureReason>, ConnError)> {
    let tls_failed = |detail| (Some(AuthFailureReason::Tls), ConnError::ClientTls(detail));
    match tokio::time::timeout(within, TlsLeg::accept(stream, cfg)).await {
        Ok(Ok(leg)) => Ok(leg),
        Ok(Err(e)) => Err(tls_failed(e.to_string())),
        Err(_) => Err(tls_failed(format!(
            "handshake not finished within {within:?}"
        ))),
    }
}

/// Runs the acceptor side of the handshake within `deadline`. Failures are
/// counted by reason and answered with a Reject frame where one helps the
/// operator on the other end (wrong key), never with anything forwarded.
/// `hellos`: this relay takes 0-RTT Hellos (plain legs only).
#[expect(
    clippy::too_many_arguments,
    reason = "each is a distinct input of the accepting end's handshake; a struct would only rename them"
)]
pub async fn accept(
    stream: &TcpStream,
    tls: Option<&Arc<ServerConfig>>,
    keys: &[Psk],
    timeouts: &Timeouts,
    metrics: &Metrics,
    hellos: Option<&HelloWindow>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    on_authenticated: impl FnOnce(),
) -> Result<Accepted, ConnError> {
    let fail = |(reason, err): (Option<AuthFailureReason>, ConnError)| {
        if let Some(r) = reason {
            metrics.auth_failure(r);
        }
        err
    };
    let leg = match tls {
        Some(cfg) => Some(
            accept_tls(stream, cfg, timeouts.handshake)
                .await
                .map_err(fail)?,
        ),
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
        Authenticated::Hello {
            header,
            data,
            unconfirmed,
        } => {
            return Ok(Accepted {
                header,
                early_data: data,
                unconfirmed: Some(unconfirmed),
                tls: leg,
            });
        }
    };
    // Authenticated: an upstream pool may keep this connection idle for a
    // while before its header, so the header has its own, longer deadline.
    // A drain closes it at once: the upstream's pool finds it closed and
    // dials afresh or another candidate, instead of sending it a connection
    // this relay would carry through its drain.
    let header = tokio::select! {
        biased;
        r = read_header(io, buf, timeouts.pooled_header) => r,
        () = crate::shutdown::stopped(&mut stopping) => Err((None, ConnError::PooledUnused)),
    };
    // A pooled connection closed unused (upstream restart, retired by
    // age) has no reason: not an authentication failure.
    let (header, early_data) = header.map_err(fail)?;
    Ok(Accepted {
        header,
        early_data,
        unconfirmed: None,
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
    /// A fresh 0-RTT Hello: its Header, the client bytes its MAC covers,
    /// and the Confirm it owes (with the bytes after the covered ones).
    Hello {
        header: Header,
        data: Vec<u8>,
        unconfirmed: Unconfirmed,
    },
}

enum FirstFrame {
    Response(Vec<u8>),
    Hello(Box<Hello>),
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
        (FRAME_HELLO, Some(_)) => zero_rtt::on_hello(keys, b, nonce_s)
            .map(|o| o.map(|(h, n)| (FirstFrame::Hello(Box::new(h)), n))),
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
                let counted = match refusal {
                    // A replay holds no key of its own: count it as an attack.
                    Refusal::Replayed => Some(AuthFailureReason::Rejected),
                    // A real peer retries with the challenge: not a failure.
                    Refusal::Stale | Refusal::Full | Refusal::Unshared => None,
                };
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
            let hellos = window.accepted();
            metrics.peer_handshake(LegSide::Accept, hello_kind(stream.tcp));
            let confirm = hello.confirmation();
            let hello = *hello;
            Ok(Authenticated::Hello {
                header: hello.header,
                data: hello.data,
                unconfirmed: Unconfirmed::new(confirm, buf, hellos),
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
