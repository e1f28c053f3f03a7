//! The room's metrics: `splitway_early_syn_total{outcome}`, counted by the
//! early-SYN table, which also reads the counts back for `/status`;
//! declared in the relay's registry at bind ([`EarlySynMetrics::register`]).

use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::EnumCounter;

label_enum! {
    label "outcome";
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

/// The `early_syn_total` series (handles into the registry), held by the
/// early-SYN table that counts them; `/status` reads them back. `Default`
/// counts into series no registry exports (tests).
#[derive(Clone, Debug, Default)]
pub struct EarlySynMetrics(EnumCounter<EarlySynOutcome>);

impl EarlySynMetrics {
    /// Declares the family in `registry` (the relay's, under `splitway_`),
    /// every value at zero.
    pub fn register(registry: &mut Registry) -> Self {
        EarlySynMetrics(EnumCounter::register(
            registry,
            "early_syn",
            "Client SYNs seen by the early-SYN detector, by outcome",
        ))
    }

    /// Counts `n` early-SYN outcomes.
    pub fn count(&self, outcome: EarlySynOutcome, n: u64) {
        self.0.inc_by(outcome, n);
    }

    /// `early_syn_total{outcome}` so far.
    pub fn get(&self, outcome: EarlySynOutcome) -> u64 {
        self.0.get(outcome)
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;
    use splitway_control::metrics::kit::missing_lines;

    use super::*;

    /// Name, type and help byte for byte, every value exported at zero,
    /// and a count.
    #[test]
    fn declared_in_the_relays_registry_under_its_name() {
        let mut builder = Metrics::builder();
        let room = EarlySynMetrics::register(builder.registry());
        room.count(EarlySynOutcome::Hit, 3);
        assert_eq!(room.get(EarlySynOutcome::Hit), 3);
        let text = builder.build().encode();
        assert_eq!(
            missing_lines::<EarlySynOutcome>(
                &text,
                "early_syn",
                "Client SYNs seen by the early-SYN detector, by outcome"
            ),
            Vec::<String>::new()
        );
        assert!(
            text.contains("splitway_early_syn_total{outcome=\"hit\"} 3\n"),
            "{text}"
        );
    }
}
