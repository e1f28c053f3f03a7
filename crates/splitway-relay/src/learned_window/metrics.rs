//! The room's metrics: `splitway_window_probes_total{outcome}`, counted by
//! both ends of a window probe, and `splitway_learned_window_events_total`
//! with `splitway_learned_window_peers`, copied in from `splitway_resume`'s
//! host-wide counters before each scrape; declared in the relay's registry
//! at bind.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::EnumCounter;

label_enum! {
    label "outcome";
    /// How a window probe (learned windows, issue #29) ended, by side.
    pub enum WindowProbe {
        /// Sent to a peer; both directions' filler went through.
        Sent => "sent",
        /// Sent to a peer; it failed or timed out (retried).
        SendFailed => "send_failed",
        /// Answered for an upstream relay.
        Answered => "answered",
        /// An upstream relay's probe refused (one per 30 s per address) or
        /// broken off.
        Refused => "refused",
    }
}

/// `window_probes_total`: the relay-leg connections that carried window
/// probes, which `connections_accepted_total{mode="peer"}` counts too.
#[derive(Clone, Debug)]
pub struct WindowProbeMetrics(EnumCounter<WindowProbe>);

impl WindowProbeMetrics {
    /// Declares the family in `registry`, every outcome at zero.
    pub fn register(registry: &mut Registry) -> Self {
        WindowProbeMetrics(EnumCounter::register(
            registry,
            "window_probes",
            "Window probes on relay legs (learned windows), by outcome",
        ))
    }

    /// Counts a window probe's outcome.
    pub fn count(&self, outcome: WindowProbe) {
        self.0.inc(outcome);
    }
}

label_enum! {
    label "event";
    /// What `splitway_resume` did on relay legs (learned windows).
    pub enum LearnedWindowEvent {
        /// A connection started from its peer's saved window.
        Jump => "jump",
        /// A saved window was not used: the RTT no longer matched.
        RttMismatch => "rtt_mismatch",
        /// A jump's unvalidated phase ended without a loss.
        Validated => "validated",
        /// A loss in the unvalidated phase: the window retreated and the
        /// peer's entry was forgotten.
        Retreat => "retreat",
        /// A connection's window was saved for its peer.
        Saved => "saved",
    }
}

/// `learned_window_events_total` and `learned_window_peers`. The kernel
/// counts (in the algorithm's BPF map, host-wide); the relay copies the
/// totals in before each scrape, and this adds what grew since.
#[derive(Clone, Debug)]
pub struct LearnedWindowMetrics {
    events: EnumCounter<LearnedWindowEvent>,
    peers: Gauge,
    /// The totals last copied in: a counter only grows by the difference.
    seen: std::sync::Arc<std::sync::Mutex<[u64; LearnedWindowEvent::COUNT]>>,
}

impl LearnedWindowMetrics {
    /// Declares both families in `registry`, at zero.
    pub fn register(registry: &mut Registry) -> Self {
        let events = EnumCounter::register(
            registry,
            "learned_window_events",
            "What splitway_resume did on relay legs, host-wide (every relay on the host shares it)",
        );
        let peers = Gauge::default();
        registry.register(
            "learned_window_peers",
            "Peer addresses with a learned window young enough to resume from, host-wide",
            peers.clone(),
        );
        LearnedWindowMetrics {
            events,
            peers,
            seen: Default::default(),
        }
    }

    /// Copies in the kernel's totals (in [`LearnedWindowEvent::ALL`]'s
    /// order) and the number of current peers. Totals below the last ones
    /// mean the maps were made anew (the algorithm registered again): they
    /// count from zero.
    pub fn observe(&self, totals: [u64; LearnedWindowEvent::COUNT], current_peers: u64) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for ((event, last), total) in LearnedWindowEvent::ALL
            .iter()
            .zip(seen.iter_mut())
            .zip(totals)
        {
            let grew = if total >= *last { total - *last } else { total };
            self.events.inc_by(*event, grew);
            *last = total;
        }
        self.peers
            .set(i64::try_from(current_peers).unwrap_or(i64::MAX));
    }

    /// The exported total of `event`.
    pub fn get(&self, event: LearnedWindowEvent) -> u64 {
        self.events.get(event)
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;
    use splitway_control::metrics::kit::missing_lines;

    use super::*;

    /// Names, types and help byte for byte, every label exported at zero.
    #[test]
    fn declared_in_the_relays_registry_under_their_names() {
        let mut builder = Metrics::builder();
        let probes = WindowProbeMetrics::register(builder.registry());
        let events = LearnedWindowMetrics::register(builder.registry());
        probes.count(WindowProbe::Sent);
        events.observe([1, 0, 0, 0, 2], 1);
        let text = builder.build().encode();
        for line in [
            "# HELP splitway_window_probes Window probes on relay legs (learned windows), by outcome.\n",
            "# TYPE splitway_window_probes counter\n",
            "splitway_window_probes_total{outcome=\"sent\"} 1\n",
            "# HELP splitway_learned_window_events What splitway_resume did on relay legs, host-wide (every relay on the host shares it).\n",
            "# TYPE splitway_learned_window_events counter\n",
            "splitway_learned_window_events_total{event=\"saved\"} 2\n",
            "# HELP splitway_learned_window_peers Peer addresses with a learned window young enough to resume from, host-wide.\n",
            "# TYPE splitway_learned_window_peers gauge\n",
            "splitway_learned_window_peers 1\n",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        let none = Vec::<String>::new();
        assert_eq!(
            missing_lines::<WindowProbe>(
                &text,
                "window_probes",
                "Window probes on relay legs (learned windows), by outcome"
            ),
            none
        );
        assert_eq!(
            missing_lines::<LearnedWindowEvent>(
                &text,
                "learned_window_events",
                "What splitway_resume did on relay legs, host-wide (every relay on the host shares it)"
            ),
            none
        );
    }

    #[test]
    fn learned_window_totals_add_only_what_grew() {
        let mut registry = Registry::default();
        let m = LearnedWindowMetrics::register(&mut registry);
        m.observe([3, 1, 2, 0, 5], 2);
        m.observe([4, 1, 2, 1, 7], 1);
        assert_eq!(m.get(LearnedWindowEvent::Jump), 4);
        assert_eq!(m.get(LearnedWindowEvent::Retreat), 1);
        assert_eq!(m.get(LearnedWindowEvent::Saved), 7);
        // The maps were made anew: their totals restart from zero.
        m.observe([1, 0, 0, 0, 1], 1);
        assert_eq!(m.get(LearnedWindowEvent::Jump), 5);
        assert_eq!(m.get(LearnedWindowEvent::Saved), 8);
        assert_eq!(m.peers.get(), 1);
    }
}
