//! Loss isolation by default (`[accel] loss_isolation`, issue #29 item 3):
//! the acceleration's room.
//!
//! A client leg whose path loses data without queueing (a radio or
//! satellite last mile) runs the kernel's default algorithm, which halves
//! its window at every random loss: the leg collapses although the relay
//! already confines the loss to it. Each client leg is judged from its
//! TCP_INFO; a client (an IPv4 address, an IPv6 /64) judged lossy gets
//! [`LOSS_TOLERANT_CC`] on its next legs until one of them says otherwise:
//! clean (almost no loss), or congested (loss while the RTT rose above its
//! minimum: a full queue, where a loss-based algorithm is the fair one).
//!
//! The room holds:
//! - [`config`]: its `[accel]` key, resolved (`auto`: on where client legs
//!   run the kernel's default);
//! - [`verdict`]: the judging, sans-IO;
//! - [`LossyClients`]: what the relay remembers per client;
//! - [`hooks`]: what it does to a connection: at accept, while it forwards,
//!   at its end;
//! - [`metrics`]: `splitway_loss_isolation_total{event}`, declared in the
//!   relay's registry at bind and counted through [`LossyClients`];
//! - [`plan`]: its status line.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::policy::source_host;

pub mod config;
pub mod hooks;
pub mod metrics;
pub mod plan;
pub mod verdict;

pub use metrics::{LossIsolationEvent, LossIsolationMetrics};

pub use verdict::{Since, StartUp, Verdict, judge, judge_early};

/// The congestion control a lossy client's legs run: a model-based
/// algorithm that random loss does not slow.
pub const LOSS_TOLERANT_CC: &str = "bbr";

/// How long a lossy verdict holds without a new leg to confirm it.
const MEMORY: Duration = Duration::from_secs(600);
/// Clients remembered at once; beyond, new verdicts are dropped.
const MAX_CLIENTS: usize = 4096;

/// The clients judged lossy, and since when; the room's counters.
#[derive(Default)]
pub struct LossyClients {
    since: Mutex<HashMap<IpAddr, Instant>>,
    metrics: LossIsolationMetrics,
}

impl LossyClients {
    /// No client known yet, counting into `metrics`.
    pub fn new(metrics: LossIsolationMetrics) -> Self {
        LossyClients {
            since: Mutex::default(),
            metrics,
        }
    }

    /// Counts `event` in `splitway_loss_isolation_total`.
    pub fn count(&self, event: LossIsolationEvent) {
        self.metrics.count(event);
    }

    /// Records what a leg of `client` said at `now`.
    pub fn learn(&self, client: IpAddr, verdict: Verdict, now: Instant) {
        let key = source_host(client);
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        match verdict {
            Verdict::Lossy => {
                if since.len() >= MAX_CLIENTS && !since.contains_key(&key) {
                    since.retain(|_, at| now.saturating_duration_since(*at) < MEMORY);
                    if since.len() >= MAX_CLIENTS {
                        return;
                    }
                }
                since.insert(key, now);
            }
            Verdict::Congested | Verdict::Clean => {
                since.remove(&key);
            }
            Verdict::Unsure => {}
        }
    }

    /// Whether `client`'s next leg should run [`LOSS_TOLERANT_CC`].
    pub fn is_lossy(&self, client: IpAddr, now: Instant) -> bool {
        let since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since
            .get(&source_host(client))
            .is_some_and(|at| now.saturating_duration_since(*at) < MEMORY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lossy_client_is_remembered_until_a_leg_says_otherwise() {
        let clients = LossyClients::default();
        let now = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        clients.learn(a, Verdict::Lossy, now);
        assert!(clients.is_lossy(a, now));
        assert!(!clients.is_lossy(b, now), "per client address");
        clients.learn(a, Verdict::Unsure, now);
        assert!(clients.is_lossy(a, now));
        assert!(!clients.is_lossy(a, now + MEMORY), "forgotten");
        clients.learn(a, Verdict::Congested, now);
        assert!(!clients.is_lossy(a, now), "congestion: back to fair");
        clients.learn(a, Verdict::Lossy, now);
        clients.learn(a, Verdict::Clean, now);
        assert!(!clients.is_lossy(a, now));
        // An IPv6 client counts with its /64.
        clients.learn("2001:db8::1".parse().unwrap(), Verdict::Lossy, now);
        assert!(clients.is_lossy("2001:db8::2".parse().unwrap(), now));
    }
}
