//! The room's metrics: `splitway_strict_syn_total{outcome}`, one count for
//! each client SYN strict mode held, declared in the relay's registry at
//! bind ([`StrictMetrics::register`]).

use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::EnumCounter;

label_enum! {
    label "outcome";
    /// What strict mode did with a client SYN it held (NFQUEUE verdicts).
    pub enum StrictOutcome {
        /// The next leg reached the server: the SYN went on to the listener.
        Released => "released",
        /// The server (or a downstream relay's server) refused: reset.
        Refused => "refused",
        /// Our or a downstream relay's policy refused the destination: reset.
        Denied => "denied",
        /// The next leg timed out: the SYN was dropped.
        Timeout => "timeout",
        /// The server or a relay was unreachable: the SYN was dropped.
        Unreachable => "unreachable",
        /// A retransmitted SYN whose first copy is still held: dropped.
        Duplicate => "duplicate",
        /// A retransmitted SYN of a connection already released: let through.
        Retransmit => "retransmit",
        /// Beyond the pending-SYN budget (a flood): dropped.
        OverBudget => "over_budget",
        /// Not a TCP packet we could read: let through.
        Unparsed => "unparsed",
    }
}

/// The `strict_syn_total` series. `Default` counts into series no
/// registry exports (tests).
#[derive(Clone, Debug, Default)]
pub struct StrictMetrics(EnumCounter<StrictOutcome>);

impl StrictMetrics {
    /// Declares the family in `registry` (the relay's, under `splitway_`),
    /// every value at zero.
    pub fn register(registry: &mut Registry) -> Self {
        StrictMetrics(EnumCounter::register(
            registry,
            "strict_syn",
            "Client SYNs held by strict mode, by verdict",
        ))
    }

    /// Counts one verdict.
    pub fn count(&self, outcome: StrictOutcome) {
        self.0.inc(outcome);
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
        let room = StrictMetrics::register(builder.registry());
        room.count(StrictOutcome::Released);
        assert_eq!(room.0.get(StrictOutcome::Released), 1);
        let text = builder.build().encode();
        assert_eq!(
            missing_lines::<StrictOutcome>(
                &text,
                "strict_syn",
                "Client SYNs held by strict mode, by verdict"
            ),
            Vec::<String>::new()
        );
        assert!(
            text.contains("splitway_strict_syn_total{outcome=\"released\"} 1\n"),
            "{text}"
        );
    }
}
