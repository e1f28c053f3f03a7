//! The room's metrics: which candidate new connections took, how often a
//! route's choice changed, and the active probes on both ends; declared in
//! the relay's registry at bind ([`PathMetrics::register`]) and held by
//! [`super::Paths`], which hands them to each reload's successor.
//!
//! Labels are bounded by the configuration: `route` is the route's index in
//! config order (`"0"`, `"1"`, …), `candidate` and `peer` are peer names from
//! the config or `"direct"`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use splitway_control::metrics::kit::CounterU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChoiceLabels {
    route: String,
    candidate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlipLabels {
    route: String,
    /// `failure` (the current candidate went down) or `better`.
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    peer: String,
    /// `ok` or `failed`.
    outcome: String,
}

/// The `path_*` families, registered with the relay's other metrics.
/// `Default` counts into series no registry exports (tests).
#[derive(Debug, Clone, Default)]
pub struct PathMetrics {
    choices: Family<ChoiceLabels, CounterU64>,
    flips: Family<FlipLabels, CounterU64>,
    probes_sent: Family<ProbeLabels, CounterU64>,
    probes_answered: CounterU64,
}

impl PathMetrics {
    /// Declares the families in `registry` (the relay's, under
    /// `splitway_`).
    pub fn register(registry: &mut Registry) -> PathMetrics {
        let m = PathMetrics::default();
        registry.register(
            "path_choices",
            "New connections on a multi-candidate route, by route index and the candidate taken",
            m.choices.clone(),
        );
        registry.register(
            "path_flips",
            "Changes of a route's chosen candidate, by route index and cause (failure, better)",
            m.flips.clone(),
        );
        registry.register(
            "path_probes_sent",
            "Path probes sent to each peer relay, by outcome",
            m.probes_sent.clone(),
        );
        registry.register(
            "path_probes_answered",
            "Path probes this relay answered for upstream relays",
            m.probes_answered.clone(),
        );
        m
    }

    pub fn choice(&self, route: usize, candidate: &str) {
        self.choices
            .get_or_create(&ChoiceLabels {
                route: route.to_string(),
                candidate: candidate.to_owned(),
            })
            .inc();
    }

    /// `failure`: the current candidate was down; otherwise a better one.
    pub fn flip(&self, route: usize, failure: bool) {
        self.flips
            .get_or_create(&FlipLabels {
                route: route.to_string(),
                cause: if failure { "failure" } else { "better" }.to_owned(),
            })
            .inc();
    }

    pub fn probe_sent(&self, peer: &str, ok: bool) {
        self.probes_sent
            .get_or_create(&ProbeLabels {
                peer: peer.to_owned(),
                outcome: if ok { "ok" } else { "failed" }.to_owned(),
            })
            .inc();
    }

    pub fn probe_answered(&self) {
        self.probes_answered.inc();
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;

    use super::*;

    /// Each family's name, type and help byte for byte, and the labels a
    /// choice, a flip and the probes are counted under.
    #[test]
    fn declared_in_the_relays_registry_under_their_names() {
        let mut builder = Metrics::builder();
        let room = PathMetrics::register(builder.registry());
        room.choice(1, "rs2");
        room.flip(1, true);
        room.probe_sent("rs2", false);
        room.probe_answered();
        let text = builder.build().encode();
        for line in [
            "# HELP splitway_path_choices New connections on a multi-candidate route, by route index and the candidate taken.",
            "# HELP splitway_path_flips Changes of a route's chosen candidate, by route index and cause (failure, better).",
            "# HELP splitway_path_probes_answered Path probes this relay answered for upstream relays.",
            "# HELP splitway_path_probes_sent Path probes sent to each peer relay, by outcome.",
            "# TYPE splitway_path_choices counter",
            "# TYPE splitway_path_flips counter",
            "# TYPE splitway_path_probes_answered counter",
            "# TYPE splitway_path_probes_sent counter",
            "splitway_path_choices_total{route=\"1\",candidate=\"rs2\"} 1",
            "splitway_path_flips_total{route=\"1\",cause=\"failure\"} 1",
            "splitway_path_probes_sent_total{peer=\"rs2\",outcome=\"failed\"} 1",
            "splitway_path_probes_answered_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
        }
    }
}
