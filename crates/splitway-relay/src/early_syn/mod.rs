//! Early SYN (the KTCP paper's first improvement): the next leg starts when
//! the client's SYN arrives, not after accept().
//!
//! This is the table such legs wait in, keyed by (client, original
//! destination), where the accepted connection picks them up; what it holds
//! (`T`) is the started leg, and starting it is `syn_start`'s. SYN
//! retransmits find their entry and start nothing; entries whose handshake
//! never completes expire and close what they opened. Early starts have a
//! budget: beyond it (a SYN flood), legs start at accept as without early
//! SYN, so a flood can neither open unbounded next legs nor drain the pool.
//! One client prefix (IPv4 /24, IPv6 /64) gets a share of it
//! (`early_syn_prefix_budget`), so a flood from one prefix leaves the rest
//! to other clients. A leg whose client does not complete its handshake
//! within a few of its prefix's measured handshake round trips is closed
//! then ([`EarlyStarts::wait_for`]), not at the expiry: a spoofed SYN's leg
//! holds a connection at the server for about a second, not ten.
//! Every outcome is counted in `splitway_early_syn_total`, which `/status`
//! reads back.
//!
//! With `early_syn` left on `auto`, the table also learns which client
//! prefixes gain nothing from it (`NearClients`). The head start of an
//! early leg is the client's handshake round trip (SYN to the ACK that lets
//! accept return); where that is under [`NEAR_BELOW`] (a LAN), the early
//! start is pure cost (on the TPROXY bench rig: setup p50 170–180 µs
//! against 139–143 µs with this learning, p99 335–455 against 243–262),
//! so the detector stops reporting those prefixes' SYNs except for a
//! sample that keeps measuring them.
//!
//! Its status line is [`plan`]'s; its live switch (the `early_syn`
//! parameter) is `params.rs`'s.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use splitway_api as api;
use splitway_sys::bpf::{near_prefix, near_sample};

use crate::config::Config;

pub mod metrics;
mod params;
pub mod plan;
mod start;

pub use start::Detector;

pub use metrics::{EarlySynMetrics, EarlySynOutcome};
pub use params::{PARAM, param};

const SHARDS: usize = 16;

type Key = (SocketAddr, SocketAddr);

enum Slot<T> {
    /// The leg started at the SYN, waiting for the accepted connection.
    Started(T),
    /// The connection was accepted before its SYN event was read: the event,
    /// read late, must not start a leg. Swept after [`MARKER_LIFETIME`].
    Accepted,
}

struct Entry<T> {
    slot: Slot<T>,
    born: Instant,
    /// How long a `Started` leg waits for its accept.
    lifetime: Duration,
    /// The client prefix whose share the leg holds (legs parked by strict
    /// mode are bounded by strict's own budget and hold none).
    prefix: Option<IpAddr>,
}

pub struct EarlyStarts<T> {
    shards: Vec<Mutex<HashMap<Key, Entry<T>>>>,
    hasher: RandomState,
    in_table: AtomicUsize,
    budget: usize,
    /// Started legs one client prefix may hold.
    prefix_budget: usize,
    /// Started legs per client prefix (only prefixes holding some: at most
    /// `budget` entries).
    per_prefix: Mutex<HashMap<IpAddr, usize>>,
    expiry: Duration,
    /// `splitway_early_syn_total`: what this table counts, and all that
    /// `/status` shows of it.
    metrics: EarlySynMetrics,
    /// The SYN detector feeding this table stopped: nothing new arrives.
    dead: AtomicBool,
    /// Client prefixes' handshake round trips, which time out early legs;
    /// in auto mode also which prefixes the detector samples.
    near: NearClients,
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

/// A hit whose leg waited at least this long may have a retransmitted SYN
/// whose event is still queued behind the accept (no TCP retransmits
/// sooner than its 200 ms minimum RTO; a first SYN's is 1 s), so it leaves
/// a marker as a miss does. Faster hits, all of them on a LAN, need none.
const RETRANSMIT_POSSIBLE_AFTER: Duration = Duration::from_millis(200);

/// How long an early leg waits for the accept of a client whose prefix has
/// no measured handshake yet. A real client's ACK follows its SYN by one
/// round trip, under a second on every path this relay is for (GEO: about
/// 600 ms); a spoofed SYN's never comes. Longer than the 1 s initial SYN
/// timeout, so a client whose SYN-ACK was lost retransmits its SYN before
/// the leg is closed, and the retransmit extends the wait.
const UNMEASURED_WAIT: Duration = Duration::from_millis(1500);
/// A measured prefix's early legs wait this many of its minimum handshake
/// round trips, plus [`WAIT_MARGIN`] for the accept loop and the SYN
/// event's reader running late on a busy host.
const WAIT_RTTS: u32 = 3;
const WAIT_MARGIN: Duration = Duration::from_millis(250);

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl<T> EarlyStarts<T> {
    /// `budget` started legs at most, `prefix_budget` of them for one
    /// client prefix; each waits `expiry` for its accept at most.
    pub fn new(
        budget: usize,
        prefix_budget: usize,
        expiry: Duration,
        metrics: EarlySynMetrics,
    ) -> Self {
        EarlyStarts {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            in_table: AtomicUsize::new(0),
            budget,
            prefix_budget: prefix_budget.max(1),
            per_prefix: Mutex::new(HashMap::new()),
            expiry,
            metrics,
            dead: AtomicBool::new(false),
            markers: AtomicUsize::new(0),
            near: NearClients::default(),
        }
    }

    /// Learns near client prefixes (`early_syn = "auto"` with a detector
    /// that can sample them).
    pub fn learning_near_clients(mut self) -> Self {
        self.near.learn = true;
        self
    }

    /// How long a leg started for `client`'s SYN waits for its accept:
    /// `WAIT_RTTS` of the prefix's minimum handshake round trip plus
    /// `WAIT_MARGIN`, or `UNMEASURED_WAIT` for a prefix not measured yet;
    /// never longer than the expiry.
    pub fn wait_for(&self, client: IpAddr) -> Duration {
        let wait = match self.near.min_rtt(client) {
            Some(rtt) => rtt.saturating_mul(WAIT_RTTS).saturating_add(WAIT_MARGIN),
            None => UNMEASURED_WAIT,
        };
        wait.min(self.expiry)
    }

    /// Gives started legs' shares back to their prefixes.
    fn release_prefixes(&self, prefixes: impl IntoIterator<Item = IpAddr>) {
        let mut counts = self.per_prefix.lock().expect("early prefixes lock");
        for prefix in prefixes {
            if let Some(held) = counts.get_mut(&prefix) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    counts.remove(&prefix);
                }
            }
        }
    }

    /// Changes to the detector's near prefixes decided since the last call:
    /// (an address in the prefix, near). Each must be confirmed with
    /// [`EarlyStarts::near_applied`] once the detector has it. Cheap when
    /// there are none (one atomic load).
    pub fn near_changes(&self) -> Vec<(IpAddr, bool)> {
        self.near.changes()
    }

    /// The handshake round trip of an accepted client (the kernel's first
    /// RTT sample of the socket: SYN-ACK to ACK), i.e. the head start an
    /// early leg gets for that client, and what times out its prefix's
    /// unanswered legs.
    pub fn client_rtt(&self, client: SocketAddr, rtt: Duration) {
        self.near.sample(canonical(client), rtt);
    }

    /// The detector now samples (`near`) or reports every SYN of the
    /// prefix of `ip`.
    pub fn near_applied(&self, ip: IpAddr, near: bool) {
        self.near.applied(ip, near);
    }

    fn count(&self, outcome: EarlySynOutcome, n: u64) {
        self.metrics.count(outcome, n);
    }

    /// IPv6 packets the detector could not see into (its own counter's
    /// growth since the last call).
    pub fn ipv6_unwalked(&self, n: u64) {
        if n > 0 {
            self.count(EarlySynOutcome::Ipv6Unwalked, n);
        }
    }

    fn shard(&self, key: &Key) -> &Mutex<HashMap<Key, Entry<T>>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// A SYN that started nothing because accept would refuse its client
    /// (or its destination option is unusable).
    pub fn denied(&self) {
        self.count(EarlySynOutcome::Denied, 1);
    }

    /// Parks `leg`, just started for a client's SYN, unless that SYN's
    /// 4-tuple already has an entry (a retransmit, or its accept won the
    /// race) or the budget or the client prefix's share of it is spent.
    /// Returns the (canonical) client and
    /// destination when parked; otherwise `leg` is dropped.
    pub fn start(&self, client: SocketAddr, dst: SocketAddr, leg: T) -> Option<Key> {
        let key = (canonical(client), canonical(dst));
        let mut shard = self.shard(&key).lock().expect("early table lock");
        if let Some(entry) = shard.get_mut(&key) {
            // The leg exists or is no longer needed. A retransmitted SYN
            // says its client is still trying (its SYN-ACK was lost): the
            // leg waits another round for it, within the expiry.
            if matches!(entry.slot, Slot::Started(_)) {
                entry.lifetime =
                    (entry.born.elapsed() + self.wait_for(key.0.ip())).min(self.expiry);
            }
            drop(shard);
            self.count(EarlySynOutcome::Duplicate, 1);
            return None;
        }
        if self.in_table.load(Relaxed) >= self.budget {
            self.count(EarlySynOutcome::OverBudget, 1);
            return None;
        }
        let prefix = near_prefix(key.0.ip());
        {
            let mut counts = self.per_prefix.lock().expect("early prefixes lock");
            let held = counts.entry(prefix).or_insert(0);
            if *held >= self.prefix_budget {
                drop(counts);
                drop(shard);
                self.count(EarlySynOutcome::PrefixOverBudget, 1);
                return None;
            }
            *held += 1;
        }
        self.in_table.fetch_add(1, Relaxed);
        shard.insert(
            key,
            Entry {
                slot: Slot::Started(leg),
                born: Instant::now(),
                lifetime: self.wait_for(key.0.ip()),
                prefix: Some(prefix),
            },
        );
        drop(shard);
        self.count(EarlySynOutcome::Started, 1);
        Some(key)
    }

    /// Strict mode: a leg already connected through to the server, for the
    /// accept that follows the SYN strict mode is about to release. Strict
    /// mode bounds these with its own budget (its pending SYNs).
    pub fn park(&self, client: SocketAddr, dst: SocketAddr, leg: T) {
        let key = (canonical(client), canonical(dst));
        let mut shard = self.shard(&key).lock().expect("early table lock");
        let previous = shard.insert(
            key,
            Entry {
                slot: Slot::Started(leg),
                born: Instant::now(),
                lifetime: self.expiry,
                prefix: None,
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
    pub fn take(&self, client: SocketAddr, dst: SocketAddr) -> Option<T> {
        self.take_reporting(client, dst).leg
    }

    /// [`EarlyStarts::take`] for a plain TPROXY accept, which also says
    /// whether to report the connection's handshake round trip
    /// ([`EarlyStarts::client_rtt`]).
    pub fn take_reporting(&self, client: SocketAddr, dst: SocketAddr) -> Taken<T> {
        // No detector, no early legs: accepts are not misses of it either.
        if self.dead.load(Relaxed) {
            return Taken {
                leg: None,
                wants_rtt: false,
            };
        }
        let key = (canonical(client), canonical(dst));
        let mut shard = self.shard(&key).lock().expect("early table lock");
        let previous = shard.remove(&key);
        if previous.is_none() && self.near.unreported(key.0) {
            // The detector did not report this SYN: no event will come,
            // so no marker is needed either.
            drop(shard);
            self.count(EarlySynOutcome::Near, 1);
            return Taken {
                leg: None,
                wants_rtt: false,
            };
        }
        // A miss: the SYN event is still queued behind this accept (its
        // reader is late) and must not start a leg when it is read, so a
        // marker stays for a while (within its budget). A quick hit needs
        // none: its only SYN's event was read already. A slow one may have
        // had its SYN retransmitted, and that event may trail the accept.
        match &previous {
            Some(Entry {
                slot: Slot::Accepted,
                ..
            }) => {
                // A second accept of one 4-tuple within the marker's life
                // (port reuse): keep the marker, fresh.
                shard.insert(key, Entry::marker());
            }
            Some(Entry {
                slot: Slot::Started(_),
                born,
                ..
            }) if born.elapsed() < RETRANSMIT_POSSIBLE_AFTER => {}
            _ if self.markers.load(Relaxed) < self.budget * MARKERS_PER_LEG => {
                shard.insert(key, Entry::marker());
                self.markers.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        drop(shard);
        let leg = match previous {
            Some(Entry {
                slot: Slot::Started(started),
                prefix,
                ..
            }) => {
                self.in_table.fetch_sub(1, Relaxed);
                self.release_prefixes(prefix);
                self.count(EarlySynOutcome::Hit, 1);
                Some(started)
            }
            _ => {
                self.count(EarlySynOutcome::Miss, 1);
                None
            }
        };
        Taken {
            leg,
            wants_rtt: true,
        }
    }

    /// Drops entries whose client was not accepted in time; their legs are
    /// reset (`next_leg::Unclaimed`), and so are the connections the next
    /// relays opened for them.
    pub fn sweep(&self) {
        let mut freed: Vec<IpAddr> = Vec::new();
        for shard in &self.shards {
            let mut map = shard.lock().expect("early table lock");
            let mut gone = 0;
            let mut markers = 0;
            map.retain(|_, e| {
                let lifetime = match e.slot {
                    Slot::Started(_) => e.lifetime,
                    Slot::Accepted => self.expiry.min(MARKER_LIFETIME),
                };
                let keep = e.born.elapsed() < lifetime;
                if !keep {
                    match e.slot {
                        Slot::Started(_) => {
                            gone += 1;
                            freed.extend(e.prefix);
                        }
                        Slot::Accepted => markers += 1,
                    }
                }
                keep
            });
            drop(map);
            self.markers.fetch_sub(markers, Relaxed);
            if gone > 0 {
                self.in_table.fetch_sub(gone, Relaxed);
                self.count(EarlySynOutcome::Expired, gone as u64);
            }
        }
        if !freed.is_empty() {
            self.release_prefixes(freed);
        }
    }

    pub fn pending(&self) -> usize {
        self.in_table.load(Relaxed)
    }

    /// The detector stopped for good: status says so instead of counting on.
    pub fn detector_died(&self) {
        self.dead.store(true, Relaxed);
    }

    fn counted(&self, outcome: EarlySynOutcome) -> u64 {
        self.metrics.get(outcome)
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
            started: self.counted(EarlySynOutcome::Started),
            hits: self.counted(EarlySynOutcome::Hit),
            misses: self.counted(EarlySynOutcome::Miss),
            duplicates: self.counted(EarlySynOutcome::Duplicate),
            over_budget: self.counted(EarlySynOutcome::OverBudget),
            prefix_over_budget: self.counted(EarlySynOutcome::PrefixOverBudget),
            prefix_budget: self.prefix_budget as u64,
            denied: self.counted(EarlySynOutcome::Denied),
            expired: self.counted(EarlySynOutcome::Expired),
            near: self.counted(EarlySynOutcome::Near),
            near_prefixes: self.near.sampled_prefixes(),
        })
    }
}

impl<T> Entry<T> {
    /// An accept's marker.
    fn marker() -> Self {
        Entry {
            slot: Slot::Accepted,
            born: Instant::now(),
            lifetime: MARKER_LIFETIME,
            prefix: None,
        }
    }
}

/// What [`EarlyStarts::take_reporting`] found for an accept.
pub struct Taken<T> {
    /// The leg started at the SYN, if any.
    pub leg: Option<T>,
    /// The detector reported this SYN: the connection's handshake round
    /// trip is a sample (of its prefix's head start and wait).
    pub wants_rtt: bool,
}

/// Below this head start (the client's handshake round trip, its recent
/// minimum) a prefix is near: the early start cannot repay its own cost
/// there.
pub const NEAR_BELOW: Duration = Duration::from_micros(200);
/// Above this a near prefix is far again (hysteresis against flapping).
const FAR_ABOVE: Duration = Duration::from_micros(400);
/// Round trips measured before a prefix may be declared near, and the
/// window of the minimum.
const NEAR_MIN_SAMPLES: u32 = 16;
/// Prefixes tracked at most: the detector's map has this many slots.
const NEAR_MAX_PREFIXES: usize = 4096;

/// The head start early SYN gave each client prefix (IPv4 /24, IPv6 /64),
/// and, when `learn`, which prefixes the detector samples instead of
/// reporting every SYN (`splitway_sys::bpf::NEAR_SAMPLE`).
#[derive(Default)]
struct NearClients {
    /// Decide near prefixes (`early_syn = "auto"`); otherwise only measure.
    learn: bool,
    prefixes: Mutex<HashMap<IpAddr, Near>>,
    /// Decided, not yet confirmed in the detector.
    pending: Mutex<Vec<(IpAddr, bool)>>,
    /// `pending` is not empty: the detector's reader looks after each event.
    changed: AtomicBool,
    /// Prefixes the detector samples: when 0, accepts skip the lock.
    sampled: AtomicUsize,
}

/// A prefix's round trips: the minimum over the last one or two windows
/// of [`NEAR_MIN_SAMPLES`]. The minimum, not a mean: queueing on a busy
/// host inflates single samples by milliseconds, the path's floor stays.
struct Near {
    window_min_ns: u64,
    previous_min_ns: u64,
    in_window: u32,
    samples: u32,
    /// What this table wants the detector to do with the prefix.
    wanted: bool,
    /// Since when the detector samples the prefix (confirmed by `applied`);
    /// `None`: it reports every SYN. SYNs it reported just before may have
    /// events still queued behind their accepts, so for [`MARKER_LIFETIME`]
    /// accepts are treated as reported (a miss leaves a marker). Without
    /// this, such a late event started a leg nobody took, and its server saw
    /// a connection that sat for the expiry and was reset (a CI failure of
    /// `many_concurrent_connections`).
    sampled_since: Option<Instant>,
}

impl Default for Near {
    fn default() -> Self {
        Near {
            window_min_ns: u64::MAX,
            previous_min_ns: u64::MAX,
            in_window: 0,
            samples: 0,
            wanted: false,
            sampled_since: None,
        }
    }
}

impl Near {
    fn add(&mut self, ns: u64) {
        self.window_min_ns = self.window_min_ns.min(ns);
        self.in_window += 1;
        self.samples = self.samples.saturating_add(1);
        if self.in_window == NEAR_MIN_SAMPLES {
            self.previous_min_ns = self.window_min_ns;
            self.window_min_ns = u64::MAX;
            self.in_window = 0;
        }
    }

    fn min_rtt(&self) -> Duration {
        Duration::from_nanos(self.window_min_ns.min(self.previous_min_ns))
    }
}

impl NearClients {
    fn sample(&self, client: SocketAddr, rtt: Duration) {
        let prefix = near_prefix(client.ip());
        let mut prefixes = self.prefixes.lock().expect("near prefixes lock");
        if prefixes.len() >= NEAR_MAX_PREFIXES && !prefixes.contains_key(&prefix) {
            return;
        }
        let near = prefixes.entry(prefix).or_default();
        near.add(u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX));
        if !self.learn {
            return;
        }
        let wanted = if near.wanted {
            near.min_rtt() < FAR_ABOVE
        } else {
            near.samples >= NEAR_MIN_SAMPLES && near.min_rtt() < NEAR_BELOW
        };
        if wanted != near.wanted {
            near.wanted = wanted;
            drop(prefixes);
            self.pending
                .lock()
                .expect("near changes lock")
                .push((prefix, wanted));
            self.changed.store(true, Relaxed);
        }
    }

    /// The minimum handshake round trip measured for `ip`'s prefix.
    fn min_rtt(&self, ip: IpAddr) -> Option<Duration> {
        let prefixes = self.prefixes.lock().expect("near prefixes lock");
        prefixes
            .get(&near_prefix(ip))
            .filter(|n| n.samples > 0)
            .map(Near::min_rtt)
    }

    /// True when the detector did not report this client's SYN: its
    /// prefix has been sampled for longer than an event can trail its
    /// accept, and its port is not a sample.
    fn unreported(&self, client: SocketAddr) -> bool {
        if self.sampled.load(Relaxed) == 0 || near_sample(client.port()) {
            return false;
        }
        let prefixes = self.prefixes.lock().expect("near prefixes lock");
        prefixes
            .get(&near_prefix(client.ip()))
            .and_then(|n| n.sampled_since)
            .is_some_and(|since| since.elapsed() >= MARKER_LIFETIME)
    }

    fn changes(&self) -> Vec<(IpAddr, bool)> {
        if !self.changed.swap(false, Relaxed) {
            return Vec::new();
        }
        std::mem::take(&mut *self.pending.lock().expect("near changes lock"))
    }

    fn applied(&self, ip: IpAddr, sampled: bool) {
        let mut prefixes = self.prefixes.lock().expect("near prefixes lock");
        if let Some(near) = prefixes.get_mut(&near_prefix(ip))
            && near.sampled_since.is_some() != sampled
        {
            if sampled {
                near.sampled_since = Some(Instant::now());
                self.sampled.fetch_add(1, Relaxed);
            } else {
                near.sampled_since = None;
                self.sampled.fetch_sub(1, Relaxed);
            }
        }
    }

    fn sampled_prefixes(&self) -> u64 {
        self.sampled.load(Relaxed) as u64
    }
}

/// Interfaces the SYN detector attaches to: tproxy listeners' `intercept`
/// interfaces and syn-option listeners' `watch`, each once.
pub fn watched_interfaces(cfg: &Config) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let names = cfg.listeners.iter().flat_map(|l| {
        let intercept = l.intercept.iter().flat_map(|i| i.interfaces.iter());
        let watch = l.watch.iter().filter(move |_| l.mode.syn_carries_dst());
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
        .filter(|l| l.mode.syn_carries_dst() && !l.watch.is_empty())
        .map(|l| l.addr.port())
        .collect();
    (plain, option)
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
        let early = EarlyStarts::<()>::new(4, 4, Duration::ZERO, EarlySynMetrics::default());
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        for port in 0..100 {
            assert!(early.take(addr(port), dst).is_none());
        }
        let entries: usize = early.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(entries, 4 * MARKERS_PER_LEG, "markers in the table");
        assert_eq!(early.markers.load(Relaxed), 4 * MARKERS_PER_LEG);
        assert_eq!(early.counted(EarlySynOutcome::Miss), 100);
        early.sweep();
        let entries: usize = early.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(entries, 0);
        assert_eq!(early.markers.load(Relaxed), 0);
        // A dead detector: accepts neither consult the table nor count.
        early.detector_died();
        assert!(early.take(addr(1), dst).is_none());
        assert_eq!(early.counted(EarlySynOutcome::Miss), 100);
        assert!(matches!(early.status(), api::EarlySyn::Dead(d) if d.detector == "dead"));
    }

    fn near_table() -> EarlyStarts<u8> {
        EarlyStarts::<u8>::new(64, 64, Duration::from_secs(10), EarlySynMetrics::default())
            .learning_near_clients()
    }

    const LAN: Duration = Duration::from_micros(60);

    /// Quick handshakes make a prefix near after NEAR_MIN_SAMPLES; once the
    /// detector confirms, unsampled ports' accepts count `near`, leave no
    /// marker and report no round trip, sampled ones are served as before;
    /// slow round trips make it far again. Another prefix is never touched.
    #[test]
    fn quick_handshakes_make_a_prefix_near_and_slow_ones_far_again() {
        let early = near_table();
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        for port in 1..NEAR_MIN_SAMPLES as u16 {
            assert!(early.take_reporting(addr(port), dst).wants_rtt);
            early.client_rtt(addr(port), LAN);
            assert!(early.near_changes().is_empty(), "too few samples yet");
        }
        // A far prefix (10.0.2.0/24, 50 ms round trips) beside it.
        for port in 1..=2 * NEAR_MIN_SAMPLES as u16 {
            early.client_rtt(
                SocketAddr::from(([10, 0, 2, 9], port)),
                Duration::from_millis(50),
            );
        }
        // v4-mapped is the same client.
        early.client_rtt(
            SocketAddr::new("::ffff:10.0.1.77".parse().unwrap(), 100),
            LAN,
        );
        let prefix = IpAddr::from([10, 0, 1, 0]);
        assert_eq!(early.near_changes(), vec![(prefix, true)]);
        // Not yet in the detector: accepts still expect events.
        assert!(early.take(addr(101), dst).is_none());
        assert_eq!(
            early.counted(EarlySynOutcome::Miss),
            NEAR_MIN_SAMPLES as u64
        );
        early.near_applied(prefix, true);
        assert!(matches!(early.status(), api::EarlySyn::Running(s) if s.near_prefixes == 1));
        sampled_for_a_while(&early, prefix);

        let markers = early.markers.load(Relaxed);
        let unreported = early.take_reporting(addr(102), dst);
        assert!(unreported.leg.is_none() && !unreported.wants_rtt);
        assert_eq!(early.counted(EarlySynOutcome::Near), 1);
        assert_eq!(early.markers.load(Relaxed), markers, "no marker");
        assert_eq!(
            early.counted(EarlySynOutcome::Miss),
            NEAR_MIN_SAMPLES as u64
        );
        // A sampled port (bits 1-4 zero) is reported: started, hit.
        assert!(early.start(addr(160), dst, 7).is_some());
        let sampled = early.take_reporting(addr(160), dst);
        assert_eq!(sampled.leg, Some(7));
        assert!(sampled.wants_rtt);
        // The far prefix is untouched.
        assert!(
            early
                .take(SocketAddr::from(([10, 0, 2, 9], 999)), dst)
                .is_none()
        );
        assert_eq!(early.counted(EarlySynOutcome::Near), 1);

        // One slow handshake (a busy host) is not a move.
        early.client_rtt(addr(16 * 19), Duration::from_millis(30));
        assert!(early.near_changes().is_empty());
        // The prefix's clients move away: 5 ms round trips, until the
        // window minimum (two windows at most) has forgotten the LAN.
        let mut changes = Vec::new();
        for i in 0..2 * NEAR_MIN_SAMPLES as u16 {
            early.client_rtt(addr(16 * (20 + i)), Duration::from_millis(5));
            changes.extend(early.near_changes());
        }
        assert_eq!(changes, vec![(prefix, false)]);
        early.near_applied(prefix, false);
        assert!(early.take(addr(103), dst).is_none());
        assert_eq!(
            early.counted(EarlySynOutcome::Near),
            1,
            "reported again: a miss"
        );
        assert!(matches!(early.status(), api::EarlySyn::Running(s) if s.near_prefixes == 0));
    }

    /// Makes `key`'s entry `by` older.
    fn backdate<T>(early: &EarlyStarts<T>, key: Key, by: Duration) {
        let mut shard = early.shard(&key).lock().unwrap();
        shard.get_mut(&key).expect("an entry").born -= by;
    }

    /// Backdates the detector's sampling of `prefix` past the time a SYN
    /// event reported before it can trail its accept.
    fn sampled_for_a_while(early: &EarlyStarts<u8>, prefix: IpAddr) {
        let near = &early.near;
        let mut prefixes = near.prefixes.lock().unwrap();
        let since = prefixes
            .get_mut(&prefix)
            .and_then(|n| n.sampled_since.as_mut())
            .expect("prefix sampled");
        *since -= MARKER_LIFETIME;
    }

    /// Just after the detector starts sampling a prefix, an accept may
    /// belong to a SYN it reported before, whose event is still queued:
    /// the accept leaves a marker, so that event starts no leg (the
    /// `many_concurrent_connections` CI failure: a leg nobody took, its
    /// server connection reset at the expiry). Later, accepts of the
    /// prefix's unsampled ports leave none.
    #[test]
    fn an_event_reported_before_sampling_began_starts_no_leg() {
        let early = near_table();
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        for port in 1..=NEAR_MIN_SAMPLES as u16 {
            early.client_rtt(addr(port), LAN);
        }
        let prefix = IpAddr::from([10, 0, 1, 0]);
        assert_eq!(early.near_changes(), vec![(prefix, true)]);
        early.near_applied(prefix, true);

        // The SYN of port 101 was reported before the detector changed;
        // its accept runs first, then its event is read.
        assert!(early.take(addr(101), dst).is_none());
        assert_eq!(early.counted(EarlySynOutcome::Miss), 1);
        assert_eq!(early.counted(EarlySynOutcome::Near), 0);
        assert!(early.start(addr(101), dst, 1).is_none(), "the late event");
        assert_eq!(early.counted(EarlySynOutcome::Started), 0);
        assert_eq!(early.counted(EarlySynOutcome::Duplicate), 1);

        sampled_for_a_while(&early, prefix);
        let markers = early.markers.load(Relaxed);
        assert!(early.take(addr(102), dst).is_none());
        assert_eq!(early.counted(EarlySynOutcome::Near), 1);
        assert_eq!(early.markers.load(Relaxed), markers, "no marker");
    }

    /// Without `learning_near_clients` (`early_syn = true`), nothing is
    /// ever sampled; round trips are still measured (they time out
    /// unanswered legs).
    #[test]
    fn explicit_early_syn_never_samples() {
        let early =
            EarlyStarts::<u8>::new(64, 64, Duration::from_secs(10), EarlySynMetrics::default());
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        for port in 1..100 {
            assert!(early.start(addr(port), dst, 0).is_some());
            let taken = early.take_reporting(addr(port), dst);
            assert_eq!(taken.leg, Some(0));
            assert!(taken.wants_rtt);
            early.client_rtt(addr(port), LAN);
        }
        assert!(early.near_changes().is_empty());
    }

    /// A hit that waited long enough for a SYN retransmit leaves a marker,
    /// so that retransmit's event, read after the accept, starts no second
    /// leg; a quick hit leaves none.
    #[test]
    fn a_slow_hit_leaves_a_marker_for_its_retransmitted_syn() {
        let early =
            EarlyStarts::<u8>::new(4, 4, Duration::from_secs(10), EarlySynMetrics::default());
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        assert!(early.start(addr(1), dst, 1).is_some());
        assert_eq!(early.take(addr(1), dst), Some(1));
        assert_eq!(
            early.markers.load(Relaxed),
            0,
            "a quick hit leaves no marker"
        );

        assert!(early.start(addr(2), dst, 2).is_some());
        backdate(&early, (addr(2), dst), RETRANSMIT_POSSIBLE_AFTER);
        assert_eq!(early.take(addr(2), dst), Some(2));
        assert_eq!(early.markers.load(Relaxed), 1, "a slow hit leaves one");
        assert!(early.start(addr(2), dst, 3).is_none(), "the late event");
        assert_eq!(early.counted(EarlySynOutcome::Duplicate), 1);
        assert_eq!(early.counted(EarlySynOutcome::Started), 2);
        assert_eq!(early.counted(EarlySynOutcome::Hit), 2);
    }

    /// A flood from one prefix holds its share of the budget only: other
    /// prefixes still start legs, and a taken or swept leg gives its share
    /// back.
    #[test]
    fn one_prefix_holds_only_its_share_of_the_budget() {
        let early =
            EarlyStarts::<u8>::new(16, 4, Duration::from_secs(10), EarlySynMetrics::default());
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        let flood = |i: u16| SocketAddr::from(([10, 0, 8, (i % 250) as u8 + 1], 1000 + i));
        let started = (0..100u16)
            .filter(|&i| early.start(flood(i), dst, 0).is_some())
            .count();
        assert_eq!(started, 4);
        assert_eq!(early.pending(), 4);
        assert_eq!(early.counted(EarlySynOutcome::PrefixOverBudget), 96);
        assert_eq!(early.counted(EarlySynOutcome::OverBudget), 0);
        // Another /24, and an IPv6 /64 beside it, each have a share.
        assert!(early.start(addr(1), dst, 1).is_some());
        let v6 = |host: u16| SocketAddr::new(IpAddr::from([0xfd00, 1, 0, 0, 0, 0, 0, host]), 9);
        for host in 1..=5 {
            let _ = early.start(v6(host), dst, 2);
        }
        assert_eq!(early.pending(), 4 + 1 + 4);
        // A hit gives the prefix's share back.
        assert_eq!(early.take(flood(0), dst), Some(0));
        assert!(early.start(flood(200), dst, 0).is_some());
        assert!(early.start(flood(201), dst, 0).is_none());
        assert!(
            matches!(early.status(), api::EarlySyn::Running(s) if s.prefix_budget == 4 && s.prefix_over_budget == 98)
        );
    }

    /// An unanswered leg waits a few of its prefix's handshake round trips
    /// (a second when the prefix is unmeasured, the expiry at most), then
    /// the sweep closes it and frees its prefix's share.
    #[test]
    fn unanswered_legs_wait_a_few_handshake_round_trips() {
        let early =
            EarlyStarts::<u8>::new(64, 1, Duration::from_secs(10), EarlySynMetrics::default());
        let far = IpAddr::from([10, 0, 2, 9]);
        assert_eq!(early.wait_for(far), UNMEASURED_WAIT);
        early.client_rtt(SocketAddr::new(far, 1), Duration::from_millis(80));
        early.client_rtt(SocketAddr::new(far, 2), Duration::from_millis(50));
        let wait = 3 * Duration::from_millis(50) + WAIT_MARGIN;
        assert_eq!(early.wait_for(IpAddr::from([10, 0, 2, 200])), wait);
        let slow = SocketAddr::from(([10, 0, 5, 1], 1));
        early.client_rtt(slow, Duration::from_secs(5));
        assert_eq!(
            early.wait_for(slow.ip()),
            Duration::from_secs(10),
            "at most the expiry"
        );

        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        let client = SocketAddr::new(far, 5);
        assert!(early.start(client, dst, 1).is_some());
        early.sweep();
        assert_eq!(early.pending(), 1, "still within its wait");
        backdate(&early, (client, dst), wait);
        early.sweep();
        assert_eq!(early.pending(), 0);
        assert_eq!(early.counted(EarlySynOutcome::Expired), 1);
        assert!(early.per_prefix.lock().unwrap().is_empty());
        assert!(
            early.start(SocketAddr::new(far, 6), dst, 2).is_some(),
            "share freed"
        );
    }

    /// A retransmitted SYN (its SYN-ACK was lost) extends its leg's wait by
    /// another one, within the expiry, so the client's late accept still
    /// finds it.
    #[test]
    fn a_retransmitted_syn_extends_its_legs_wait() {
        let early =
            EarlyStarts::<u8>::new(64, 8, Duration::from_secs(3), EarlySynMetrics::default());
        let dst = SocketAddr::from(([10, 0, 3, 2], 80));
        let client = addr(7);
        assert!(early.start(client, dst, 1).is_some());
        let backdate = |d: Duration| backdate(&early, (client, dst), d);
        backdate(Duration::from_secs(1));
        assert!(early.start(client, dst, 2).is_none(), "the retransmit");
        assert_eq!(early.counted(EarlySynOutcome::Duplicate), 1);
        backdate(UNMEASURED_WAIT - Duration::from_secs(1));
        early.sweep();
        assert_eq!(early.pending(), 1, "waiting past its first wait");
        backdate(Duration::from_secs(1));
        early.sweep();
        assert_eq!(early.pending(), 0, "gone once the extended wait is over");
    }
}
