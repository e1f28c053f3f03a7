//! The room's metrics: `splitway_loss_isolation_total{event}`, declared in
//! the relay's registry at bind ([`LossIsolationMetrics::register`]) and
//! counted through [`super::LossyClients`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use splitway_control::label_enum;
use splitway_control::metrics::kit::{CounterU64, declare, series};

label_enum! {
    /// What loss isolation concluded or did.
    pub enum LossIsolationEvent {
        /// A client leg lost data without queueing: its client's next legs
        /// run the loss-tolerant algorithm.
        Lossy => "lossy",
        /// A client leg lost data while its RTT rose (a full queue): its
        /// client keeps, or returns to, the default algorithm.
        Congested => "congested",
        /// A client leg lost (almost) nothing: the client's next legs
        /// return to the default algorithm.
        Clean => "clean",
        /// A client leg started with the loss-tolerant algorithm.
        Applied => "applied",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LossIsolationLabels {
    event: LossIsolationEvent,
}

/// The `loss_isolation_total` series. `Default` counts into series no
/// registry exports (tests, a relay built without metrics).
#[derive(Clone, Debug, Default)]
pub struct LossIsolationMetrics {
    events: [CounterU64; LossIsolationEvent::COUNT],
}

impl LossIsolationMetrics {
    /// Declares the family in `registry` (the relay's, under `splitway_`),
    /// every event at zero.
    pub fn register(registry: &mut Registry) -> Self {
        let family: Family<LossIsolationLabels, CounterU64> = declare(
            registry,
            "loss_isolation",
            "Client legs judged by loss isolation, and legs started loss-tolerant, by event",
        );
        LossIsolationMetrics {
            events: series(&family, LossIsolationEvent::ALL, |event| {
                LossIsolationLabels { event }
            }),
        }
    }

    pub fn count(&self, event: LossIsolationEvent) {
        self.events[event.index()].inc();
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;

    use super::*;

    /// The family's name, type and help, byte for byte (dashboards and the
    /// integration tests read them), every event exported at zero, and a
    /// count seen in the relay's page.
    #[test]
    fn declared_in_the_relays_registry_under_its_name() {
        let mut builder = Metrics::builder();
        let room = LossIsolationMetrics::register(builder.registry());
        let metrics = builder.build();
        room.count(LossIsolationEvent::Lossy);
        let text = metrics.encode();
        for line in [
            "# HELP splitway_loss_isolation Client legs judged by loss isolation, and legs started loss-tolerant, by event.",
            "# TYPE splitway_loss_isolation counter",
            "splitway_loss_isolation_total{event=\"lossy\"} 1",
            "splitway_loss_isolation_total{event=\"congested\"} 0",
            "splitway_loss_isolation_total{event=\"clean\"} 0",
            "splitway_loss_isolation_total{event=\"applied\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
        // The crate's own families are still there.
        assert!(text.contains("# TYPE splitway_connections_accepted counter"));
    }
}
