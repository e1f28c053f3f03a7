//! The words every acceleration's status is told in (`AccelName`,
//! `AccelState`, one `Entry` a line), below both `accel` and the rooms whose
//! planners answer in them; the running relay's view of those lines
//! (`AccelStatus`), here so `state.rs` holds it without importing the
//! planners' list; and `splitway_accel_state{accel, state}`, which
//! `AccelStatus` sets whenever an acceleration starts, stops or turns out
//! unavailable. Declared in the relay's registry at bind
//! ([`AccelMetrics::register`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use splitway_api as api;
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

/// One acceleration's effective state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: AccelName,
    /// `auto`, `on` or `off`, as the config file set it.
    pub requested: &'static str,
    pub state: AccelState,
    /// Why it is in this state, in words an operator can act on.
    pub reason: String,
}

/// The reason of an acceleration that is off: the file's `false` when it
/// said so (`turned_off`), else `otherwise`, the room's own word for why
/// `auto` left it off.
pub fn off_reason(turned_off: bool, key: &str, otherwise: &str) -> String {
    if turned_off {
        format!("turned off ([accel] {key} = false)")
    } else {
        otherwise.to_owned()
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

/// The running relay's view, shared by every config snapshot.
pub struct AccelStatus {
    entries: Mutex<Vec<Entry>>,
    metrics: AccelMetrics,
    /// Fresh peer legs this relay dials use TCP_FASTOPEN_CONNECT.
    pub peer_fast_open: bool,
}

impl AccelStatus {
    pub fn new(entries: Vec<Entry>, metrics: AccelMetrics, peer_fast_open: bool) -> AccelStatus {
        for e in &entries {
            metrics.set(e.name, e.state);
        }
        AccelStatus {
            entries: Mutex::new(entries),
            metrics,
            peer_fast_open,
        }
    }

    /// Records a change (a reload, a detector that died).
    pub fn set(&self, name: AccelName, state: AccelState, reason: String) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.iter_mut().find(|e| e.name == name) {
            e.state = state;
            e.reason = reason;
        }
        self.metrics.set(name, state);
    }

    /// Takes the entry for `name` from a fresh plan (a reload).
    pub fn replan(&self, name: AccelName, plan: &[Entry]) {
        let Some(new) = plan.iter().find(|e| e.name == name) else {
            return;
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.iter_mut().find(|e| e.name == name) {
            *e = new.clone();
        }
        self.metrics.set(name, new.state);
    }

    pub fn state(&self, name: AccelName) -> AccelState {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|e| e.name == name)
            .map_or(AccelState::Off, |e| e.state)
    }

    /// `{"early_syn": {"requested": "auto", "state": "active", "reason": …}, …}`
    pub fn api(&self) -> BTreeMap<String, api::Accel> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .map(|e| {
                (
                    e.name.as_str().to_owned(),
                    api::Accel {
                        requested: e.requested.to_owned(),
                        state: e.state.as_str().to_owned(),
                        reason: e.reason.clone(),
                    },
                )
            })
            .collect()
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

    #[test]
    fn off_says_the_files_false_or_the_rooms_reason() {
        assert_eq!(
            off_reason(true, "pool", "no [[peer]] to pool connections to"),
            "turned off ([accel] pool = false)"
        );
        assert_eq!(
            off_reason(false, "pool", "no [[peer]] to pool connections to"),
            "no [[peer]] to pool connections to"
        );
    }
}
