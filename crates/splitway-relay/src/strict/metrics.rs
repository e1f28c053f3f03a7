//! The room's metrics: `splitway_strict_syn_total{outcome}`, one count for
//! each client SYN strict mode held, declared in the relay's registry at
//! bind ([`StrictMetrics::register`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::{CounterU64, declare, series};

label_enum! {
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StrictLabels {
    outcome: StrictOutcome,
}

/// The `strict_syn_total` series.
#[derive(Clone, Debug)]
pub struct StrictMetrics {
    outcomes: [CounterU64; StrictOutcome::COUNT],
}

impl StrictMetrics {
    /// Declares the family in `registry` (the relay's, under `splitway_`),
    /// every verdict at zero.
    pub fn register(registry: &mut Registry) -> Self {
        let family: Family<StrictLabels, CounterU64> = declare(
            registry,
            "strict_syn",
            "Client SYNs held by strict mode, by verdict",
        );
        StrictMetrics {
            outcomes: series(&family, StrictOutcome::ALL, |outcome| StrictLabels {
                outcome,
            }),
        }
    }

    /// Counts a strict-mode verdict.
    pub fn count(&self, outcome: StrictOutcome) {
        self.outcomes[outcome.index()].inc();
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;

    use super::*;

    /// Name, type and help byte for byte, every verdict exported at zero.
    #[test]
    fn declared_in_the_relays_registry_under_its_name() {
        let mut builder = Metrics::builder();
        let room = StrictMetrics::register(builder.registry());
        room.count(StrictOutcome::Released);
        let text = builder.build().encode();
        assert!(
            text.contains(
                "# HELP splitway_strict_syn Client SYNs held by strict mode, by verdict.\n"
            )
        );
        assert!(text.contains("# TYPE splitway_strict_syn counter\n"));
        assert!(text.contains("splitway_strict_syn_total{outcome=\"released\"} 1\n"));
        for outcome in StrictOutcome::ALL.iter().skip(1) {
            let zero = format!("splitway_strict_syn_total{{outcome=\"{outcome}\"}} 0\n");
            assert!(text.contains(&zero), "{zero}");
        }
    }
}
