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
use splitway_control::metrics::Metrics;
use splitway_proto::header::{ProbeAnswer, ReplyStatus};
use tokio::net::TcpStream;
use tracing::{debug, info};

use crate::config::{Config, Route, Via};
use crate::error::ConnError;
use crate::pool::PeerPool;
use crate::route::RouteTable;

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

#[derive(Debug, Default)]
struct PeerState {
    /// Smoothed RTT of our legs to the peer, microseconds.
    rtt_us: Option<u32>,
    samples: u64,
    /// Retransmits seen on sampled legs (TCP_INFO `total_retrans`).
    retrans: u64,
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
}

struct RoutePath {
    /// Index in config order: the metric label.
    index: usize,
    dst: IpNet,
    candidates: Vec<Via>,
    state: Mutex<ChoiceState>,
}

/// What a choice reads besides its own measurements: the routes, each
/// peer's pool (a failing refill marks the peer down) and the metrics it
/// counts choices in.
pub struct Inputs<'a> {
    pub routes: &'a RouteTable,
    pub pools: &'a [Option<Arc<PeerPool>>],
    pub metrics: &'a Metrics,
}

/// Path state of one config generation (a reload starts afresh).
pub struct Paths {
    peers: Vec<PeerPath>,
    /// Route prefixes each peer is a candidate of (probe destinations).
    targets: Vec<Vec<IpNet>>,
    routes: HashMap<IpNet, RoutePath>,
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
    pub fn new(cfg: &Config) -> Paths {
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
        }
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
        debug!(peer = %self.peers[i].name, route = %target, ?onward, rtt_us = ?p.rtt_us, "probe answered");
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
        if let Ok(info) = splitway_sys::sock::tcp_info(stream)
            && info.rtt_us > 0
        {
            let mut s = r.state.lock().expect("paths lock");
            s.direct_rtt_us = Some(smooth(s.direct_rtt_us, info.rtt_us));
        }
    }

    fn estimate(&self, inputs: &Inputs<'_>, r: &RoutePath, c: &Via, s: &ChoiceState) -> Estimate {
        match c {
            Via::Direct => s.direct_rtt_us.map_or(Estimate::Unknown, Estimate::Us),
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
                    Estimate::Us(rtt.saturating_add(onward))
                })
            }
        }
    }

    /// The hop a new connection on `route` takes (and counts it).
    pub fn choose(&self, inputs: &Inputs<'_>, route: &Route) -> Via {
        let Some(r) = self
            .routes
            .get(&route.dst)
            .filter(|r| r.candidates.len() > 1)
        else {
            return route.via.clone();
        };
        let mut s = r.state.lock().expect("paths lock");
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
            inputs.metrics.paths().flip(r.index, failure);
            info!(route = %r.dst, from = %self.name_of(&r.candidates[cur]), to = %self.name_of(&r.candidates[j]), cause = if failure { "failure" } else { "better" }, "path changed");
        }
        let via = r.candidates[s.current].clone();
        inputs.metrics.paths().choice(r.index, &self.name_of(&via));
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
                probes: 0,
                down_reason: None,
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
                }
            }
        }
    }
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
    fn smoothing_halves_towards_each_sample() {
        assert_eq!(smooth(None, 1000), 1000);
        assert_eq!(smooth(Some(1000), 101_000), 51_000);
        assert_eq!(smooth(Some(u32::MAX), u32::MAX), u32::MAX);
    }
}
