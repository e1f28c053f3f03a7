//! `loss_isolation_total`: counted by the relay's loss isolation
//! (`splitway-relay`'s `loss_isolation`), which judges each finished client
//! leg and picks the next ones' congestion control.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::family::{CounterU64, declare, label_enum, series};

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

/// The `loss_isolation_total` series.
#[derive(Clone, Debug)]
pub struct LossIsolationMetrics {
    events: [CounterU64; LossIsolationEvent::COUNT],
}

impl LossIsolationMetrics {
    /// Declares the family in `registry`, every event at zero.
    pub(crate) fn register(registry: &mut Registry) -> Self {
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
