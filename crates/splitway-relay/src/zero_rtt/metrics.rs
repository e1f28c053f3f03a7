//! The room's metrics: `splitway_zero_rtt_total{outcome}`, counted on both
//! ends of a peer leg (the dialer's Hello, the acceptor's window and
//! Confirm); declared in the relay's registry at bind
//! ([`ZeroRttMetrics::register`]).

use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::EnumCounter;

label_enum! {
    label "outcome";
    /// What became of a 0-RTT peer Hello (`[accel] zero_rtt`), on either end.
    pub enum ZeroRttOutcome {
        /// Dialer: the Hello went out in the SYN or right after the handshake.
        Sent => "sent",
        /// Dialer: the peer refused the Hello (stale, full, or no 0-RTT
        /// there); the leg was redialed with the challenge handshake.
        Fallback => "fallback",
        /// Acceptor: verified and fresh; the next leg started.
        Accepted => "accepted",
        /// Acceptor: outside the time window or older than this process.
        Stale => "stale",
        /// Acceptor: a nonce seen before (a replayed SYN).
        Replay => "replay",
        /// Acceptor: the replay window was full.
        Full => "full",
        /// Acceptor: refused because other processes share the peer port
        /// and no host-wide strike register is available.
        Unshared => "unshared",
        /// Acceptor: an accepted Hello's Confirm was missing or wrong (a
        /// replay that got past the register); nothing was forwarded
        /// beyond the bytes its MAC covers.
        Unconfirmed => "unconfirmed",
    }
}

/// The `zero_rtt_total` series (handles into the registry), kept in
/// `rooms::Rooms`; a clone (one reference count) rides each accepted Hello
/// until its Confirm. `Default` counts into series no registry exports
/// (tests).
#[derive(Clone, Debug, Default)]
pub struct ZeroRttMetrics(EnumCounter<ZeroRttOutcome>);

impl ZeroRttMetrics {
    /// Declares the family in `registry` (the relay's, under `splitway_`),
    /// every outcome at zero.
    pub fn register(registry: &mut Registry) -> Self {
        ZeroRttMetrics(EnumCounter::register(
            registry,
            "zero_rtt",
            "0-RTT peer Hellos, by outcome (dialer and acceptor side)",
        ))
    }

    /// Counts one Hello's outcome.
    pub fn count(&self, outcome: ZeroRttOutcome) {
        self.0.inc(outcome);
    }

    /// `zero_rtt_total{outcome}` so far.
    pub fn get(&self, outcome: ZeroRttOutcome) -> u64 {
        self.0.get(outcome)
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;
    use splitway_control::metrics::kit::missing_lines;

    use super::*;

    /// Name, type and help byte for byte (dashboards and the integration
    /// tests read them), every outcome exported at zero.
    #[test]
    fn declared_in_the_relays_registry_under_its_name() {
        let mut builder = Metrics::builder();
        let room = ZeroRttMetrics::register(builder.registry());
        room.count(ZeroRttOutcome::Replay);
        assert_eq!(room.get(ZeroRttOutcome::Replay), 1);
        let text = builder.build().encode();
        let help = "0-RTT peer Hellos, by outcome (dialer and acceptor side)";
        assert_eq!(
            missing_lines::<ZeroRttOutcome>(&text, "zero_rtt", help),
            Vec::<String>::new()
        );
        assert!(text.contains("splitway_zero_rtt_total{outcome=\"replay\"} 1\n"));
    }
}
