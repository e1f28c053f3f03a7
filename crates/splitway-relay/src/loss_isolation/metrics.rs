//! The room's metrics: `splitway_loss_isolation_total{event}`, declared in
//! the relay's registry at bind ([`LossIsolationMetrics::register`]) and
//! counted through [`super::LossyClients`].

use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::EnumCounter;

label_enum! {
    label "event";
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

/// The `loss_isolation_total` series. `Default` counts into series no
/// registry exports (tests, a relay built without metrics).
#[derive(Clone, Debug, Default)]
pub struct LossIsolationMetrics(EnumCounter<LossIsolationEvent>);

impl LossIsolationMetrics {
    /// Declares the family in `registry` (the relay's, under `splitway_`),
    /// every value at zero.
    pub fn register(registry: &mut Registry) -> Self {
        LossIsolationMetrics(EnumCounter::register(
            registry,
            "loss_isolation",
            "Client legs judged by loss isolation, and legs started loss-tolerant, by event",
        ))
    }

    /// Counts one event.
    pub fn count(&self, event: LossIsolationEvent) {
        self.0.inc(event);
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
        let room = LossIsolationMetrics::register(builder.registry());
        room.count(LossIsolationEvent::Lossy);
        assert_eq!(room.0.get(LossIsolationEvent::Lossy), 1);
        let text = builder.build().encode();
        assert_eq!(
            missing_lines::<LossIsolationEvent>(
                &text,
                "loss_isolation",
                "Client legs judged by loss isolation, and legs started loss-tolerant, by event"
            ),
            Vec::<String>::new()
        );
        assert!(
            text.contains("splitway_loss_isolation_total{event=\"lossy\"} 1\n"),
            "{text}"
        );
    }
}
