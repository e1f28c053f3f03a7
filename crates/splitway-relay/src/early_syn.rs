//! Early SYN (the KTCP paper's first improvement): the next leg starts when
//! the client's SYN arrives, not after accept().
//!
//! A tc BPF program (splitway-sys `SynWatch`) reports each SYN's 4-tuple;
//! the relay starts the next leg at once and parks the result in a sharded
//! table keyed by (client, original destination), where the accepted
//! connection picks it up. SYN retransmits find their entry and start
//! nothing; entries whose handshake never completes expire and close what
//! they opened. Early starts have a budget: beyond it (a SYN flood), legs
//! start at accept as without early SYN, so a flood can neither open
//! unbounded next legs nor drain the pool.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
use splitway_api as api;
use splitway_control::metrics::{DenyReason, EarlySynOutcome, Metrics};
use splitway_proto::Destination;
use splitway_proto::header::DEFAULT_TTL;
use tokio::sync::oneshot;

use crate::config::{Config, ListenMode, Listener};
use crate::error::ConnError;
use crate::limits::Refused;
use crate::relay::Shared;
use crate::route::allowed;
use crate::session::{LegRequest, Next, connect_next};

const SHARDS: usize = 16;

type Key = (SocketAddr, SocketAddr);
pub type Started = oneshot::Receiver<Result<Next, ConnError>>;

enum Slot {
    /// The leg started at the SYN, waiting for the accepted connection.
    Started(Started),
    /// The connection was accepted before its SYN event was read: the event,
    /// read late, must not start a leg. Swept after [`MARKER_LIFETIME`].
    Accepted,
}

struct Entry {
    slot: Slot,
    born: Instant,
}

#[derive(Debug, Default)]
pub struct EarlyStats {
    /// SYN events that started a leg.
    pub started: AtomicU64,
    /// Accepted connections that found their early-started leg.
    pub hits: AtomicU64,
    /// Accepted connections that found none (started at accept).
    pub misses: AtomicU64,
    /// Retransmitted SYNs whose leg was already started.
    pub duplicates: AtomicU64,
    /// Early starts refused by the budget.
    pub over_budget: AtomicU64,
    /// SYNs of clients that accept would refuse: nothing started.
    pub denied: AtomicU64,
    /// Entries whose client never completed its handshake.
    pub expired: AtomicU64,
}

pub struct EarlyStarts {
    shards: Vec<Mutex<HashMap<Key, Entry>>>,
    hasher: RandomState,
    in_table: AtomicUsize,
    budget: usize,
    expiry: Duration,
    pub stats: EarlyStats,
    metrics: Arc<Metrics>,
    /// The SYN detector feeding this table stopped: nothing new arrives.
    dead: AtomicBool,
    /// `Accepted` markers in the table. They would grow with the miss rate
    /// × their lifetime, so they get a budget of their own
    /// ([`MARKERS_PER_LEG`] × the legs' budget): beyond it a miss leaves
    /// none, and a late SYN event may start a leg that the legs' budget
    /// bounds and the expiry closes.
    markers: AtomicUsize,
}

/// How long a miss's marker waits for its late SYN event. Events trail the
/// accept by micro- to milliseconds (the ring buffer's reader is behind);
/// a marker kept for the legs' expiry (10 s) only held budget: at 6,700
/// connections/s through one relay the markers' budget was full within
/// 0.2 s, and every later miss started a leg nobody took (232 of 2,000 in
/// `ab -c 4` through the TPROXY bench rig).
const MARKER_LIFETIME: Duration = Duration::from_secs(1);

/// Markers are small (a key and a time); they may outnumber legs.
const MARKERS_PER_LEG: usize = 4;

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl EarlyStarts {
    pub fn new(budget: usize, expiry: Duration, metrics: Arc<Metrics>) -> Self {
        EarlyStarts {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            in_table: AtomicUsize::new(0),
            budget,
            expiry,
            stats: EarlyStats::default(),
            metrics,
            dead: AtomicBool::new(false),
            markers: AtomicUsize::new(0),
        }
    }

    fn count(&self, stat: &AtomicU64, outcome: EarlySynOutcome, n: u64) {
        stat.fetch_add(n, Relaxed);
        for _ in 0..n {
            self.metrics.early_syn(outcome);
        }
    }

    fn shard(&self, key: &Key) -> &Mutex<HashMap<Key, Entry>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// A client's SYN was seen: start its next leg unless already started,
    /// over budget, or for a client that accept would refuse. `ttl` is the
    /// SYN's IP TTL (the loop guard's hop count).
    pub fn on_syn(&self, shared: &Arc<Shared>, client: SocketAddr, dst: SocketAddr, ttl: u8) {
        if !shared.live.early_syn_enabled() {
            return;
        }
        if admissible(shared, client).is_err() {
            self.count(&self.stats.denied, EarlySynOutcome::Denied, 1);
            return;
        }
        self.start(shared, client, dst, ttl);
    }

    /// A SYN to a syn-option listener (`to`) that carries our option
    /// (`options`: its raw TCP options). The listener's `allow_clients` and
    /// `[limits]` are checked before anything else, the option is decoded
    /// exactly as accept will decode the saved SYN, and the leg starts for
    /// the destination it names; the accepted socket pairs with it by
    /// (client, destination). A refused client or an unusable option starts
    /// nothing (`denied`); accept then refuses the connection itself.
    pub fn on_option_syn(
        &self,
        shared: &Arc<Shared>,
        client: SocketAddr,
        to: SocketAddr,
        options: &[u8],
        ttl: u8,
    ) {
        if !shared.live.early_syn_enabled() {
            return;
        }
        let Some(listener) = syn_option_listener(shared, to) else {
            // Not ours (another listener moved away on reload): nothing.
            self.count(&self.stats.denied, EarlySynOutcome::Denied, 1);
            return;
        };
        if admissible_at(shared, client, &listener.allow_clients, true).is_err() {
            self.count(&self.stats.denied, EarlySynOutcome::Denied, 1);
            return;
        }
        match crate::syn_dst::from_options(options, &listener.syn_option_prefixes) {
            Ok(dst) => self.start(shared, client, dst, ttl),
            Err(e) => {
                tracing::debug!(%client, listener = %to, error = %e, "early SYN: no usable destination option");
                self.count(&self.stats.denied, EarlySynOutcome::Denied, 1);
            }
        }
    }

    fn start(&self, shared: &Arc<Shared>, client: SocketAddr, dst: SocketAddr, ttl: u8) {
        let key = (canonical(client), canonical(dst));
        let mut shard = self.shard(&key).lock().expect("early table lock");
        if shard.contains_key(&key) {
            // A retransmitted SYN, or one whose accept won the race: the
            // leg exists or is no longer needed.
            self.count(&self.stats.duplicates, EarlySynOutcome::Duplicate, 1);
            return;
        }
        if self.in_table.load(Relaxed) >= self.budget {
            self.count(&self.stats.over_budget, EarlySynOutcome::OverBudget, 1);
            return;
        }
        self.in_table.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        shard.insert(
            key,
            Entry {
                slot: Slot::Started(rx),
                born: Instant::now(),
            },
        );
        drop(shard);
        self.count(&self.stats.started, EarlySynOutcome::Started, 1);
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut req = LegRequest {
                dst: Destination::Ip(key.1),
                // The thread's CSPRNG, like accepted connections' ids: no
                // getrandom syscall per SYN.
                conn_id: rand::thread_rng().next_u64(),
                next_ttl: DEFAULT_TTL,
                arrived_hops: Some(ttl),
                origin: key.0,
                client: key.0.ip(),
                early_data: Vec::new(),
                speculative: true,
                // Early SYN serves transparent and syn-option clients only.
                optimistic: true,
            };
            let r = connect_next(&shared, &mut req).await;
            // Nobody waiting (expired): dropping the leg closes it.
            let _ = tx.send(r);
        });
    }

    /// Strict mode: a leg already connected through to the server, for the
    /// accept that follows the SYN strict mode is about to release. Strict
    /// mode bounds these with its own budget (its pending SYNs).
    pub fn park(&self, client: SocketAddr, dst: SocketAddr, next: Next) {
        let key = (canonical(client), canonical(dst));
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Ok(next));
        let mut shard = self.shard(&key).lock().expect("early table lock");
        let previous = shard.insert(
            key,
            Entry {
                slot: Slot::Started(rx),
                born: Instant::now(),
            },
        );
        if !matches!(
            previous,
            Some(Entry {
                slot: Slot::Started(_),
                ..
            })
        ) {
            self.in_table.fetch_add(1, Relaxed);
        }
    }

    /// The accepted connection's early-started leg, if any.
    pub fn take(&self, client: SocketAddr, dst: SocketAddr) -> Option<Started> {
        // No detector, no early legs: accepts are not misses of it either.
        if self.dead.load(Relaxed) {
            return None;
        }
        let key = (canonical(client), canonical(dst));
        let mut shard = self.shard(&key).lock().expect("early table lock");
        let previous = shard.remove(&key);
        // A miss: the SYN event is still queued behind this accept (its
        // reader is late) and must not start a leg when it is read, so a
        // marker stays for a while (within its budget). A hit needs none:
        // its event was read already.
        match &previous {
            Some(Entry {
                slot: Slot::Accepted,
                ..
            }) => {
                // A second accept of one 4-tuple within the marker's life
                // (port reuse): keep the marker, fresh.
                shard.insert(
                    key,
                    Entry {
                        slot: Slot::Accepted,
                        born: Instant::now(),
                    },
                );
            }
            None if self.markers.load(Relaxed) < self.budget * MARKERS_PER_LEG => {
                shard.insert(
                    key,
                    Entry {
                        slot: Slot::Accepted,
                        born: Instant::now(),
                    },
                );
                self.markers.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        drop(shard);
        match previous {
            Some(Entry {
                slot: Slot::Started(started),
                ..
            }) => {
                self.in_table.fetch_sub(1, Relaxed);
                self.count(&self.stats.hits, EarlySynOutcome::Hit, 1);
                Some(started)
            }
            _ => {
                self.count(&self.stats.misses, EarlySynOutcome::Miss, 1);
                None
            }
        }
    }

    /// Drops entries whose client never got accepted; their legs close.
    pub fn sweep(&self) {
        for shard in &self.shards {
            let mut map = shard.lock().expect("early table lock");
            let mut gone = 0;
            let mut markers = 0;
            map.retain(|_, e| {
                let lifetime = match e.slot {
                    Slot::Started(_) => self.expiry,
                    Slot::Accepted => self.expiry.min(MARKER_LIFETIME),
                };
                let keep = e.born.elapsed() < lifetime;
                if !keep {
                    match e.slot {
                        Slot::Started(_) => gone += 1,
                        Slot::Accepted => markers += 1,
                    }
                }
                keep
            });
            self.markers.fetch_sub(markers, Relaxed);
            if gone > 0 {
                self.in_table.fetch_sub(gone, Relaxed);
                self.count(&self.stats.expired, EarlySynOutcome::Expired, gone as u64);
            }
        }
    }

    pub fn pending(&self) -> usize {
        self.in_table.load(Relaxed)
    }

    /// The detector stopped for good: status says so instead of counting on.
    pub fn detector_died(&self) {
        self.dead.store(true, Relaxed);
    }

    pub fn status(&self) -> api::EarlySyn {
        if self.dead.load(Relaxed) {
            return api::EarlySyn::Dead(api::EarlySynDead {
                detector: "dead".to_owned(),
            });
        }
        api::EarlySyn::Running(api::EarlySynStats {
            pending: self.pending() as u64,
            budget: self.budget as u64,
            markers: self.markers.load(Relaxed) as u64,
            started: self.stats.started.load(Relaxed),
            hits: self.stats.hits.load(Relaxed),
            misses: self.stats.misses.load(Relaxed),
            duplicates: self.stats.duplicates.load(Relaxed),
            over_budget: self.stats.over_budget.load(Relaxed),
            denied: self.stats.denied.load(Relaxed),
            expired: self.stats.expired.load(Relaxed),
        })
    }
}

/// Whether accept would admit `client` on an intercepting listener: its
/// `allow_clients` and the connection limits. Checked before any leg is
/// started for a SYN (early SYN, strict mode), so a refused client's SYN
/// dials nothing and holds no budget.
pub fn admissible(shared: &Shared, client: SocketAddr) -> Result<(), DenyReason> {
    let ip = client.ip().to_canonical();
    let allowed_somewhere = shared
        .cfg
        .listeners
        .iter()
        .filter(|l| l.mode == ListenMode::Tproxy && l.intercept.is_some())
        .any(|l| allowed(&l.allow_clients, ip, false));
    if !allowed_somewhere {
        return Err(DenyReason::Client);
    }
    within_limits(shared, ip)
}

/// [`admissible`] for one listener's `allow_clients` (`explicit`: empty
/// means loopback only, as at accept).
fn admissible_at(
    shared: &Shared,
    client: SocketAddr,
    allow_clients: &[ipnet::IpNet],
    explicit: bool,
) -> Result<(), DenyReason> {
    let ip = client.ip().to_canonical();
    if !allowed(allow_clients, ip, explicit) {
        return Err(DenyReason::Client);
    }
    within_limits(shared, ip)
}

/// Whether `[limits]` and the descriptor cap would admit one more
/// connection from `ip` now.
fn within_limits(shared: &Shared, ip: std::net::IpAddr) -> Result<(), DenyReason> {
    shared
        .limiter
        .would_admit(Some(ip))
        .map_err(Refused::reason)
}

/// The syn-option listener a SYN to `to` reaches: same port, and the same
/// address unless the listener's is unspecified.
fn syn_option_listener(shared: &Shared, to: SocketAddr) -> Option<&Listener> {
    let to = canonical(to);
    shared.cfg.listeners.iter().find(|l| {
        l.mode == ListenMode::SynOption
            && l.addr.port() == to.port()
            && (l.addr.ip().is_unspecified() || l.addr.ip().to_canonical() == to.ip())
    })
}

/// Interfaces the SYN detector attaches to: tproxy listeners' `intercept`
/// interfaces and syn-option listeners' `watch`, each once.
pub fn watched_interfaces(cfg: &Config) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let names = cfg.listeners.iter().flat_map(|l| {
        let intercept = l.intercept.iter().flat_map(|i| i.interfaces.iter());
        let watch = l
            .watch
            .iter()
            .filter(move |_| l.mode == ListenMode::SynOption);
        intercept.chain(watch)
    });
    for name in names {
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

/// The detector's ports: every SYN to the intercepted ones, and only SYNs
/// carrying our option to watched syn-option listeners' ones.
pub fn watched_ports(cfg: &Config) -> (Vec<u16>, Vec<u16>) {
    let plain = cfg
        .listeners
        .iter()
        .filter_map(|l| l.intercept.as_ref())
        .flat_map(|i| i.ports.iter().copied())
        .collect();
    let option = cfg
        .listeners
        .iter()
        .filter(|l| l.mode == ListenMode::SynOption && !l.watch.is_empty())
        .map(|l| l.addr.port())
        .collect();
    (plain, option)
}

/// Whether any syn-option listener has its SYNs watched (else its accepts
/// have no early legs to look for, and are not misses).
pub fn watches_syn_option(shared: &Shared) -> bool {
    shared
        .cfg
        .listeners
        .iter()
        .any(|l| l.mode == ListenMode::SynOption && !l.watch.is_empty())
}

/// Whether a plain (option-less) SYN event is for a syn-option listener:
/// reported only because an intercepted port range covers it; it must
/// start nothing.
pub fn is_for_syn_option_listener(shared: &Shared, to: SocketAddr) -> bool {
    syn_option_listener(shared, to).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 1, 1], port))
    }

    /// Misses leave markers only within their budget, and the sweep takes
    /// them away: the table cannot grow with connection rate × lifetime.
    #[test]
    fn accept_markers_are_bounded_by_the_budget_and_swept() {
        let early = EarlyStarts::new(4, Duration::ZERO, Arc::new(Metrics::new()));
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        for port in 0..100 {
            assert!(early.take(addr(port), dst).is_none());
        }
        let entries: usize = early.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(entries, 4 * MARKERS_PER_LEG, "markers in the table");
        assert_eq!(early.markers.load(Relaxed), 4 * MARKERS_PER_LEG);
        assert_eq!(early.stats.misses.load(Relaxed), 100);
        early.sweep();
        let entries: usize = early.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(entries, 0);
        assert_eq!(early.markers.load(Relaxed), 0);
        // A dead detector: accepts neither consult the table nor count.
        early.detector_died();
        assert!(early.take(addr(1), dst).is_none());
        assert_eq!(early.stats.misses.load(Relaxed), 100);
        assert!(matches!(early.status(), api::EarlySyn::Dead(d) if d.detector == "dead"));
    }
}
