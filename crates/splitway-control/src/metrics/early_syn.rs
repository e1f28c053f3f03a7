//! `early_syn_total`: counted by the early-SYN table (`splitway-relay`'s
//! `early_syn`), which also reads the counts back for `/status`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::family::{CounterU64, declare, series};

label_enum! {
    /// What became of a client SYN seen by the early-SYN detector.
    pub enum EarlySynOutcome {
        /// The next leg was started at the SYN.
        Started => "started",
        /// The accepted connection found its early-started leg.
        Hit => "hit",
        /// The accepted connection found none; its leg started at accept.
        Miss => "miss",
        /// A retransmitted SYN whose leg was already started.
        Duplicate => "duplicate",
        /// Refused by the early-start budget (SYN flood protection).
        OverBudget => "over_budget",
        /// Refused by its client prefix's share of the budget (a flood
        /// from one prefix leaves the rest to other clients).
        PrefixOverBudget => "prefix_over_budget",
        /// The client never completed its handshake within a few of its
        /// prefix's handshake round trips (at most `early_syn_expiry`); the
        /// leg was closed.
        Expired => "expired",
        /// The client would be refused at accept (`allow_clients`,
        /// `[limits]`): no leg was started for its SYN.
        Denied => "denied",
        /// The client's prefix is near (its accepts follow its SYNs within
        /// 200 µs): the detector did not report this SYN, whose leg
        /// started at accept.
        Near => "near",
        /// An IPv6 packet whose TCP header lay behind extension headers
        /// the detector does not walk (AH, or more than four): a SYN among
        /// them had its leg started at accept.
        Ipv6Unwalked => "ipv6_unwalked",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EarlySynLabels {
    outcome: EarlySynOutcome,
}

/// The `early_syn_total` series (handles into the registry), held by the
/// early-SYN table that counts them; `/status` reads them back.
#[derive(Clone, Debug)]
pub struct EarlySynMetrics {
    outcomes: [CounterU64; EarlySynOutcome::COUNT],
}

impl EarlySynMetrics {
    /// Declares the family in `registry`, every outcome at zero.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let family: Family<EarlySynLabels, CounterU64> = declare(
            registry,
            "early_syn",
            "Client SYNs seen by the early-SYN detector, by outcome",
        );
        EarlySynMetrics {
            outcomes: series(&family, EarlySynOutcome::ALL, |outcome| EarlySynLabels {
                outcome,
            }),
        }
    }

    /// Counts `n` early-SYN outcomes.
    pub fn count(&self, outcome: EarlySynOutcome, n: u64) {
        if n > 0 {
            self.outcomes[outcome.index()].inc_by(n);
        }
    }

    /// `early_syn_total{outcome}` so far.
    pub fn get(&self, outcome: EarlySynOutcome) -> u64 {
        self.outcomes[outcome.index()].get()
    }
}
