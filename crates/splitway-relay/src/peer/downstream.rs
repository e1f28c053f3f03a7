//! The downstream end of a relay leg: it accepts on a `peer` listener,
//! authenticates the upstream relay (challenge or 0-RTT Hello inside the
//! replay window) and reads the header.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ServerConfig;
use splitway_control::metrics::{
    AuthFailureReason, LegSide, Metrics, PeerHandshake, ZeroRttOutcome,
};
use splitway_proto::auth::{Acceptor, AuthError, FRAME_HELLO, Psk};
use splitway_proto::header::{Header, ReplyStatus};
use splitway_proto::zero_rtt::{self, Confirmation, Hello, Refusal, ReplayWindow};
use splitway_sys::bpf::strikes::{self, Strike, StrikeRegister};
use tokio::net::TcpStream;

use crate::config::Timeouts;
use crate::error::ConnError;
use crate::leg_io::{FrameError, LegIo, read_frame};
use crate::tls::TlsLeg;

use super::{hello_kind, nonce, reply_bytes, unix_ms};

/// Where accepted Hello nonces are remembered beyond this process's own
/// window: what makes "accepted once" hold for the host, not the process.
pub enum HelloRegister {
    /// The pinned BPF map every relay process on the host opens.
    Shared(Arc<StrikeRegister>),
    /// No shared map (the reason), but no peer listener shares its port
    /// (`reuse_port`): this process alone receives Hellos sent to it.
    Local(String),
    /// No shared map (the reason) and a peer listener shares its port:
    /// Hellos are refused, and upstream relays use the challenge.
    Unavailable(String),
}

/// Nonces the host-wide map holds at most. Entries are allocated as they
/// come (no preallocation), about 100 bytes each in the kernel; a full map
/// refuses Hellos (`overloaded`) until its owners forget expired nonces.
/// Two processes at each one's own bound ([`HelloWindow::CAPACITY`]) fit.
const SHARED_CAPACITY: u32 = 1 << 19;

impl HelloRegister {
    /// Opens (or creates) the host-wide register. `shares_port`: some peer
    /// listener has `reuse_port`, so other processes may accept there.
    pub fn open(shares_port: bool) -> HelloRegister {
        let reason = match strikes::find_bpffs() {
            None => "no bpf filesystem is mounted (mount -t bpf bpf /sys/fs/bpf)".to_owned(),
            Some(dir) => match StrikeRegister::open_or_create(&dir, SHARED_CAPACITY) {
                Ok(r) => return HelloRegister::Shared(Arc::new(r)),
                Err(e) => e.to_string(),
            },
        };
        Self::without_map(shares_port, reason)
    }

    /// What [`HelloRegister::open`] would find, without pinning anything
    /// (`relay --check`): the bpf filesystem, and whether the kernel lets
    /// this process create the map.
    pub fn probe(shares_port: bool) -> Result<String, String> {
        let reason = match strikes::find_bpffs() {
            None => "no bpf filesystem is mounted (mount -t bpf bpf /sys/fs/bpf)".to_owned(),
            Some(dir) => match StrikeRegister::unpinned(1) {
                Ok(_) => {
                    return Ok(Self::shared_text(&dir.join(strikes::PIN_NAME)));
                }
                Err(e) => e.to_string(),
            },
        };
        Self::without_map(shares_port, reason).describe()
    }

    fn without_map(shares_port: bool, reason: String) -> HelloRegister {
        if shares_port {
            HelloRegister::Unavailable(reason)
        } else {
            HelloRegister::Local(reason)
        }
    }

    fn shared_text(path: &std::path::Path) -> String {
        format!(
            "replayed Hellos are refused host-wide (strike register {})",
            path.display()
        )
    }

    /// For `--check` and status: `Ok` what guards against replays, or `Err`
    /// why Hellos are refused.
    pub fn describe(&self) -> Result<String, String> {
        match self {
            HelloRegister::Shared(r) => Ok(Self::shared_text(r.path())),
            HelloRegister::Local(reason) => Ok(format!(
                "replayed Hellos are refused by this process's memory: it alone holds its peer ports (no reuse_port); no host-wide register: {reason}"
            )),
            HelloRegister::Unavailable(reason) => Err(format!(
                "a peer listener shares its port (reuse_port) and the host-wide strike register is unavailable: {reason}; Hellos are refused, upstream relays use the challenge"
            )),
        }
    }
}

/// The acceptor's memory of 0-RTT Hellos (`[accel] zero_rtt`), sharded by
/// nonce so concurrent accepts rarely meet on one lock, backed by the
/// host-wide register.
pub struct HelloWindow {
    shards: Box<[Mutex<ReplayWindow>]>,
    window_ms: u64,
    register: HelloRegister,
    /// When the shared map was last swept (Unix ms).
    swept_ms: AtomicU64,
}

impl HelloWindow {
    const SHARDS: usize = 16;
    /// Nonces remembered at most (about 48 bytes each): beyond that Hellos
    /// are refused as overloaded and dialers use the challenge handshake.
    const CAPACITY: usize = 1 << 18;

    /// A window starting now: Hellos stamped before this process started
    /// are refused (a restart without the shared register forgets).
    pub fn new(window: Duration, register: HelloRegister) -> HelloWindow {
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
        HelloWindow {
            shards,
            window_ms,
            register,
            swept_ms: AtomicU64::new(0),
        }
    }

    /// See [`HelloRegister::describe`].
    pub fn describe(&self) -> Result<String, String> {
        self.register.describe()
    }

    fn admit(&self, hello: &Hello) -> Result<(), Refusal> {
        if let HelloRegister::Unavailable(_) = self.register {
            return Err(Refusal::Unshared);
        }
        let now = unix_ms();
        let shard = &self.shards[usize::from(hello.nonce_c[0]) % Self::SHARDS];
        let (local, forgotten) = {
            // A panic while holding the lock leaves the window consistent
            // (admit's updates are single inserts), so poisoning is ignored.
            let mut w = shard.lock().unwrap_or_else(|p| p.into_inner());
            let local = w.admit(now, hello.timestamp_ms, &hello.nonce_c);
            (local, w.take_forgotten())
        };
        let HelloRegister::Shared(map) = &self.register else {
            return local;
        };
        // Held here 2·window at least: no copy of those Hellos is fresh.
        for nonce in &forgotten {
            if let Err(e) = map.forget(nonce) {
                tracing::warn!(error = %e, "cannot forget an expired 0-RTT nonce (a sweep will)");
            }
        }
        local?;
        // The entry may go once a copy of the Hello could no longer pass
        // the time check: it is fresh until timestamp + window, at most
        // now + 2·window.
        let expires = now + 2 * self.window_ms;
        match map.strike(&hello.nonce_c, expires) {
            Ok(Strike::Fresh) => Ok(()),
            Ok(Strike::Replayed) => Err(Refusal::Replayed),
            Ok(Strike::Full) => {
                // Full, perhaps of what a crashed process left behind: swept
                // at most once a window. The walk takes about 2 µs a nonce,
                // so it runs off the runtime's workers; this Hello is
                // refused meanwhile (its dialer uses the challenge).
                let last = self.swept_ms.load(Ordering::Relaxed);
                if now >= last + self.window_ms
                    && self
                        .swept_ms
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    let map = Arc::clone(map);
                    let sweep = move || match map.sweep(now) {
                        Ok(n) => tracing::info!(dropped = n, "swept the 0-RTT strike register"),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot sweep the 0-RTT strike register")
                        }
                    };
                    match tokio::runtime::Handle::try_current() {
                        Ok(rt) => drop(rt.spawn_blocking(sweep)),
                        Err(_) => sweep(),
                    }
                }
                Err(Refusal::Full)
            }
            Err(e) => {
                // Not knowing is refusing: the dialer falls back to the
                // challenge, which needs no memory.
                tracing::warn!(error = %e, "0-RTT strike register failed; Hello refused");
                Err(Refusal::Unshared)
            }
        }
    }
}

/// An accepted Hello whose dialer has not yet sent its Confirm: nothing
/// beyond the bytes the Hello's MAC covers may be forwarded before it, in
/// either direction (a replayed Hello never gets one).
pub struct Unconfirmed {
    check: Confirmation,
    /// What followed the covered bytes: the Confirm, then client bytes.
    buf: Vec<u8>,
}

impl Unconfirmed {
    /// Reads the Confirm within `deadline`; returns the client bytes that
    /// came after it. Counted as `unconfirmed` when it fails.
    pub async fn confirm(
        self,
        stream: &TcpStream,
        deadline: Duration,
        metrics: &Metrics,
    ) -> Result<Vec<u8>, ConnError> {
        let Unconfirmed { check, mut buf } = self;
        let read = tokio::time::timeout(
            deadline,
            read_frame(stream, &mut buf, |b| {
                check.on_confirm(b).map(|o| o.map(|n| ((), n)))
            }),
        )
        .await;
        let (reason, err) = match read {
            Ok(Ok(())) => return Ok(buf),
            Err(_) => (
                AuthFailureReason::Timeout,
                ConnError::ClientTimeout(deadline),
            ),
            Ok(Err(FrameError::Bad(e))) => (auth_reason(&e), ConnError::PeerAuth(e)),
            Ok(Err(FrameError::Closed)) => (
                AuthFailureReason::Closed,
                ConnError::ClientProtocol("closed before its 0-RTT confirm".into()),
            ),
            Ok(Err(FrameError::Io(source))) => (
                AuthFailureReason::Closed,
                ConnError::ClientIo {
                    op: "read confirm",
                    source,
                },
            ),
        };
        metrics.zero_rtt(ZeroRttOutcome::Unconfirmed);
        metrics.auth_failure(reason);
        Err(err)
    }
}

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
            confirm,
            rest,
        } => {
            return Ok(Accepted {
                header,
                early_data: data,
                unconfirmed: Some(Unconfirmed {
                    check: confirm,
                    buf: rest,
                }),
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
    /// the Confirm it owes and the bytes after the covered ones.
    Hello {
        header: Header,
        data: Vec<u8>,
        confirm: Confirmation,
        rest: Vec<u8>,
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
                let (outcome, counted) = match refusal {
                    // A replay holds no key of its own: count it as an attack.
                    Refusal::Replayed => {
                        (ZeroRttOutcome::Replay, Some(AuthFailureReason::Rejected))
                    }
                    // A real peer retries with the challenge: not a failure.
                    Refusal::Stale => (ZeroRttOutcome::Stale, None),
                    Refusal::Full => (ZeroRttOutcome::Full, None),
                    Refusal::Unshared => (ZeroRttOutcome::Unshared, None),
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
            let confirm = hello.confirmation();
            let hello = *hello;
            Ok(Authenticated::Hello {
                header: hello.header,
                data: hello.data,
                confirm,
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

#[cfg(test)]
mod tests {
    use splitway_proto::Destination;
    use splitway_proto::auth::{Dialer, RejectReason};

    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    fn key() -> Psk {
        Psk::from_bytes(&[9; 32]).expect("key")
    }

    /// A verified Hello with nonce `nonce`, stamped now.
    fn hello(nonce: u8) -> Hello {
        let mut header = Vec::new();
        Header::new(
            1,
            Destination::Ip("10.0.3.2:80".parse().expect("literal")),
            "10.0.1.1:40000".parse().expect("literal"),
        )
        .encode(&mut header);
        let (bytes, _) = Dialer::new(key(), [nonce; 32])
            .hello(unix_ms(), &header, b"")
            .expect("hello");
        zero_rtt::on_hello(&[key()], &bytes, [1; 32])
            .expect("valid")
            .expect("complete")
            .0
    }

    #[test]
    fn a_shared_port_without_a_register_refuses_every_hello() {
        let w = HelloWindow::new(WINDOW, HelloRegister::Unavailable("no bpffs".into()));
        assert_eq!(w.admit(&hello(1)), Err(Refusal::Unshared));
        assert_eq!(
            Refusal::Unshared.reject_reason(),
            RejectReason::Overloaded,
            "a reason the dialer answers with the challenge"
        );
        assert!(w.describe().unwrap_err().contains("reuse_port"));
        let alone = HelloWindow::new(WINDOW, HelloRegister::Local("no bpffs".into()));
        assert_eq!(alone.admit(&hello(1)), Ok(()));
        assert_eq!(alone.admit(&hello(1)), Err(Refusal::Replayed));
    }

    /// Two windows on one map, as two processes on one port hold it: a
    /// nonce the first accepted is a replay at the second.
    #[test]
    fn siblings_on_one_register_accept_a_nonce_once() {
        let map = match StrikeRegister::unpinned(1 << 10) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let sibling = map.try_clone().expect("dup");
        let a = HelloWindow::new(WINDOW, HelloRegister::Shared(Arc::new(map)));
        let b = HelloWindow::new(WINDOW, HelloRegister::Shared(Arc::new(sibling)));
        assert_eq!(a.admit(&hello(2)), Ok(()));
        assert_eq!(b.admit(&hello(2)), Err(Refusal::Replayed));
        assert_eq!(b.admit(&hello(3)), Ok(()));
        assert_eq!(a.admit(&hello(3)), Err(Refusal::Replayed));
        assert!(a.describe().is_ok());
    }

    /// A full map refuses (the dialer falls back), and is swept of expired
    /// entries so that the next Hello is taken again.
    #[test]
    fn a_full_register_refuses_then_is_swept() {
        let map = match StrikeRegister::unpinned(2) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        // Two entries a crashed process left behind, long expired.
        for n in [[7u8; 32], [8; 32]] {
            assert_eq!(map.strike(&n, 1).expect("strike"), Strike::Fresh);
        }
        let w = HelloWindow::new(WINDOW, HelloRegister::Shared(map));
        assert_eq!(w.admit(&hello(4)), Err(Refusal::Full));
        // No runtime here: the sweep ran inline.
        assert_eq!(w.admit(&hello(5)), Ok(()));
    }
}
