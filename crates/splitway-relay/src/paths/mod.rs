//! Path choice among a route's candidate next hops (`via = ["rs1", "rs2",
//! "direct"]`), from measured legs; `docs/paths.md` has the design.
//!
//! Per peer: the smoothed RTT of our legs to it (TCP_INFO of every leg
//! dialed or taken from the pool, and of one active probe a second at
//! most), the retransmits seen on those legs, and whether it is down (a
//! failed dial, probe or pool refill marks it down at once; a success
//! brings it back). Per (peer, route): what the peer reported, in its probe
//! answer, for its own way to the route's destination.
//!
//! A candidate's estimate is our leg RTT plus that report. New connections
//! take the route's current choice; the choice moves to the lowest estimate
//! at most once per [`HOLD`], and at once when the current one is down.
//! Open connections never move.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use splitway_api::{CandidateView, RouteView, RoutesView};
use splitway_proto::header::{ProbeAnswer, ReplyStatus};
use tokio::net::TcpStream;
use tracing::{debug, info};

use crate::config::{Config, Route, Via};
use crate::error::ConnError;
use crate::pool::PeerPool;
use crate::route::RouteTable;

pub mod metrics;

pub use metrics::PathMetrics;

/// At most one change of a route's choice per this long, unless the
/// current candidate is down.
pub const HOLD: Duration = Duration::from_secs(60);
/// One probe per peer per this long at most (a probe still in flight
/// skips the next round).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A probe not answered within this long marks the peer down: with
/// [`PROBE_EVERY`], a silent peer is left within 2.5 s.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);
/// A better candidate must beat the current one by this fraction and
/// [`MIN_GAIN_US`], so that jitter between equal paths causes no flips.
const MIN_GAIN_FRACTION: f64 = 0.10;
const MIN_GAIN_US: u32 = 1_000;
/// Loss costs time through retransmission timeouts: a candidate's estimate
/// adds `LOSS_EXCHANGES` segments' worth of loss probability times an RTO
/// (the kernel's 200 ms minimum plus the leg's RTT). At 5 % loss a 40 ms
/// leg counts as 88 ms.
const LOSS_EXCHANGES: f64 = 4.0;
const RTO_MIN_US: f64 = 200_000.0;
/// Weight of older samples in the loss counters, per new sample.
const LOSS_DECAY: f64 = 0.9;

/// Retransmitted segments per segment sent, over recent samples (older
/// ones decay).
#[derive(Debug, Default, Clone, Copy)]
struct Loss {
    retrans: f64,
    segs: f64,
}

impl Loss {
    /// One leg's TCP_INFO: its SYN counts as a segment (its retransmits
    /// are in `total_retrans`).
    fn add(&mut self, info: &splitway_sys::sock::TcpInfo) {
        self.retrans = self.retrans * LOSS_DECAY + f64::from(info.total_retrans);
        self.segs = self.segs * LOSS_DECAY + f64::from(info.data_segs_out) + 1.0;
    }

    fn fraction(&self) -> Option<f64> {
        (self.segs > 0.0).then(|| (self.retrans / self.segs).min(1.0))
    }
}

/// A direct dial's failure that says the way is broken: a timeout or an
/// unreachable network. A refusal came back from the server's host, so
/// the path works (and another candidate would be refused too).
fn path_failure(e: &ConnError) -> bool {
    match e {
        ConnError::ServerTimeout { .. } => true,
        ConnError::ServerConnect { source, .. } => {
            source.kind() != std::io::ErrorKind::ConnectionRefused
        }
        _ => false,
    }
}

/// `rtt_us` with the expected cost of `loss` added.
fn with_loss(rtt_us: u32, loss: Option<f64>) -> u32 {
    let p = loss.unwrap_or(0.0);
    let penalty = LOSS_EXCHANGES * p * (RTO_MIN_US + f64::from(rtt_us));
    (f64::from(rtt_us) + penalty).min(f64::from(u32::MAX)) as u32
}

/// A failed dial that the peer could not have acted on (no connection,
/// no authentication, a dead pooled leg refusing the header): the
/// client's first bytes reached no server, so another candidate may
/// carry them. Later failures may have reached the server: no retry.
pub fn retryable(e: &ConnError) -> bool {
    match e {
        ConnError::PeerIo { op, .. } => {
            matches!(*op, "connect" | "send header on pooled connection")
        }
        ConnError::PeerTimeout { during, .. } => {
            matches!(*during, "connecting" | "waiting for its challenge")
        }
        _ => false,
    }
}

#[derive(Debug, Default)]
struct PeerState {
    /// Smoothed RTT of our legs to the peer, microseconds.
    rtt_us: Option<u32>,
    samples: u64,
    /// Retransmits seen on sampled legs (TCP_INFO `total_retrans`).
    retrans: u64,
    loss: Loss,
    /// Down since, and why.
    down: Option<(Instant, String)>,
    /// Per route prefix: the peer's own estimate from its last answer;
    /// `Err` when it said it cannot reach the destination.
    onward: HashMap<IpNet, Result<Option<u32>, ReplyStatus>>,
    probes: u64,
    probing: bool,
    /// Route prefixes whose destination the next probe asks about, in turn.
    next_target: usize,
}

struct PeerPath {
    name: String,
    state: Mutex<PeerState>,
}

#[derive(Debug)]
struct ChoiceState {
    /// Index into the route's candidates.
    current: usize,
    changed_at: Option<Instant>,
    flips: u64,
    /// Smoothed RTT of direct legs on this route (handshake RTT).
    direct_rtt_us: Option<u32>,
    /// When `direct_rtt_us` last took a sample.
    direct_sampled_at: Option<Instant>,
    direct_loss: Loss,
    /// A direct dial or probe failed: since, and why.
    direct_down: Option<(Instant, String)>,
    /// The last destination a connection on this route asked for: what
    /// a direct probe connects to while direct is not the choice.
    last_dst: Option<SocketAddr>,
    probing_direct: bool,
    direct_probes: u64,
}

/// At most one direct-leg RTT sample per route this often: the smoothed
/// estimate is read by a choice or a probe answer (≤ 1/s per peer), and a
/// TCP_INFO per connection was one syscall in ~30 on the accept path.
const DIRECT_SAMPLE_EVERY: Duration = Duration::from_millis(100);

struct RoutePath {
    /// Index in config order: the metric label.
    index: usize,
    dst: IpNet,
    candidates: Vec<Via>,
    state: Mutex<ChoiceState>,
}

/// What a choice reads besides its own measurements: the routes and each
/// peer's pool (a failing refill marks the peer down).
pub struct Inputs<'a> {
    pub routes: &'a RouteTable,
    pub pools: &'a [Option<Arc<PeerPool>>],
}

/// Path state of one config generation (a reload starts afresh).
pub struct Paths {
    peers: Vec<PeerPath>,
    /// Route prefixes each peer is a candidate of (probe destinations).
    targets: Vec<Vec<IpNet>>,
    routes: HashMap<IpNet, RoutePath>,
    metrics: PathMetrics,
}

/// A candidate's estimate to the destination.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Estimate {
    Down,
    Unknown,
    Us(u32),
}

/// The candidate to move to, if any: away from a down one at once (to the
/// lowest known estimate, else the first not down in config order); to a
/// clearly better one only when not `held` by a recent change.
fn decide(est: &[Estimate], cur: usize, held: bool) -> Option<usize> {
    let best_known = (0..est.len())
        .filter_map(|j| match est[j] {
            Estimate::Us(v) => Some((v, j)),
            _ => None,
        })
        .min();
    let next = match est[cur] {
        Estimate::Down => best_known
            .map(|(_, j)| j)
            .or_else(|| (0..est.len()).find(|&j| est[j] != Estimate::Down)),
        Estimate::Us(v) if !held => best_known.and_then(|(b, j)| {
            let gain = v.saturating_sub(b);
            (gain >= MIN_GAIN_US && f64::from(gain) >= f64::from(v) * MIN_GAIN_FRACTION)
                .then_some(j)
        }),
        // Unknown current (not measured yet) or held: stay.
        _ => None,
    };
    next.filter(|&j| j != cur)
}

fn smooth(old: Option<u32>, sample: u32) -> u32 {
    // Half weight on the new sample: a +100 ms change shows within two
    // probes, a single outlier moves the figure by half.
    match old {
        Some(o) => ((u64::from(o) + u64::from(sample)) / 2) as u32,
        None => sample,
    }
}

impl Paths {
    /// Path state for `cfg`, counting into `metrics` (a reload passes the
    /// running relay's on).
    pub fn new(cfg: &Config, metrics: PathMetrics) -> Paths {
        let mut targets = vec![Vec::new(); cfg.peers.len()];
        let mut routes = HashMap::new();
        for (index, r) in cfg.routes.iter().enumerate() {
            // Only a choice needs probes; every route keeps its direct RTT
            // (its probe answers report it).
            if r.candidates.len() > 1 {
                for c in &r.candidates {
                    if let Via::Peer(i) = c {
                        targets[*i].push(r.dst);
                    }
                }
            }
            routes.insert(
                r.dst,
                RoutePath {
                    index,
                    dst: r.dst,
                    candidates: r.candidates.clone(),
                    state: Mutex::new(ChoiceState {
                        current: 0,
                        changed_at: None,
                        flips: 0,
                        direct_rtt_us: None,
                        direct_sampled_at: None,
                        direct_loss: Loss::default(),
                        direct_down: None,
                        last_dst: None,
                        probing_direct: false,
                        direct_probes: 0,
                    }),
                },
            );
        }
        Paths {
            peers: cfg
                .peers
                .iter()
                .map(|p| PeerPath {
                    name: p.name.clone(),
                    state: Mutex::new(PeerState::default()),
                })
                .collect(),
            targets,
            routes,
            metrics,
        }
    }

    /// The room's counters (the probes count in them too).
    pub fn metrics(&self) -> &PathMetrics {
        &self.metrics
    }

    /// How many peers could be probed (indices as in `cfg.peers`).
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    pub fn peer_name(&self, i: usize) -> &str {
        &self.peers[i].name
    }

    /// The route prefix the next probe to peer `i` asks about, in turn;
    /// `None` when the peer is no candidate or a probe is in flight. The
    /// caller reports the outcome with `probe_answered` or `probe_failed`.
    pub fn next_probe(&self, i: usize) -> Option<IpNet> {
        let targets = &self.targets[i];
        if targets.is_empty() {
            return None;
        }
        let mut p = self.peer(i);
        if p.probing {
            return None;
        }
        p.probing = true;
        p.next_target = (p.next_target + 1) % targets.len();
        Some(targets[p.next_target])
    }

    /// A probe to peer `i` about `target` came back on `stream`.
    pub fn probe_answered(&self, i: usize, target: IpNet, stream: &TcpStream, answer: ProbeAnswer) {
        self.leg_up(i, stream, true);
        let mut p = self.peer(i);
        let onward = match answer.status {
            ReplyStatus::Ok => Ok(answer.onward_us),
            // A peer that does not know probes: reachable, nothing reported.
            ReplyStatus::BadHeader => Ok(None),
            other => Err(other),
        };
        let onward_text = match onward {
            Ok(Some(us)) => format!("{us} us"),
            Ok(None) => "not reported".to_owned(),
            Err(status) => format!("refused ({})", status.as_str()),
        };
        let rtt = p
            .rtt_us
            .map_or("unmeasured".to_owned(), |us| format!("{us} us"));
        debug!(peer = %self.peers[i].name, route = %target, onward = %onward_text, rtt = %rtt, "probe answered");
        p.onward.insert(target, onward);
        p.probes += 1;
        p.probing = false;
    }

    /// A probe to peer `i` failed.
    pub fn probe_failed(&self, i: usize, why: &ConnError) {
        self.leg_failed(i, why);
        let mut p = self.peer(i);
        p.probes += 1;
        p.probing = false;
    }

    /// The routes whose direct candidate is due a probe, each with the
    /// destination to probe (see `direct_probe_due`); each is marked in
    /// flight, and the caller reports the outcome with `direct_probed`.
    pub fn direct_probes_due(&self) -> impl Iterator<Item = (IpNet, SocketAddr)> + '_ {
        self.routes
            .iter()
            .filter_map(|(key, r)| direct_probe_due(r).map(|dst| (*key, dst)))
    }

    /// A direct probe on route `key` (a TCP handshake, closed at once)
    /// ended: its TCP_INFO is a sample, a failure marks direct down for
    /// the route.
    pub fn direct_probed(&self, key: IpNet, result: &Result<TcpStream, ConnError>) {
        let Some(r) = self.routes.get(&key) else {
            return;
        };
        match result {
            Ok(stream) => Paths::direct_sample(r, stream),
            Err(e) if !path_failure(e) => {
                // Refused by the server's host: the way there works.
                let mut s = r.state.lock().expect("paths lock");
                s.direct_down = None;
            }
            Err(e) => {
                debug!(route = %key, error = %e, "direct probe failed");
                let mut s = r.state.lock().expect("paths lock");
                if s.direct_down.is_none() {
                    info!(route = %key, error = %e, "direct down");
                }
                s.direct_down = Some((Instant::now(), e.to_string()));
            }
        }
        let mut s = r.state.lock().expect("paths lock");
        s.direct_probes += 1;
        s.probing_direct = false;
    }

    fn peer(&self, i: usize) -> std::sync::MutexGuard<'_, PeerState> {
        self.peers[i].state.lock().expect("paths lock")
    }

    /// A leg to peer `i` is up, so is the peer. `fresh`: the leg was just
    /// dialed and its TCP_INFO is a sample; a pooled leg's RTT dates from
    /// its handshake, possibly long ago, and would pull the figure back to
    /// the past.
    pub fn leg_up(&self, i: usize, stream: &TcpStream, fresh: bool) {
        if fresh {
            self.sample(i, stream);
        }
        let mut p = self.peer(i);
        if p.down.take().is_some() {
            info!(peer = %self.peers[i].name, "peer up again");
        }
    }

    /// TCP_INFO of a leg to peer `i` that carried traffic (a finished
    /// connection, a fresh leg) as an RTT and retransmit sample.
    pub fn sample(&self, i: usize, stream: &TcpStream) {
        let info = match splitway_sys::sock::tcp_info(stream) {
            Ok(info) => info,
            // A leg already torn down has nothing to tell: no sample.
            Err(e) => {
                debug!(peer = %self.peers[i].name, error = %e, "no TCP_INFO sample");
                return;
            }
        };
        if info.rtt_us == 0 {
            return;
        }
        let mut p = self.peer(i);
        p.rtt_us = Some(smooth(p.rtt_us, info.rtt_us));
        p.samples += 1;
        p.retrans += u64::from(info.total_retrans);
        p.loss.add(&info);
    }

    /// The peer index a leg to `addr` goes to, for [`Self::sample`].
    pub fn peer_at(cfg: &Config, addr: SocketAddr) -> Option<usize> {
        cfg.peers.iter().position(|p| p.addr == addr)
    }

    /// Dialing peer `i` (or probing it) failed: it is down from now on,
    /// until a leg or probe succeeds.
    pub fn leg_failed(&self, i: usize, why: &ConnError) {
        // Our own trouble (no descriptor, a config mistake) says nothing
        // about the peer.
        if why.culprit() != crate::error::Culprit::PeerRelay {
            return;
        }
        let mut p = self.peer(i);
        if p.down.is_none() {
            info!(peer = %self.peers[i].name, error = %why, "peer down");
        }
        p.down = Some((Instant::now(), why.to_string()));
    }

    /// A direct leg on `route` connected: its handshake RTT is a sample.
    pub fn direct_up(&self, route: &Route, stream: &TcpStream) {
        let Some(r) = self.routes.get(&route.dst) else {
            return;
        };
        {
            let s = r.state.lock().expect("paths lock");
            // A down direct is always sampled: its success brings it back.
            if s.direct_down.is_none()
                && s.direct_sampled_at
                    .is_some_and(|at| at.elapsed() < DIRECT_SAMPLE_EVERY)
            {
                return;
            }
        }
        Self::direct_sample(r, stream);
    }

    fn direct_sample(r: &RoutePath, stream: &TcpStream) {
        if let Ok(info) = splitway_sys::sock::tcp_info(stream)
            && info.rtt_us > 0
        {
            let mut s = r.state.lock().expect("paths lock");
            s.direct_rtt_us = Some(smooth(s.direct_rtt_us, info.rtt_us));
            s.direct_sampled_at = Some(Instant::now());
            s.direct_loss.add(&info);
            if s.direct_down.take().is_some() {
                info!(route = %r.dst, "direct up again");
            }
        }
    }

    /// A direct dial on `route` failed with `why`: on a route with a
    /// choice, a broken way (`path_failure`) marks direct down until a
    /// dial or probe succeeds.
    pub fn direct_failed(&self, route: &Route, why: &ConnError) {
        if !path_failure(why) {
            return;
        }
        // Only a choice can move away, and direct probes bring it back once
        // it is not the choice; a single-candidate route keeps dialing.
        if let Some(r) = self
            .routes
            .get(&route.dst)
            .filter(|r| r.candidates.len() > 1)
        {
            let mut s = r.state.lock().expect("paths lock");
            s.direct_down = Some((Instant::now(), why.to_string()));
        }
    }

    /// After a failed dial to candidate peer `i` on `route`: true when the
    /// failure is [`retryable`] and another candidate is not down, so the
    /// connection may try once more (the next `choose` moves away, peer
    /// `i` being down now).
    pub fn retry_elsewhere(
        &self,
        inputs: &Inputs<'_>,
        route: &Route,
        i: usize,
        e: &ConnError,
    ) -> bool {
        if !retryable(e) {
            return false;
        }
        let Some(r) = self
            .routes
            .get(&route.dst)
            .filter(|r| r.candidates.len() > 1)
        else {
            return false;
        };
        let s = r.state.lock().expect("paths lock");
        r.candidates
            .iter()
            .any(|c| *c != Via::Peer(i) && self.estimate(inputs, r, c, &s) != Estimate::Down)
    }

    fn estimate(&self, inputs: &Inputs<'_>, r: &RoutePath, c: &Via, s: &ChoiceState) -> Estimate {
        match c {
            Via::Direct if s.direct_down.is_some() => Estimate::Down,
            Via::Direct => s.direct_rtt_us.map_or(Estimate::Unknown, |rtt| {
                Estimate::Us(with_loss(rtt, s.direct_loss.fraction()))
            }),
            Via::Peer(i) => {
                let pool_down = inputs.pools[*i]
                    .as_ref()
                    .is_some_and(|p| p.last_error().is_some());
                let p = self.peer(*i);
                if p.down.is_some() || pool_down {
                    return Estimate::Down;
                }
                let onward = match p.onward.get(&r.dst) {
                    Some(Err(_)) => return Estimate::Down,
                    Some(Ok(o)) => o.unwrap_or(0),
                    None => 0,
                };
                p.rtt_us.map_or(Estimate::Unknown, |rtt| {
                    Estimate::Us(with_loss(rtt, p.loss.fraction()).saturating_add(onward))
                })
            }
        }
    }

    /// The hop a new connection to `dst` on `route` takes (and counts it).
    pub fn choose(&self, inputs: &Inputs<'_>, route: &Route, dst: SocketAddr) -> Via {
        let Some(r) = self
            .routes
            .get(&route.dst)
            .filter(|r| r.candidates.len() > 1)
        else {
            return route.via.clone();
        };
        let mut s = r.state.lock().expect("paths lock");
        s.last_dst = Some(dst);
        let est: Vec<Estimate> = r
            .candidates
            .iter()
            .map(|c| self.estimate(inputs, r, c, &s))
            .collect();
        let now = Instant::now();
        let cur = s.current;
        let held = s.changed_at.is_some_and(|t| now - t < HOLD);
        let next = decide(&est, cur, held);
        if let Some(j) = next.filter(|&j| j != cur) {
            let failure = est[cur] == Estimate::Down;
            s.current = j;
            s.changed_at = Some(now);
            s.flips += 1;
            self.metrics.flip(r.index, failure);
            info!(route = %r.dst, from = %self.name_of(&r.candidates[cur]), to = %self.name_of(&r.candidates[j]), cause = if failure { "failure" } else { "better" }, "path changed");
        }
        let via = r.candidates[s.current].clone();
        self.metrics.choice(r.index, &self.name_of(&via));
        via
    }

    fn name_of(&self, via: &Via) -> String {
        match via {
            Via::Direct => "direct".into(),
            Via::Peer(i) => self.peers[*i].name.clone(),
        }
    }

    /// This relay's own estimate to `dst`, for a probe answer: its route's
    /// current candidate (not moved by asking).
    pub fn onward(&self, inputs: &Inputs<'_>, dst: IpAddr) -> ProbeAnswer {
        let Some(route) = inputs.routes.lookup_route(dst) else {
            return ProbeAnswer {
                status: ReplyStatus::NoRoute,
                onward_us: None,
            };
        };
        let ok = |onward_us| ProbeAnswer {
            status: ReplyStatus::Ok,
            onward_us,
        };
        let Some(r) = self.routes.get(&route.dst) else {
            return ok(None);
        };
        let s = r.state.lock().expect("paths lock");
        match self.estimate(inputs, r, &r.candidates[s.current], &s) {
            Estimate::Us(v) => ok(Some(v)),
            Estimate::Unknown => ok(None),
            Estimate::Down => {
                // Down now, but choose() moves on for the next connection
                // if any other candidate is up.
                let any_up = r
                    .candidates
                    .iter()
                    .any(|c| self.estimate(inputs, r, c, &s) != Estimate::Down);
                if any_up {
                    ok(None)
                } else {
                    ProbeAnswer {
                        status: ReplyStatus::Unreachable,
                        onward_us: None,
                    }
                }
            }
        }
    }

    /// Every route in config order with its candidates, for `GET /routes`
    /// and `ctl routes`. Single-candidate routes are shown with what
    /// their legs measured; they are not probed and never change.
    pub fn snapshot(&self, inputs: &Inputs<'_>) -> RoutesView {
        let view = |r: &RoutePath, probed: bool| {
            let s = r.state.lock().expect("paths lock");
            RouteView {
                index: r.index,
                dst: r.dst.to_string(),
                chosen: self.name_of(&r.candidates[s.current]),
                probed,
                flips: s.flips,
                changed_s_ago: s.changed_at.map(|t| t.elapsed().as_secs_f64()),
                candidates: r
                    .candidates
                    .iter()
                    .map(|c| self.candidate_view(inputs, r, c, &s))
                    .collect(),
            }
        };
        let mut routes: Vec<&RoutePath> = self.routes.values().collect();
        routes.sort_by_key(|r| r.index);
        RoutesView {
            hold_s: HOLD.as_secs(),
            probe_every_s: PROBE_EVERY.as_secs_f64(),
            routes: routes
                .into_iter()
                .map(|r| view(r, r.candidates.len() > 1))
                .collect(),
        }
    }

    fn candidate_view(
        &self,
        inputs: &Inputs<'_>,
        r: &RoutePath,
        c: &Via,
        s: &ChoiceState,
    ) -> CandidateView {
        let est = self.estimate(inputs, r, c, s);
        let state = match est {
            Estimate::Down => "down",
            Estimate::Unknown => "unknown",
            Estimate::Us(_) => "up",
        }
        .to_owned();
        let estimate_ms = match est {
            Estimate::Us(v) => Some(f64::from(v) / 1000.0),
            _ => None,
        };
        match c {
            Via::Direct => CandidateView {
                name: "direct".into(),
                state: state.clone(),
                estimate_ms,
                leg_rtt_ms: s.direct_rtt_us.map(|v| f64::from(v) / 1000.0),
                onward_ms: None,
                retrans_per_leg: None,
                loss: s.direct_loss.fraction(),
                probes: s.direct_probes,
                down_reason: s.direct_down.as_ref().map(|(_, why)| why.clone()),
                // Filled by the admin handler, which reads the kernel's maps.
                learned_window: None,
            },
            Via::Peer(i) => {
                let p = self.peer(*i);
                let pool_error = inputs.pools[*i].as_ref().and_then(|p| p.last_error());
                CandidateView {
                    name: self.peers[*i].name.clone(),
                    state,
                    estimate_ms,
                    leg_rtt_ms: p.rtt_us.map(|v| f64::from(v) / 1000.0),
                    onward_ms: match p.onward.get(&r.dst) {
                        Some(Ok(Some(v))) => Some(f64::from(*v) / 1000.0),
                        _ => None,
                    },
                    retrans_per_leg: (p.samples > 0).then(|| p.retrans as f64 / p.samples as f64),
                    loss: p.loss.fraction(),
                    probes: p.probes,
                    down_reason: p
                        .down
                        .as_ref()
                        .map(|(_, why)| why.clone())
                        .or(pool_error.map(|e| format!("pool refill: {e}")))
                        .or_else(|| match p.onward.get(&r.dst) {
                            Some(Err(status)) => {
                                Some(format!("reports {} for this route", status.label()))
                            }
                            _ => None,
                        }),
                    learned_window: None,
                }
            }
        }
    }
}

/// The destination to probe `direct` with on route `r`, if due: direct is
/// a candidate but not the choice (then its own legs measure it), a
/// destination is known, and no probe is in flight.
fn direct_probe_due(r: &RoutePath) -> Option<SocketAddr> {
    let at = r.candidates.iter().position(|c| *c == Via::Direct)?;
    let mut s = r.state.lock().expect("paths lock");
    if r.candidates.len() < 2 || s.current == at || s.probing_direct {
        return None;
    }
    let dst = s.last_dst?;
    s.probing_direct = true;
    Some(dst)
}

#[cfg(test)]
mod tests {
    use super::Estimate::{Down, Unknown, Us};
    use super::*;

    #[test]
    fn a_down_candidate_is_left_at_once_even_when_held() {
        assert_eq!(decide(&[Down, Us(5_000), Us(3_000)], 0, true), Some(2));
        // Nothing measured elsewhere: the next one up in config order.
        assert_eq!(decide(&[Down, Down, Unknown], 0, true), Some(2));
        // Everything down: stay (the connection fails, counted).
        assert_eq!(decide(&[Down, Down], 0, false), None);
    }

    #[test]
    fn a_better_candidate_needs_a_clear_gain_and_no_recent_change() {
        // 100 ms better: move, unless held.
        assert_eq!(decide(&[Us(150_000), Us(50_000)], 0, false), Some(1));
        assert_eq!(decide(&[Us(150_000), Us(50_000)], 0, true), None);
        // Jitter between equal paths: under 10 % or under 1 ms, stay.
        assert_eq!(decide(&[Us(50_000), Us(46_000)], 0, false), None);
        assert_eq!(decide(&[Us(900), Us(100)], 0, false), None);
        // The current one unmeasured: stay where config order put us.
        assert_eq!(decide(&[Unknown, Us(100)], 0, false), None);
        // Already on the best.
        assert_eq!(decide(&[Us(10_000), Us(50_000)], 0, false), None);
    }

    #[test]
    fn loss_adds_the_expected_retransmission_cost() {
        assert_eq!(with_loss(40_000, None), 40_000);
        assert_eq!(with_loss(40_000, Some(0.0)), 40_000);
        // 5 %: 4 x 0.05 x (200 + 40) ms = 48 ms more.
        assert_eq!(with_loss(40_000, Some(0.05)), 88_000);
        // A lossy short leg loses to a clean longer one.
        let est = [Us(with_loss(10_000, Some(0.05))), Us(30_000)];
        assert_eq!(decide(&est, 0, false), Some(1));
        let mut l = Loss::default();
        assert_eq!(l.fraction(), None);
        let info = |retrans, segs| splitway_sys::sock::TcpInfo {
            total_retrans: retrans,
            data_segs_out: segs,
            ..Default::default()
        };
        l.add(&info(1, 9));
        assert_eq!(l.fraction(), Some(0.1));
        // Older samples fade.
        for _ in 0..50 {
            l.add(&info(0, 9));
        }
        assert!(l.fraction().is_some_and(|f| f < 0.001));
    }

    #[test]
    fn only_failures_before_the_peer_could_act_are_retried() {
        let io = |op| ConnError::PeerIo {
            peer: "rs1".into(),
            op,
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(retryable(&io("connect")));
        assert!(retryable(&io("send header on pooled connection")));
        assert!(!retryable(&io("read")));
        assert!(retryable(&ConnError::PeerTimeout {
            peer: "rs1".into(),
            during: "connecting"
        }));
        assert!(!retryable(&ConnError::PeerTimeout {
            peer: "rs1".into(),
            during: "waiting for its proof"
        }));
        assert!(!retryable(&ConnError::TtlExceeded));
    }

    #[test]
    fn smoothing_halves_towards_each_sample() {
        assert_eq!(smooth(None, 1000), 1000);
        assert_eq!(smooth(Some(1000), 101_000), 51_000);
        assert_eq!(smooth(Some(u32::MAX), u32::MAX), u32::MAX);
    }
}
