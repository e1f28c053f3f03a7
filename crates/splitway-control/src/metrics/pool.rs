//! `pool_events_total` and `pool_level`: counted by each peer's connection
//! pool (`splitway-relay`'s `pool`), which also reads its counts back for
//! `/status`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::family::{CounterU64, declare, series};
use super::peer::PeerLabels;

label_enum! {
    /// What happened to a peer's connection pool.
    pub enum PoolEvent {
        /// A pooled connection was taken for a split connection.
        Taken => "taken",
        /// A new authenticated connection joined the pool.
        Refilled => "refilled",
        /// A pooled connection was found dead and discarded.
        Dead => "dead",
        /// A pooled connection reached its idle lifetime and was closed.
        Expired => "expired",
        /// The pool was empty when a connection was needed.
        Miss => "miss",
        /// A refill dial or its authentication failed.
        DialFailure => "dial_failure",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolEventLabels {
    peer: String,
    event: PoolEvent,
}

/// The two pool families; `peer` is a configured peer name.
#[derive(Clone, Debug)]
pub(crate) struct PoolFamilies {
    events: Family<PoolEventLabels, CounterU64>,
    level: Family<PeerLabels, Gauge>,
}

impl PoolFamilies {
    /// Declares both families in `registry` (series appear per peer, with
    /// [`PoolFamilies::for_peer`]).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let events: Family<PoolEventLabels, CounterU64> = declare(
            registry,
            "pool_events",
            "Connection pool events, by peer name and event",
        );
        let level: Family<PeerLabels, Gauge> = declare(
            registry,
            "pool_level",
            "Idle authenticated connections in each peer's pool",
        );
        PoolFamilies { events, level }
    }

    /// Counts `n` events of the configured peer `peer`.
    pub(crate) fn event(&self, peer: &str, event: PoolEvent, n: u64) {
        self.events
            .get_or_create(&PoolEventLabels {
                peer: peer.to_owned(),
                event,
            })
            .inc_by(n);
    }

    /// Sets the pool level of the configured peer `peer`.
    pub(crate) fn set_level(&self, peer: &str, level: usize) {
        self.level
            .get_or_create(&PeerLabels {
                peer: peer.to_owned(),
            })
            .set(level as i64);
    }

    /// The series of the configured peer `peer`, created now (at zero).
    pub(crate) fn for_peer(&self, peer: &str) -> PoolMetrics {
        PoolMetrics {
            events: series(&self.events, PoolEvent::ALL, |event| PoolEventLabels {
                peer: peer.to_owned(),
                event,
            }),
            level: self
                .level
                .get_or_create(&PeerLabels {
                    peer: peer.to_owned(),
                })
                .clone(),
        }
    }
}

/// One peer's `pool_events_total` and `pool_level` series (handles into the
/// registry): an update is one atomic operation, no label lookup or lock.
#[derive(Clone, Debug)]
pub struct PoolMetrics {
    events: [CounterU64; PoolEvent::COUNT],
    level: Gauge,
}

impl PoolMetrics {
    /// Counts `n` pool events.
    pub fn event(&self, event: PoolEvent, n: u64) {
        if n > 0 {
            self.events[event.index()].inc_by(n);
        }
    }

    /// This peer's `pool_events_total{event}` so far (the `/status` pool
    /// counts read it: one source of truth).
    pub fn count(&self, event: PoolEvent) -> u64 {
        self.events[event.index()].get()
    }

    /// Sets the pool level gauge.
    pub fn level(&self, level: usize) {
        self.level.set(level as i64);
    }
}
