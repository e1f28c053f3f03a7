//! The acceptor's replay window of 0-RTT Hellos: each nonce is taken once
//! per host, within the window, and refused otherwise (the dialer then uses
//! the challenge). A process's own memory is backed by a pinned BPF map
//! that every relay process on the host opens.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use splitway_proto::zero_rtt::{Hello, Refusal, ReplayWindow};
use splitway_sys::bpf::strikes::{self, Strike, StrikeRegister};

use super::metrics::{ZeroRttMetrics, ZeroRttOutcome};

/// Now as a Hello stamps it: milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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
    /// Where its refusals and acceptances are counted.
    metrics: ZeroRttMetrics,
}

impl HelloWindow {
    const SHARDS: usize = 16;
    /// Nonces remembered at most (about 48 bytes each): beyond that Hellos
    /// are refused as overloaded and dialers use the challenge handshake.
    const CAPACITY: usize = 1 << 18;

    /// A window starting now: Hellos stamped before this process started
    /// are refused (a restart without the shared register forgets).
    pub fn new(window: Duration, register: HelloRegister, metrics: ZeroRttMetrics) -> HelloWindow {
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
            metrics,
        }
    }

    /// See [`HelloRegister::describe`].
    pub fn describe(&self) -> Result<String, String> {
        self.register.describe()
    }

    /// Takes a verified Hello's nonce, or refuses it (counted by reason).
    pub fn admit(&self, hello: &Hello) -> Result<(), Refusal> {
        let admitted = self.strike(hello);
        if let Err(refusal) = admitted {
            self.metrics.count(match refusal {
                Refusal::Replayed => ZeroRttOutcome::Replay,
                Refusal::Stale => ZeroRttOutcome::Stale,
                Refusal::Full => ZeroRttOutcome::Full,
                Refusal::Unshared => ZeroRttOutcome::Unshared,
            });
        }
        admitted
    }

    /// Counts a Hello admitted and answered with its proof; its Confirm's
    /// absence is counted through the handle returned.
    pub fn accepted(&self) -> ZeroRttMetrics {
        self.metrics.count(ZeroRttOutcome::Accepted);
        self.metrics.clone()
    }

    fn strike(&self, hello: &Hello) -> Result<(), Refusal> {
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

#[cfg(test)]
mod tests {
    use splitway_proto::Destination;
    use splitway_proto::auth::{Dialer, Psk, RejectReason};
    use splitway_proto::header::Header;
    use splitway_proto::zero_rtt;

    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    fn window(register: HelloRegister) -> HelloWindow {
        HelloWindow::new(WINDOW, register, ZeroRttMetrics::default())
    }

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
        let w = window(HelloRegister::Unavailable("no bpffs".into()));
        assert_eq!(w.admit(&hello(1)), Err(Refusal::Unshared));
        assert_eq!(
            Refusal::Unshared.reject_reason(),
            RejectReason::Overloaded,
            "a reason the dialer answers with the challenge"
        );
        assert!(w.describe().unwrap_err().contains("reuse_port"));
        let alone = window(HelloRegister::Local("no bpffs".into()));
        assert_eq!(alone.admit(&hello(1)), Ok(()));
        assert_eq!(alone.admit(&hello(1)), Err(Refusal::Replayed));
    }

    /// Each refusal is counted by its reason, an acceptance once answered.
    #[test]
    fn outcomes_are_counted_by_the_window() {
        let metrics = ZeroRttMetrics::default();
        let w = HelloWindow::new(
            WINDOW,
            HelloRegister::Local("no bpffs".into()),
            metrics.clone(),
        );
        assert_eq!(w.admit(&hello(6)), Ok(()));
        let _ = w.accepted();
        assert_eq!(w.admit(&hello(6)), Err(Refusal::Replayed));
        assert_eq!(metrics.get(ZeroRttOutcome::Accepted), 1);
        assert_eq!(metrics.get(ZeroRttOutcome::Replay), 1);
        assert_eq!(metrics.get(ZeroRttOutcome::Unshared), 0);
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
        let a = window(HelloRegister::Shared(Arc::new(map)));
        let b = window(HelloRegister::Shared(Arc::new(sibling)));
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
        let w = window(HelloRegister::Shared(map));
        assert_eq!(w.admit(&hello(4)), Err(Refusal::Full));
        // No runtime here: the sweep ran inline.
        assert_eq!(w.admit(&hello(5)), Ok(()));
    }
}
