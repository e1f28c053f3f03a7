//! The words every acceleration's status is told in (`AccelName`,
//! `AccelState`), below both `accel` and the rooms whose planners answer
//! in them, and `splitway_accel_state{accel, state}`, set by the relay's
//! bookkeeping ([`crate::accel::AccelStatus`]) whenever an acceleration
//! starts, stops or turns out unavailable. Declared in the relay's registry
//! at bind ([`AccelMetrics::register`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::{declare, series};

label_enum! {
    /// An acceleration whose effective state is exported.
    pub enum AccelName {
        EarlySyn => "early_syn",
        Strict => "strict",
        Pool => "pool",
        ZeroRtt => "zero_rtt",
        /// TCP Fast Open on the legs to and from peer relays.
        TfoPeer => "tfo_peer",
        /// TCP Fast Open accepted on client-facing listeners.
        TfoClient => "tfo_client",
        /// TCP Fast Open on direct legs to servers.
        TfoServer => "tfo_server",
        TurboStart => "turbo_start",
        /// Relay legs start from the window learned on the last ones.
        LearnedWindow => "learned_window",
        /// Client legs to clients whose path loses data without queueing
        /// run a loss-tolerant congestion control.
        LossIsolation => "loss_isolation",
    }
}

label_enum! {
    /// What an acceleration is doing right now.
    pub enum AccelState {
        /// Switched off (explicitly, or nothing to apply it to).
        Off => "off",
        /// Running.
        Active => "active",
        /// Asked for (or auto) but this host cannot run it; `ctl status`
        /// says why.
        Unavailable => "unavailable",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccelLabels {
    accel: AccelName,
    state: AccelState,
}

/// The `accel_state` gauges: 1 on each acceleration's current state.
#[derive(Clone, Debug)]
pub struct AccelMetrics {
    state: [[Gauge; AccelState::COUNT]; AccelName::COUNT],
}

impl AccelMetrics {
    /// Declares the family in `registry`, every acceleration off.
    pub fn register(registry: &mut Registry) -> Self {
        let family: Family<AccelLabels, Gauge> = declare(
            registry,
            "accel_state",
            "Effective state of each acceleration: 1 on the state it is in, 0 on the others",
        );
        AccelMetrics {
            state: AccelName::ALL.map(|accel| {
                let gauges = series(&family, AccelState::ALL, |state| AccelLabels {
                    accel,
                    state,
                });
                // Until the relay says otherwise, everything is off.
                gauges[AccelState::Off.index()].set(1);
                gauges
            }),
        }
    }

    /// Records the state `accel` is in now.
    pub fn set(&self, accel: AccelName, state: AccelState) {
        for (s, g) in AccelState::ALL.iter().zip(&self.state[accel.index()]) {
            g.set(i64::from(*s == state));
        }
    }

    /// The state last recorded for `accel`.
    pub fn get(&self, accel: AccelName) -> AccelState {
        AccelState::ALL
            .into_iter()
            .zip(&self.state[accel.index()])
            .find(|(_, g)| g.get() == 1)
            .map_or(AccelState::Off, |(s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;

    use super::*;

    /// Name, type and help byte for byte; every acceleration off until set.
    #[test]
    fn declared_in_the_relays_registry_under_its_name() {
        let mut builder = Metrics::builder();
        let accel = AccelMetrics::register(builder.registry());
        accel.set(AccelName::Pool, AccelState::Active);
        assert_eq!(accel.get(AccelName::Pool), AccelState::Active);
        assert_eq!(accel.get(AccelName::Strict), AccelState::Off);
        let text = builder.build().encode();
        assert!(text.contains(
            "# HELP splitway_accel_state Effective state of each acceleration: 1 on the state it is in, 0 on the others.\n"
        ));
        assert!(text.contains("# TYPE splitway_accel_state gauge\n"));
        assert!(text.contains("splitway_accel_state{accel=\"pool\",state=\"active\"} 1\n"));
        assert!(text.contains("splitway_accel_state{accel=\"pool\",state=\"off\"} 0\n"));
        for name in AccelName::ALL.iter().filter(|n| **n != AccelName::Pool) {
            let off = format!("splitway_accel_state{{accel=\"{name}\",state=\"off\"}} 1\n");
            assert!(text.contains(&off), "{off}");
        }
    }
}
