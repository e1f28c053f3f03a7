//! Learned windows (issue #29): relay legs run `splitway_resume`, which
//! starts each leg at the bandwidth-delay product earlier legs to the same
//! peer measured (bpf/splitway_resume.c, docs/congestion.md).
//!
//! The room holds what the relay adds around the kernel's algorithm: the
//! answering end of a window probe (the dialing end, which runs on the
//! relay's snapshot, is `probe::window_probe_loop`), the probe filler both
//! ends send, what the algorithm saved for `/status` and `ctl`, and the
//! room's metrics, and which legs run it: relay legs whose config names no
//! congestion control (`fill_learned_window`, `learn_windows`). The
//! algorithm's name is the config's (`LEARNED_WINDOW_CC`), its
//! registration `congestion`'s. Its status line is [`plan`]'s.

mod metrics;
pub mod plan;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use splitway_api as api;
use tokio::net::TcpStream;
use tracing::{debug, warn};

use crate::Config;
use crate::config::LEARNED_WINDOW_CC;
use crate::congestion;
use crate::leg_io::LegIo;
use crate::peer;

pub use metrics::{LearnedWindowEvent, LearnedWindowMetrics, WindowProbe, WindowProbeMetrics};

/// Bytes each end of a window probe sends. Slow start's largest flight on
/// them is about 1,450 segments, so the BDP a user connection resumes at
/// covers a relay leg of about that (100 Mbit/s × 170 ms, or measured
/// 1,048 and 1,095 of a GEO hop's 1,450) from the first connection; user
/// transfers raise it from there. Refreshed every
/// `probe::WINDOW_PROBE_EVERY` while the peer carries traffic: 62 kbit/s
/// each way per peer.
pub const WINDOW_PROBE_BYTES: u64 = 4 << 20;
/// One probe, both directions, at most.
pub const WINDOW_PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// A downstream relay answers one window probe per upstream address per
/// this much time: an authenticated peer cannot make it send filler at will.
const WINDOW_PROBE_MIN_GAP: Duration = Duration::from_secs(30);
/// Upstream relays are few; a full table of answered probes starts over.
const ANSWERED_MAX: usize = 1024;

/// Gives every relay leg whose config names no congestion control the
/// learned-window algorithm: legs dialed to each `[[peer]]`, and legs
/// accepted from upstream relays (`[upstream]`) when a peer listener
/// exists. Client and server legs face hosts we do not control and keep
/// the kernel's behaviour. Returns the keys it filled, in file order.
pub fn fill_learned_window(cfg: &mut Config) -> Vec<String> {
    let mut filled = Vec::new();
    for (i, p) in cfg.peers.iter_mut().enumerate() {
        if p.tuning.congestion.is_none() {
            p.tuning.congestion = Some(LEARNED_WINDOW_CC.to_owned());
            filled.push(format!("peer[{i}].congestion"));
        }
    }
    let accepts_relays = cfg.listeners.iter().any(|l| l.mode.accepts_relays());
    if accepts_relays && cfg.upstream.congestion.is_none() {
        cfg.upstream.congestion = Some(LEARNED_WINDOW_CC.to_owned());
        filled.push("upstream.congestion".to_owned());
    }
    filled
}

/// Gives relay legs that name no congestion control the learned-window
/// algorithm once `register` accepts it (`--check`: [`congestion::probe`];
/// the relay's start runs the two halves, [`wants_learned_window`] and
/// [`learned`], around its registration thread, `congestion::Registering`).
/// If it cannot be registered, `cfg` is left as it was: the
/// legs keep the kernel's default, and the reason goes to `--check`,
/// `/status` and `accel_state`. The keys it filled, or why not.
pub fn learn_windows(
    cfg: &mut Config,
    register: fn(&str) -> Result<(), splitway_sys::cc::CcError>,
) -> Result<Vec<String>, String> {
    if !wants_learned_window(cfg) {
        return Ok(Vec::new());
    }
    learned(cfg, register(LEARNED_WINDOW_CC))
}

/// Whether some relay leg would run the learned-window algorithm: the
/// relay registers it first, on the thread that registers the others.
pub fn wants_learned_window(cfg: &Config) -> bool {
    !fill_learned_window(&mut cfg.clone()).is_empty()
}

/// [`learn_windows`]'s second half, once the algorithm's registration is
/// known: `cfg`'s legs get it, or the reason it could not be registered
/// is returned and `cfg` is left as it was.
pub fn learned(
    cfg: &mut Config,
    registered: Result<(), splitway_sys::cc::CcError>,
) -> Result<Vec<String>, String> {
    registered.map_err(|e| e.to_string())?;
    Ok(fill_learned_window(cfg))
}

/// The room's state: its metrics' handles and the answered probes' times.
#[derive(Debug)]
pub struct LearnedWindows {
    events: LearnedWindowMetrics,
    probes: WindowProbeMetrics,
    answered: Mutex<HashMap<IpAddr, Instant>>,
}

impl LearnedWindows {
    pub fn new(events: LearnedWindowMetrics, probes: WindowProbeMetrics) -> Self {
        LearnedWindows {
            events,
            probes,
            answered: Mutex::default(),
        }
    }

    /// Counts a window probe's outcome (either end).
    pub fn count_probe(&self, outcome: WindowProbe) {
        self.probes.count(outcome);
    }

    /// What `splitway_resume` learned and did (host-wide), for `/status`,
    /// `ctl routes` and the metrics; `None` when this process does not use
    /// it (nothing registered under that name here) or its maps cannot be
    /// read. `cfg`'s peers name the addresses they own.
    pub fn status(cfg: &Config) -> Option<api::LearnedWindows> {
        if !congestion::registered_here(LEARNED_WINDOW_CC) {
            return None;
        }
        let state = match splitway_sys::bpf::resume_state::read() {
            Ok(state) => state?,
            Err(e) => {
                warn_unreadable(&e);
                return None;
            }
        };
        let events = state.events;
        Some(api::LearnedWindows {
            events: api::LearnedWindowEvents {
                jumps: events.jumps,
                rtt_mismatches: events.rtt_mismatches,
                validated: events.validated,
                retreats: events.retreats,
                saved: events.saved,
            },
            peers: state
                .windows
                .iter()
                .map(|w| api::LearnedWindow {
                    addr: w.peer.to_string(),
                    peer: cfg
                        .peers
                        .iter()
                        .find(|p| p.addr.ip() == w.peer)
                        .map(|p| p.name.clone()),
                    cwnd_segments: u64::from(w.cwnd_segments),
                    bdp_segments: u64::from(w.bdp_segments),
                    jump_segments: u64::from(w.jump_segments()),
                    min_rtt_ms: w.min_rtt.as_secs_f64() * 1e3,
                    age_s: w.age.as_secs_f64(),
                    capacity_estimate: w.capacity_estimate,
                    current: w.is_current(),
                })
                .collect(),
        })
    }

    /// Copies the host's learned-window counters into the room's series
    /// (before a scrape).
    pub fn observe(&self, cfg: &Config) {
        let Some(learned) = Self::status(cfg) else {
            return;
        };
        let e = &learned.events;
        let current = learned.peers.iter().filter(|p| p.current).count() as u64;
        self.events.observe(
            [e.jumps, e.rtt_mismatches, e.validated, e.retreats, e.saved],
            current,
        );
    }

    /// Answers a window-probe header on an accepted peer leg: takes the
    /// 0-RTT Confirm if one is owed (a replayed Hello gets nothing), then
    /// reads the upstream relay's filler while sending its own, and closes.
    /// Nothing is dialed. One probe per upstream address per 30 s.
    pub async fn answer(
        &self,
        stream: &TcpStream,
        accepted: peer::Accepted,
        upstream: IpAddr,
        handshake: Duration,
        metrics: &Metrics,
    ) {
        if !self.admit(upstream) {
            debug!(%upstream, "window probe refused: one per 30 s per upstream relay");
            self.count_probe(WindowProbe::Refused);
            return;
        }
        let already = match accepted.unconfirmed {
            Some(u) => match u.confirm(stream, handshake, metrics).await {
                Ok(after) => after.len(),
                Err(e) => {
                    debug!(%upstream, error = %e, "window probe without its 0-RTT confirm");
                    self.count_probe(WindowProbe::Refused);
                    return;
                }
            },
            None => accepted.early_data.len(),
        };
        let io = LegIo::new(stream, accepted.tls.as_ref());
        // Its own filler at once, beside the upstream relay's: the probe
        // takes one direction's time, not two (measured on the GEO
        // scenario: about 11 s in turn, longer than the lab's first
        // downloads).
        let exchange = async {
            let (received, sent) = tokio::join!(read_filler(io, already as u64), send_filler(io));
            sent?;
            received
        };
        let outcome = tokio::time::timeout(WINDOW_PROBE_TIMEOUT, exchange).await;
        self.count_probe(match outcome {
            Ok(Ok(_)) => WindowProbe::Answered,
            _ => WindowProbe::Refused,
        });
        match outcome {
            Ok(Ok(received)) => debug!(%upstream, received, "window probe answered"),
            Ok(Err(e)) => debug!(%upstream, error = %e, "window probe not answered"),
            Err(_) => debug!(%upstream, "window probe timed out"),
        }
    }

    /// Whether `upstream` may have a probe answered now; records it if so.
    fn admit(&self, upstream: IpAddr) -> bool {
        let mut answered = self
            .answered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if answered
            .get(&upstream)
            .is_some_and(|at| at.elapsed() < WINDOW_PROBE_MIN_GAP)
        {
            return false;
        }
        if answered.len() >= ANSWERED_MAX {
            answered.clear();
        }
        answered.insert(upstream, Instant::now());
        true
    }
}

/// Says once per process that the maps could not be read: a scrape a
/// minute must not repeat it.
fn warn_unreadable(error: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| warn!(error, "cannot read splitway_resume's learned windows"));
}

/// The filler a window probe sends, in writes of this size. A static, not
/// a local: a local buffer would live in the future of every accepted
/// peer connection's admission, which can answer a window probe.
static FILLER: [u8; 64 << 10] = [0; 64 << 10];

/// [`WINDOW_PROBE_BYTES`] of zeros, then the write side closed.
pub async fn send_filler(io: LegIo<'_>) -> std::io::Result<()> {
    let mut left = WINDOW_PROBE_BYTES;
    while left > 0 {
        let n = left.min(FILLER.len() as u64) as usize;
        io.write_all(&FILLER[..n]).await?;
        left -= n as u64;
    }
    io.shutdown_write().await
}

/// Reads and drops the other end's filler until its close; `already` bytes
/// of it were read before. More than the probe is an error, not a sink.
pub async fn read_filler(io: LegIo<'_>, already: u64) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut received = already;
    loop {
        let n = io.read(&mut buf).await?;
        if n == 0 {
            return Ok(received);
        }
        received += n as u64;
        if received > WINDOW_PROBE_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "window probe: more filler than a probe holds",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_gets_one_probe_answered_per_gap() {
        let room = LearnedWindows::new(
            LearnedWindowMetrics::register(&mut Default::default()),
            WindowProbeMetrics::register(&mut Default::default()),
        );
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(room.admit(a));
        assert!(!room.admit(a), "a second probe within 30 s is refused");
        assert!(room.admit(b), "another upstream has its own gap");
    }
}
