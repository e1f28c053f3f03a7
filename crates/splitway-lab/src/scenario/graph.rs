//! Graph scenarios: `[[host]]` and `[[link]]` tables instead of `[[chain]]`,
//! a `[paths]` measurement (which relay chooses among which candidates) and
//! timed `[[event]]`s, each starting a measured phase. A file with
//! `[[host]]` tables is a graph scenario; see `lab/scenarios/path-choice.toml`.
//!
//! Like chain scenarios, every table rejects unknown keys and every value
//! problem is reported with its key, all at once.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Issue, Scenario, ScenarioError, SizeValue, parse_size};
use crate::model::ModelParams;
use crate::topology::graph::{GraphLink, GraphSpec};
use crate::topology::{LinkSpec, QueueLimit};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphFile {
    name: String,
    #[serde(default)]
    description: String,
    host: Vec<HostFile>,
    #[serde(default)]
    link: Vec<LinkFile>,
    paths: Option<PathsFile>,
    #[serde(default)]
    event: Vec<EventFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFile {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkFile {
    name: String,
    between: [String; 2],
    rtt_ms: f64,
    jitter_ms: Option<f64>,
    loss: Option<f64>,
    rate_mbit: Option<f64>,
    queue_packets: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathsFile {
    client: String,
    server: String,
    relay: String,
    candidates: Vec<String>,
    samples: usize,
    response_bytes: Option<SizeValue>,
    first_phase: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventFile {
    at: String,
    phase: Option<String>,
    link: Option<String>,
    rtt_ms: Option<f64>,
    rtt_add_ms: Option<f64>,
    loss: Option<f64>,
    down: Option<bool>,
    kill: Option<String>,
}

/// A validated graph scenario.
#[derive(Debug, Clone, Serialize)]
pub struct GraphScenario {
    pub spec: GraphSpec,
    pub paths: PathsSpec,
    pub events: Vec<Event>,
}

/// The path-choice measurement: `relay` (on its own host) chooses among
/// `candidates` ("direct" or hosts running a peer relay) for connections
/// from `client` to `server`.
#[derive(Debug, Clone, Serialize)]
pub struct PathsSpec {
    pub client: String,
    pub server: String,
    pub relay: String,
    pub candidates: Vec<String>,
    /// TTFB samples per median.
    pub samples: usize,
    pub response_bytes: u64,
    pub first_phase: String,
}

/// A timed change, starting the phase `phase`.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Since the first phase began.
    #[serde(serialize_with = "secs")]
    pub at: Duration,
    pub phase: String,
    pub action: Action,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// New RTT (ms) and/or loss on a link.
    SetLink {
        link: String,
        rtt_ms: Option<f64>,
        rtt_add_ms: Option<f64>,
        loss: Option<f64>,
    },
    LinkDown(String),
    LinkUp(String),
    /// Kill the relay on this host (SIGKILL: no goodbye to its peers).
    Kill(String),
}

impl Action {
    pub fn describe(&self) -> String {
        match self {
            Action::SetLink {
                link,
                rtt_ms,
                rtt_add_ms,
                loss,
            } => {
                let mut parts = Vec::new();
                if let Some(r) = rtt_ms {
                    parts.push(format!("rtt {r} ms"));
                }
                if let Some(r) = rtt_add_ms {
                    parts.push(format!("{r:+} ms"));
                }
                if let Some(l) = loss {
                    parts.push(format!("loss {}%", l * 100.0));
                }
                format!("{link} {}", parts.join(", "))
            }
            Action::LinkDown(l) => format!("{l} down"),
            Action::LinkUp(l) => format!("{l} up"),
            Action::Kill(h) => format!("{h} dead"),
        }
    }
}

/// The relay-running hosts of a path measurement.
impl PathsSpec {
    pub fn peer_hosts(&self) -> impl Iterator<Item = &str> {
        self.candidates
            .iter()
            .map(String::as_str)
            .filter(|c| *c != "direct")
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
}

pub(super) fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
    let file: GraphFile = toml::from_str(text).map_err(|e| ScenarioError::Syntax {
        origin: origin.to_owned(),
        message: e.to_string(),
    })?;
    let mut issues = Vec::new();
    let mut bad = |key: String, message: String| issues.push(Issue { key, message });
    if file.name.trim().is_empty() {
        bad("name".into(), "must not be empty".into());
    }
    let hosts: Vec<String> = file.host.iter().map(|h| h.name.clone()).collect();
    if hosts.len() < 2 || hosts.len() > 250 {
        bad("host".into(), "give 2 to 250 [[host]] tables".into());
    }
    for (h, name) in hosts.iter().enumerate() {
        if !valid_name(name) {
            bad(
                format!("host[{h}].name"),
                "1-15 characters of [A-Za-z0-9_-]".into(),
            );
        } else if hosts[..h].contains(name) {
            bad(format!("host[{h}].name"), format!("{name:?} used twice"));
        }
    }
    let host_index = |name: &str| hosts.iter().position(|h| h == name);
    if file.link.is_empty() || file.link.len() > 255 {
        bad("link".into(), "give 1 to 255 [[link]] tables".into());
    }
    let mut links = Vec::new();
    for (j, l) in file.link.iter().enumerate() {
        let key = |f: &str| format!("link[{j}].{f}");
        let mut ok = true;
        if !valid_name(&l.name) {
            bad(key("name"), "1-15 characters of [A-Za-z0-9_-]".into());
            ok = false;
        } else if file.link[..j].iter().any(|o| o.name == l.name) {
            bad(key("name"), format!("{:?} used twice", l.name));
            ok = false;
        }
        let ends: Vec<Option<usize>> = l.between.iter().map(|h| host_index(h)).collect();
        if ends.contains(&None) {
            bad(key("between"), format!("{:?}: not a [[host]]", l.between));
            ok = false;
        } else if ends[0] == ends[1] {
            bad(key("between"), "a link joins two different hosts".into());
            ok = false;
        }
        if !(l.rtt_ms.is_finite() && (0.0..=10_000.0).contains(&l.rtt_ms)) {
            bad(key("rtt_ms"), "must be between 0 and 10000 ms".into());
            ok = false;
        }
        let jitter = l.jitter_ms.unwrap_or(0.0);
        if !(jitter.is_finite() && jitter >= 0.0 && jitter <= l.rtt_ms.max(0.0) / 2.0 + 1e-9) {
            bad(
                key("jitter_ms"),
                "must be between 0 and half the RTT".into(),
            );
            ok = false;
        }
        let loss = l.loss.unwrap_or(0.0);
        if !(0.0..1.0).contains(&loss) {
            bad(
                key("loss"),
                "must be a fraction in [0, 1) (0.05 = 5 %)".into(),
            );
            ok = false;
        }
        if let Some(r) = l.rate_mbit
            && !(r.is_finite() && r > 0.0 && r <= 100_000.0)
        {
            bad(
                key("rate_mbit"),
                "must be between 0 and 100000 Mbit/s (omit for no cap)".into(),
            );
            ok = false;
        }
        if l.queue_packets == Some(0) {
            bad(key("queue_packets"), "must be at least 1".into());
            ok = false;
        }
        if ok && let (Some(a), Some(b)) = (ends[0], ends[1]) {
            let mut spec = LinkSpec::symmetric(crate::topology::graph::ms(l.rtt_ms))
                .with_loss(loss)
                .with_jitter(crate::topology::graph::ms(jitter));
            spec.rate_mbit = l.rate_mbit;
            if let Some(q) = l.queue_packets {
                spec = spec.with_queue(QueueLimit::Packets(q));
            }
            links.push(GraphLink {
                name: l.name.clone(),
                a,
                b,
                spec,
            });
        }
    }
    let spec = GraphSpec {
        hosts: hosts.clone(),
        links,
    };
    if spec.links.len() == file.link.len() {
        for (h, name) in hosts.iter().enumerate() {
            if spec
                .next_hops(h)
                .iter()
                .enumerate()
                .any(|(t, hop)| t != h && hop.is_none())
            {
                bad(
                    format!("host[{h}]"),
                    format!("{name:?} cannot reach every other host over the links"),
                );
                break;
            }
        }
    }

    let paths = match &file.paths {
        None => {
            bad(
                "paths".into(),
                "a graph scenario needs its measurement: a [paths] table".into(),
            );
            None
        }
        Some(p) => {
            for (k, name) in [
                ("paths.client", &p.client),
                ("paths.server", &p.server),
                ("paths.relay", &p.relay),
            ] {
                if host_index(name).is_none() {
                    bad(k.into(), format!("{name:?}: not a [[host]]"));
                }
            }
            if p.client == p.relay || p.server == p.relay || p.client == p.server {
                bad(
                    "paths.relay".into(),
                    "client, relay and server are three different hosts".into(),
                );
            }
            if p.candidates.len() < 2 {
                bad(
                    "paths.candidates".into(),
                    "a choice needs at least two candidates".into(),
                );
            }
            for (k, c) in p.candidates.iter().enumerate() {
                if p.candidates[..k].contains(c) {
                    bad(
                        format!("paths.candidates[{k}]"),
                        format!("{c:?} listed twice"),
                    );
                } else if c != "direct"
                    && (host_index(c).is_none() || [&p.client, &p.server, &p.relay].contains(&c))
                {
                    bad(
                        format!("paths.candidates[{k}]"),
                        format!(
                            "{c:?}: \"direct\" or a [[host]] other than client, relay and server"
                        ),
                    );
                }
            }
            if !(3..=101).contains(&p.samples) {
                bad("paths.samples".into(), "must be between 3 and 101".into());
            }
            let response_bytes = match &p.response_bytes {
                None => 1024,
                Some(SizeValue::Bytes(b)) => *b,
                Some(SizeValue::Text(t)) => parse_size(t).unwrap_or_else(|e| {
                    bad("paths.response_bytes".into(), e);
                    0
                }),
            };
            if !(1..=100_000_000).contains(&response_bytes) {
                bad(
                    "paths.response_bytes".into(),
                    "must be between 1 B and 100MB".into(),
                );
            }
            Some(PathsSpec {
                client: p.client.clone(),
                server: p.server.clone(),
                relay: p.relay.clone(),
                candidates: p.candidates.clone(),
                samples: p.samples,
                response_bytes,
                first_phase: p.first_phase.clone().unwrap_or_else(|| "start".into()),
            })
        }
    };

    let mut events = Vec::new();
    let mut last_at = Duration::ZERO;
    for (i, e) in file.event.iter().enumerate() {
        let key = |f: &str| format!("event[{i}].{f}");
        let at = splitway_control::params::parse_duration(&e.at);
        match at {
            None => bad(key("at"), format!("{:?}: a duration like \"20s\"", e.at)),
            Some(t) if t <= last_at => bad(
                key("at"),
                "events come in time order, after the start (0s)".into(),
            ),
            Some(t) => last_at = t,
        }
        let link_change = e.rtt_ms.is_some() || e.rtt_add_ms.is_some() || e.loss.is_some();
        let action = match (&e.link, &e.kill) {
            (Some(_), Some(_)) | (None, None) => {
                bad(
                    key("link"),
                    "an event names either a `link` (with rtt_ms, rtt_add_ms, loss or down) or a relay host to `kill`".into(),
                );
                None
            }
            (None, Some(h)) => {
                // The chooser is what is measured: only a candidate may die.
                let is_candidate = file
                    .paths
                    .as_ref()
                    .is_some_and(|p| p.candidates.iter().any(|c| c == h && c != "direct"));
                if !is_candidate {
                    bad(
                        key("kill"),
                        format!("{h:?}: not a candidate relay's host (paths.candidates)"),
                    );
                }
                if link_change || e.down.is_some() {
                    bad(key("kill"), "a kill event changes no link".into());
                }
                Some(Action::Kill(h.clone()))
            }
            (Some(l), None) => {
                if !file.link.iter().any(|x| &x.name == l) {
                    bad(key("link"), format!("{l:?}: not a [[link]]"));
                }
                if e.rtt_ms.is_some() && e.rtt_add_ms.is_some() {
                    bad(
                        key("rtt_add_ms"),
                        "give rtt_ms or rtt_add_ms, not both".into(),
                    );
                }
                if let Some(r) = e.rtt_ms
                    && !(r.is_finite() && (0.0..=10_000.0).contains(&r))
                {
                    bad(key("rtt_ms"), "must be between 0 and 10000 ms".into());
                }
                if let Some(r) = e.rtt_add_ms
                    && !(r.is_finite() && (-10_000.0..=10_000.0).contains(&r))
                {
                    bad(
                        key("rtt_add_ms"),
                        "must be between -10000 and 10000 ms".into(),
                    );
                }
                if let Some(l) = e.loss
                    && !(0.0..1.0).contains(&l)
                {
                    bad(
                        key("loss"),
                        "must be a fraction in [0, 1) (use down = true for 1)".into(),
                    );
                }
                match (e.down, link_change) {
                    (Some(_), true) => {
                        bad(
                            key("down"),
                            "change a link or take it down/up, not both".into(),
                        );
                        None
                    }
                    (Some(true), false) => Some(Action::LinkDown(l.clone())),
                    (Some(false), false) => Some(Action::LinkUp(l.clone())),
                    (None, false) => {
                        bad(
                            key("link"),
                            "say what changes: rtt_ms, rtt_add_ms, loss or down".into(),
                        );
                        None
                    }
                    (None, true) => Some(Action::SetLink {
                        link: l.clone(),
                        rtt_ms: e.rtt_ms,
                        rtt_add_ms: e.rtt_add_ms,
                        loss: e.loss,
                    }),
                }
            }
        };
        if let (Some(at), Some(action)) = (at, action) {
            let phase = e.phase.clone().unwrap_or_else(|| action.describe());
            events.push(Event { at, phase, action });
        }
    }

    if !issues.is_empty() {
        return Err(ScenarioError::Invalid {
            origin: origin.to_owned(),
            issues,
        });
    }
    Ok(Scenario {
        name: file.name,
        description: file.description,
        origin: origin.to_owned(),
        configs: Vec::new(),
        families: Vec::new(),
        sizes: Vec::new(),
        reps: 1,
        quick_reps: 1,
        timeout: Duration::from_secs(120),
        model: ModelParams::default(),
        chains: Vec::new(),
        graph: Some(GraphScenario {
            spec,
            paths: paths.expect("no issues: [paths] given"),
            events,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "g"
[[host]]
name = "client"
[[host]]
name = "rc"
[[host]]
name = "rs1"
[[host]]
name = "server"
[[link]]
name = "access"
between = ["client", "rc"]
rtt_ms = 1
[[link]]
name = "direct"
between = ["rc", "server"]
rtt_ms = 200
[[link]]
name = "rc-rs1"
between = ["rc", "rs1"]
rtt_ms = 40
[[link]]
name = "rs1-server"
between = ["rs1", "server"]
rtt_ms = 5
[paths]
client = "client"
server = "server"
relay = "rc"
candidates = ["direct", "rs1"]
samples = 5
[[event]]
at = "20s"
link = "rc-rs1"
rtt_add_ms = 100
[[event]]
at = "30s"
phase = "rs1 dead"
kill = "rs1"
"#;

    #[test]
    fn a_graph_scenario_parses_with_its_events() {
        let s = Scenario::parse(GOOD, "test").expect("valid");
        assert!(s.chains.is_empty());
        let g = s.graph.expect("graph");
        assert_eq!(g.spec.hosts.len(), 4);
        assert_eq!(g.spec.links[1].a, 1);
        assert_eq!(g.spec.links[1].b, 3);
        assert_eq!(g.events.len(), 2);
        assert_eq!(g.events[0].at, Duration::from_secs(20));
        assert_eq!(g.events[0].phase, "rc-rs1 +100 ms");
        assert_eq!(g.events[1].action, Action::Kill("rs1".into()));
        assert_eq!(g.paths.peer_hosts().collect::<Vec<_>>(), ["rs1"]);
    }

    #[test]
    fn every_graph_problem_is_reported_with_its_key() {
        let text = GOOD
            .replace(
                "between = [\"rs1\", \"server\"]",
                "between = [\"rs1\", \"mars\"]",
            )
            .replace("rtt_ms = 200", "rtt_ms = -3")
            .replace(
                "candidates = [\"direct\", \"rs1\"]",
                "candidates = [\"direct\", \"client\"]",
            )
            .replace("at = \"30s\"", "at = \"10s\"")
            .replace("kill = \"rs1\"", "kill = \"rc\"")
            .replace("rtt_add_ms = 100", "rtt_add_ms = 100\ndown = true");
        let err = Scenario::parse(&text, "test").expect_err("invalid");
        let keys: Vec<&str> = err.issues().iter().map(|i| i.key.as_str()).collect();
        for want in [
            "link[3].between",
            "link[1].rtt_ms",
            "paths.candidates[1]",
            "event[1].at",
            "event[1].kill",
            "event[0].down",
        ] {
            assert!(keys.contains(&want), "missing {want} in {keys:?}");
        }
        let err = Scenario::parse(&GOOD.replace("samples = 5", "samples = 5\nspeed = 3"), "t")
            .expect_err("unknown key");
        assert!(err.to_string().contains("speed"), "{err}");
    }

    #[test]
    fn an_island_is_an_error() {
        let text = GOOD.replace(
            "[[link]]\nname = \"access\"\nbetween = [\"client\", \"rc\"]\nrtt_ms = 1\n",
            "",
        );
        let err = Scenario::parse(&text, "test").expect_err("client unreachable");
        assert_eq!(err.issues()[0].key, "host[0]");
    }
}
