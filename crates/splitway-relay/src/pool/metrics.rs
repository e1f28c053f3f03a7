//! The room's metrics: `splitway_pool_events_total{peer,event}` and
//! `splitway_pool_level{peer}`, counted by each peer's pool, which also
//! reads its counts back for `/status`; declared in the relay's registry at
//! bind, with each configured peer's series at zero.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::PeerLabels;
use splitway_control::label_enum;
use splitway_control::metrics::kit::{CounterU64, declare, series};

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
pub struct PoolFamilies {
    events: Family<PoolEventLabels, CounterU64>,
    level: Family<PeerLabels, Gauge>,
}

impl PoolFamilies {
    /// Declares both families in `registry` (series appear per peer, with
    /// [`PoolFamilies::for_peer`]).
    pub fn register(registry: &mut Registry) -> Self {
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

    /// Creates the configured peer `peer`'s series at zero, exported before
    /// its first event (and whether or not it has a pool).
    pub fn register_peer(&self, peer: &str) {
        let _series = self.for_peer(peer);
    }

    /// The series of the configured peer `peer`, created now (at zero).
    pub fn for_peer(&self, peer: &str) -> PoolMetrics {
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

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;

    use super::*;

    /// Names, types and help byte for byte; a peer's series at zero once
    /// asked for, and a count read back as `/status` reads it.
    #[test]
    fn declared_in_the_relays_registry_with_each_peers_series() {
        let mut builder = Metrics::builder();
        let families = PoolFamilies::register(builder.registry());
        let tokyo = families.for_peer("tokyo");
        tokyo.event(PoolEvent::Taken, 2);
        tokyo.level(3);
        assert_eq!(tokyo.count(PoolEvent::Taken), 2);
        let text = builder.build().encode();
        for line in [
            "# HELP splitway_pool_events Connection pool events, by peer name and event.\n",
            "# TYPE splitway_pool_events counter\n",
            "splitway_pool_events_total{peer=\"tokyo\",event=\"taken\"} 2\n",
            "splitway_pool_events_total{peer=\"tokyo\",event=\"miss\"} 0\n",
            "# HELP splitway_pool_level Idle authenticated connections in each peer's pool.\n",
            "# TYPE splitway_pool_level gauge\n",
            "splitway_pool_level{peer=\"tokyo\"} 3\n",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }
}
