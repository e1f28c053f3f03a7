//! Scenario files (`lab/scenarios/*.toml`) and what-if chains.
//!
//! A scenario names one or more chains (variants: e.g. 1, 2 and 3 relays),
//! each a list of links from the client to the server, the workload (object
//! sizes, repetitions) and the configurations to compare. Every table
//! rejects unknown keys; value checks collect every problem with its key, so
//! one run of `splitway lab scenario FILE` shows all mistakes at once.
//!
//! The shipped scenarios are compiled into the binary, so `splitway lab`
//! works from any directory; a file given by path, or a file of the same
//! name under `./lab/scenarios/`, takes precedence over the embedded copy.
//!
//! A file with `[[host]]` tables is a *graph* scenario instead
//! ([`graph`]): hosts and named links of any shape, a `[paths]`
//! measurement and timed `[[event]]`s; `lab/scenarios/path-choice.toml`.
//!
//! Sizes are decimal (`10KB` = 10,000 bytes, `1MB` = 10^6 bytes, as the
//! papers write them); `KiB`/`MiB` are binary; a bare number is bytes.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod graph;

use crate::family::Families;
use crate::model::{self, Config, Congestion, LinkModel, ModelParams};
use crate::topology::{ChainSpec, LinkSpec, QueueLimit};

/// Scenarios shipped with splitway: (name, TOML text).
pub const EMBEDDED: &[(&str, &str)] = &[
    (
        "paper-ktcp",
        include_str!("../../../lab/scenarios/paper-ktcp.toml"),
    ),
    (
        "miniproxy-chain",
        include_str!("../../../lab/scenarios/miniproxy-chain.toml"),
    ),
    (
        "njit-lossy",
        include_str!("../../../lab/scenarios/njit-lossy.toml"),
    ),
    (
        "path-choice",
        include_str!("../../../lab/scenarios/path-choice.toml"),
    ),
    (
        "geo-satellite",
        include_str!("../../../lab/scenarios/geo-satellite.toml"),
    ),
    (
        "geo-satellite-lossy",
        include_str!("../../../lab/scenarios/geo-satellite-lossy.toml"),
    ),
    (
        "leo-handover",
        include_str!("../../../lab/scenarios/leo-handover.toml"),
    ),
    (
        "ipv6-backbone",
        include_str!("../../../lab/scenarios/ipv6-backbone.toml"),
    ),
];

/// The scenario `splitway lab` runs without arguments.
pub const DEFAULT_SCENARIO: &str = "paper-ktcp";

/// Directory searched for scenario files before the embedded copies.
pub const SCENARIO_DIR: &str = "lab/scenarios";

/// One problem in a scenario, with the key that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    pub key: String,
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(
        "no scenario {0:?} (not a file, not in ./{SCENARIO_DIR}/, not built in; try `splitway lab list`)"
    )]
    NotFound(String),
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("scenario {origin}: {message}")]
    Syntax { origin: String, message: String },
    #[error("scenario {origin}: {} problem(s):\n{}", issues.len(), render(issues))]
    Invalid { origin: String, issues: Vec<Issue> },
}

fn render(issues: &[Issue]) -> String {
    issues
        .iter()
        .map(|i| format!("  - {i}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ScenarioError {
    /// The value problems, if this is a validation error.
    pub fn issues(&self) -> &[Issue] {
        match self {
            ScenarioError::Invalid { issues, .. } => issues,
            _ => &[],
        }
    }
}

// ---------------------------------------------------------------- file format

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    name: String,
    #[serde(default)]
    description: String,
    configs: Vec<String>,
    /// Address families to run each chain over when `--family` is not
    /// given: `ipv4`, `ipv6`, `ipv4-over-ipv6`, `ipv6-over-ipv4`
    /// (default: IPv4 only).
    #[serde(default)]
    families: Vec<String>,
    workload: WorkloadFile,
    #[serde(default)]
    model: ModelFile,
    chain: Vec<ChainFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadFile {
    sizes: Vec<SizeValue>,
    reps: u32,
    /// Repetitions in `--quick` mode (default 3).
    quick_reps: Option<u32>,
    /// Per-download timeout in seconds (default 120).
    timeout_s: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    initcwnd: Option<u32>,
    /// Segments, or "bdp": each chain's relay↔relay BDP at its bottleneck
    /// rate ([`model::turbo_window`]).
    turbo_initcwnd: Option<TurboValue>,
    mss: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum TurboValue {
    Segments(u32),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainFile {
    name: String,
    hosts: Option<Vec<String>>,
    link: Vec<LinkFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkFile {
    rtt_ms: f64,
    /// [client→server, server→client] one-way delays; overrides rtt_ms.
    one_way_ms: Option<[f64; 2]>,
    jitter_ms: Option<f64>,
    loss: Option<f64>,
    /// [client→server, server→client] loss; overrides `loss`.
    loss_one_way: Option<[f64; 2]>,
    rate_mbit: Option<f64>,
    queue_packets: Option<usize>,
    /// Congestion control of splitway's socket on this link (client link:
    /// the first relay's accepted sockets; server link: the last relay's
    /// direct legs; relay↔relay links: the dialing relay's peer legs).
    relay_congestion: Option<String>,
    /// Timed RTT changes with loss bursts (a LEO satellite's handovers).
    handover: Option<HandoverFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HandoverFile {
    every_s: f64,
    /// The RTTs the link cycles through, the link's `rtt_ms` first.
    rtt_ms: Vec<f64>,
    /// Loss each way for `loss_ms` after each handover (default 0).
    loss: Option<f64>,
    loss_ms: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

// ---------------------------------------------------------------- validated

/// A validated scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// Where it came from: a path, or `built-in:NAME`.
    pub origin: String,
    pub configs: Vec<Config>,
    /// The families each chain runs over when the command line names none.
    #[serde(skip)]
    pub families: Vec<Families>,
    pub sizes: Vec<u64>,
    pub reps: u32,
    pub quick_reps: u32,
    #[serde(skip)]
    pub timeout: Duration,
    pub model: ModelParams,
    /// Empty in a graph scenario.
    pub chains: Vec<Chain>,
    /// A graph scenario (`[[host]]`, `[[link]]`, `[paths]`, `[[event]]`):
    /// no chains, configs or workload.
    pub graph: Option<graph::GraphScenario>,
}

/// One chain (variant) of a scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Chain {
    pub name: String,
    pub spec: ChainSpec,
    /// Model parameters with Turbo-Start's window resolved for this chain
    /// (the relays get the same window).
    pub model: ModelParams,
    /// Per link: splitway's congestion control there, `None` = the lab's
    /// default ([`crate::model::RELAY_CONGESTION`]).
    pub relay_congestion: Vec<Option<Congestion>>,
    /// Per link: its handovers, if it has them (the model sees its first
    /// RTT only).
    pub handovers: Vec<Option<Handover>>,
    /// `turbo_initcwnd = "bdp"`: the window is the relay leg's BDP in the
    /// legs' segments, so a family with other segments gets its own.
    pub turbo_at_bdp: bool,
}

/// A link's handovers: every `every`, the next RTT of `rtts`, with `loss`
/// each way for `loss_for` (loss that congestion did not cause).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Handover {
    pub every: Duration,
    pub rtts: Vec<Duration>,
    pub loss: f64,
    pub loss_for: Duration,
}

impl Chain {
    /// This chain as the model sees it over `family`: the ends' segment
    /// size, and the legs' on relay-to-relay legs where it differs. An
    /// object near a slow-start round's boundary (100 KB: 70 segments of
    /// 1448, 71 of 1428) takes one round more on each leg that carries
    /// IPv6.
    pub fn over(&self, family: Families) -> std::borrow::Cow<'_, Chain> {
        if family == Families::V4 {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut c = self.clone();
        let mss_v4 = self.model.mss;
        c.model.mss = family.ends.mss(mss_v4);
        c.model.relay_leg_mss = (family.legs != family.ends).then(|| family.legs.mss(mss_v4));
        if self.turbo_at_bdp
            && let Some(window) = model::turbo_window(&c.model_links(), family.legs.mss(mss_v4))
        {
            c.model.turbo_initcwnd = window;
        }
        std::borrow::Cow::Owned(c)
    }

    /// The links as the model sees them.
    pub fn model_links(&self) -> Vec<LinkModel> {
        self.spec
            .links
            .iter()
            .zip(&self.relay_congestion)
            .map(|(l, cc)| {
                let (fwd, back) = l.one_way_delays();
                LinkModel {
                    forward_s: fwd.as_secs_f64(),
                    backward_s: back.as_secs_f64(),
                    rate_bps: l.rate_mbit.map(|m| m * 1e6),
                    // A download's data travels toward the client.
                    loss: l.one_way_losses().1,
                    relay_congestion: *cc,
                }
            })
            .collect()
    }

    /// "32.7/215/26 ms" style summary.
    pub fn describe(&self) -> String {
        let rtts: Vec<String> = self
            .spec
            .links
            .iter()
            .map(|l| trim_float(l.effective_rtt().as_secs_f64() * 1000.0))
            .collect();
        let mut extra = Vec::new();
        for (i, l) in self.spec.links.iter().enumerate() {
            match l.one_way_losses() {
                (0.0, 0.0) => {}
                (a, b) if a == b => {
                    extra.push(format!("link {i} loss {}%", trim_float(a * 100.0)));
                }
                (a, b) => extra.push(format!(
                    "link {i} loss {}% to server, {}% to client",
                    trim_float(a * 100.0),
                    trim_float(b * 100.0)
                )),
            }
            if let Some(cc) = self.relay_congestion.get(i).copied().flatten() {
                extra.push(format!("link {i} relay {}", cc.name()));
            }
            if let Some(r) = l.rate_mbit {
                extra.push(format!("link {i} {} Mbit/s", trim_float(r)));
            }
        }
        let mut s = format!("{} ms RTT", rtts.join("/"));
        if !extra.is_empty() {
            s.push_str(", ");
            s.push_str(&extra.join(", "));
        }
        s
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

impl Scenario {
    /// Repetitions for a run: `--reps` wins, then quick mode, then the file.
    pub fn reps_for(&self, quick: bool, reps_override: Option<u32>) -> u32 {
        reps_override.unwrap_or(if quick { self.quick_reps } else { self.reps })
    }

    /// Loads a scenario by file path, by name under `./lab/scenarios/`, or by
    /// built-in name, in that order.
    pub fn load(name_or_path: &str) -> Result<Scenario, ScenarioError> {
        let as_path = Path::new(name_or_path);
        if as_path.is_file() {
            return Self::from_file(as_path);
        }
        let in_dir = Path::new(SCENARIO_DIR).join(format!("{name_or_path}.toml"));
        if !name_or_path.contains('/') && in_dir.is_file() {
            return Self::from_file(&in_dir);
        }
        let stem = name_or_path.trim_end_matches(".toml");
        match EMBEDDED.iter().find(|(n, _)| *n == stem) {
            Some((n, text)) => Self::parse(text, &format!("built-in:{n}")),
            None => Err(ScenarioError::NotFound(name_or_path.to_owned())),
        }
    }

    fn from_file(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates scenario text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        if let Ok(table) = toml::from_str::<toml::Table>(text)
            && table.contains_key("host")
        {
            return graph::parse(text, origin);
        }
        let file: ScenarioFile = toml::from_str(text).map_err(|e| ScenarioError::Syntax {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        validate(file, origin)
    }

    /// A what-if scenario: client, r1…, server from a list of link RTTs.
    /// `losses` and `rates` (Mbit/s, 0 = uncapped) give one value per link
    /// when present.
    pub fn what_if(
        rtts_ms: &[f64],
        losses: Option<&[f64]>,
        rates_mbit: Option<&[f64]>,
        sizes: &[u64],
        configs: &[Config],
    ) -> Result<Scenario, ScenarioError> {
        let mut issues = Vec::new();
        for (key, list) in [("--loss", losses), ("--rate", rates_mbit)] {
            if let Some(list) = list
                && list.len() != rtts_ms.len()
            {
                issues.push(Issue {
                    key: key.into(),
                    message: format!(
                        "{} values for {} links (one per --rtt value)",
                        list.len(),
                        rtts_ms.len()
                    ),
                });
            }
        }
        if !issues.is_empty() {
            return Err(ScenarioError::Invalid {
                origin: "what-if".into(),
                issues,
            });
        }
        let path_rtt_ms: f64 = rtts_ms.iter().sum();
        let links = rtts_ms
            .iter()
            .enumerate()
            .map(|(i, &rtt_ms)| LinkFile {
                rtt_ms,
                one_way_ms: None,
                jitter_ms: None,
                loss: losses.map(|l| l[i]),
                loss_one_way: None,
                rate_mbit: rates_mbit.map(|r| r[i]).filter(|r| *r > 0.0),
                // As the shipped scenarios do: a capped link's queue holds
                // twice the end-to-end BDP, so slow start never overflows
                // it (the model has no such loss).
                queue_packets: rates_mbit
                    .map(|r| r[i])
                    .filter(|r| *r > 0.0)
                    .map(|r| e2e_queue_packets(r, path_rtt_ms)),
                relay_congestion: None,
                handover: None,
            })
            .collect();
        let rtt_text: Vec<String> = rtts_ms.iter().map(|r| trim_float(*r)).collect();
        let file = ScenarioFile {
            name: format!("what-if-{}", rtt_text.join("-")),
            description: "what-if chain from the command line".into(),
            configs: configs.iter().map(|c| c.name().to_owned()).collect(),
            families: Vec::new(),
            workload: WorkloadFile {
                sizes: sizes.iter().map(|s| SizeValue::Bytes(*s)).collect(),
                reps: 10,
                quick_reps: None,
                timeout_s: None,
            },
            model: ModelFile::default(),
            chain: vec![ChainFile {
                name: "what-if".into(),
                hosts: None,
                link: links,
            }],
        };
        validate(file, "what-if")
    }
}

/// Packets of twice the bandwidth-delay product of a `rate_mbit` link over
/// a whole path of `path_rtt_ms` (1500-byte packets), at least 64.
pub fn e2e_queue_packets(rate_mbit: f64, path_rtt_ms: f64) -> usize {
    let bdp_bytes = rate_mbit * 1e6 / 8.0 * path_rtt_ms / 1000.0;
    ((2.0 * bdp_bytes / f64::from(crate::topology::MTU)).ceil() as usize).max(64)
}

/// Parses "10KB", "1.5MB", "64KiB", "1000" into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a size (like 10KB, 1MB, 64KiB or bytes)"))?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    let bytes = (value * factor).round();
    if !(1.0..=1e11).contains(&bytes) {
        return Err(format!("size {text:?} out of range (1 B to 100 GB)"));
    }
    Ok(bytes as u64)
}

/// "10KB", "1MB", "1.5MB" for display (decimal units).
pub fn format_size(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes >= 1_000_000 && bytes.is_multiple_of(100_000) {
        format!("{}MB", trim_float(b / 1e6))
    } else if bytes >= 1_000 && bytes.is_multiple_of(100) {
        format!("{}KB", trim_float(b / 1e3))
    } else {
        format!("{bytes}B")
    }
}

fn validate(file: ScenarioFile, origin: &str) -> Result<Scenario, ScenarioError> {
    let mut issues = Vec::new();
    let mut bad = |key: String, message: String| issues.push(Issue { key, message });

    if file.name.trim().is_empty() {
        bad("name".into(), "must not be empty".into());
    }
    let mut configs = Vec::new();
    if file.configs.is_empty() {
        bad("configs".into(), "list at least one configuration".into());
    }
    for (i, c) in file.configs.iter().enumerate() {
        match c.parse::<Config>() {
            Ok(c) if configs.contains(&c) => {
                bad(format!("configs[{i}]"), format!("{c} listed twice"))
            }
            Ok(c) => configs.push(c),
            Err(e) => bad(format!("configs[{i}]"), e),
        }
    }
    let mut families = Vec::new();
    for (i, f) in file.families.iter().enumerate() {
        match Families::parse(f) {
            Some(f) if families.contains(&f) => bad(
                format!("families[{i}]"),
                format!("{} listed twice", f.name()),
            ),
            Some(f) => families.push(f),
            None => bad(
                format!("families[{i}]"),
                format!(
                    "{f:?}: one of {}",
                    Families::ALL.map(Families::name).join(", ")
                ),
            ),
        }
    }
    if families.is_empty() {
        families.push(Families::V4);
    }

    let mut sizes = Vec::new();
    if file.workload.sizes.is_empty() {
        bad("workload.sizes".into(), "list at least one size".into());
    }
    for (i, s) in file.workload.sizes.iter().enumerate() {
        let parsed = match s {
            SizeValue::Bytes(0) => Err("size must be at least 1 byte".to_owned()),
            SizeValue::Bytes(b) => Ok(*b),
            SizeValue::Text(t) => parse_size(t),
        };
        match parsed {
            Ok(b) if sizes.contains(&b) => {
                bad(format!("workload.sizes[{i}]"), "listed twice".into())
            }
            Ok(b) => sizes.push(b),
            Err(e) => bad(format!("workload.sizes[{i}]"), e),
        }
    }
    if file.workload.reps == 0 {
        bad("workload.reps".into(), "must be at least 1".into());
    }
    if file.workload.quick_reps == Some(0) {
        bad("workload.quick_reps".into(), "must be at least 1".into());
    }
    let timeout_s = file.workload.timeout_s.unwrap_or(120.0);
    if !(timeout_s.is_finite() && timeout_s > 0.0) {
        bad(
            "workload.timeout_s".into(),
            "must be a positive number of seconds".into(),
        );
    }

    let defaults = ModelParams::default();
    let turbo_bdp = match &file.model.turbo_initcwnd {
        None => false,
        Some(TurboValue::Segments(_)) => false,
        Some(TurboValue::Text(t)) if t == "bdp" => true,
        Some(TurboValue::Text(t)) => {
            bad(
                "model.turbo_initcwnd".into(),
                format!("{t:?}: give segments or \"bdp\""),
            );
            false
        }
    };
    let model = ModelParams {
        mss: file.model.mss.unwrap_or(defaults.mss),
        initcwnd: file.model.initcwnd.unwrap_or(defaults.initcwnd),
        turbo_initcwnd: match file.model.turbo_initcwnd {
            Some(TurboValue::Segments(n)) => n,
            _ => defaults.turbo_initcwnd,
        },
        relay_leg_mss: None,
    };
    if !(536..=9000).contains(&model.mss) {
        bad("model.mss".into(), "must be between 536 and 9000".into());
    }
    for (key, v) in [
        ("model.initcwnd", model.initcwnd),
        ("model.turbo_initcwnd", model.turbo_initcwnd),
    ] {
        if !(1..=10_000).contains(&v) {
            bad(key.into(), "must be between 1 and 10000 segments".into());
        }
    }

    let mut chains = Vec::new();
    if file.chain.is_empty() {
        bad("chain".into(), "define at least one [[chain]]".into());
    }
    let mut chain_names: Vec<&str> = Vec::new();
    for (c, chain) in file.chain.iter().enumerate() {
        let at = format!("chain[{c}]");
        if chain.name.trim().is_empty() {
            bad(format!("{at}.name"), "must not be empty".into());
        } else if chain_names.contains(&chain.name.as_str()) {
            bad(format!("{at}.name"), format!("{:?} used twice", chain.name));
        }
        chain_names.push(&chain.name);
        if chain.link.is_empty() {
            bad(
                format!("{at}.link"),
                "a chain needs at least one [[chain.link]]".into(),
            );
        }
        if chain.link.len() > 250 {
            bad(format!("{at}.link"), "at most 250 links".into());
        }
        let mut links = Vec::new();
        let mut congestions = Vec::new();
        let mut handovers = Vec::new();
        for (l, link) in chain.link.iter().enumerate() {
            let key = |field: &str| format!("{at}.link[{l}].{field}");
            let ms = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1000.0);
            let mut ok = true;
            if !(link.rtt_ms.is_finite() && link.rtt_ms >= 0.0 && link.rtt_ms <= 10_000.0) {
                bad(key("rtt_ms"), "must be between 0 and 10000 ms".into());
                ok = false;
            }
            if let Some([a, b]) = link.one_way_ms {
                for v in [a, b] {
                    if !(v.is_finite() && (0.0..=5_000.0).contains(&v)) {
                        bad(
                            key("one_way_ms"),
                            "each delay must be between 0 and 5000 ms".into(),
                        );
                        ok = false;
                    }
                }
            }
            let jitter = link.jitter_ms.unwrap_or(0.0);
            if !(jitter.is_finite() && jitter >= 0.0 && jitter <= link.rtt_ms.max(0.0) / 2.0 + 1e-9)
            {
                bad(
                    key("jitter_ms"),
                    "must be between 0 and half the RTT".into(),
                );
                ok = false;
            }
            let loss = link.loss.unwrap_or(0.0);
            if !(0.0..1.0).contains(&loss) {
                bad(
                    key("loss"),
                    "must be a fraction in [0, 1) (0.05 = 5 %)".into(),
                );
                ok = false;
            }
            if let Some(pair) = link.loss_one_way {
                if link.loss.is_some() {
                    bad(
                        key("loss_one_way"),
                        "give either loss or loss_one_way, not both".into(),
                    );
                    ok = false;
                }
                if pair.iter().any(|p| !(0.0..1.0).contains(p)) {
                    bad(
                        key("loss_one_way"),
                        "each must be a fraction in [0, 1) (0.05 = 5 %)".into(),
                    );
                    ok = false;
                }
            }
            let congestion = match link
                .relay_congestion
                .as_deref()
                .map(str::parse::<Congestion>)
            {
                None => None,
                Some(Ok(cc)) => Some(cc),
                Some(Err(e)) => {
                    bad(key("relay_congestion"), e);
                    ok = false;
                    None
                }
            };
            if let Some(r) = link.rate_mbit
                && !(r.is_finite() && r > 0.0 && r <= 100_000.0)
            {
                bad(
                    key("rate_mbit"),
                    "must be between 0 and 100000 Mbit/s (omit for no cap)".into(),
                );
                ok = false;
            }
            if link.queue_packets == Some(0) {
                bad(key("queue_packets"), "must be at least 1".into());
                ok = false;
            }
            let mut handover = None;
            if let Some(h) = &link.handover {
                let key = |field: &str| format!("{at}.link[{l}].handover.{field}");
                let mut good = true;
                if !(h.every_s.is_finite() && (1.0..=3600.0).contains(&h.every_s)) {
                    bad(key("every_s"), "must be between 1 and 3600 s".into());
                    good = false;
                }
                if h.rtt_ms.len() < 2
                    || h.rtt_ms
                        .iter()
                        .any(|r| !(r.is_finite() && (0.0..=10_000.0).contains(r)))
                {
                    bad(
                        key("rtt_ms"),
                        "at least two RTTs, each between 0 and 10000 ms".into(),
                    );
                    good = false;
                } else if (h.rtt_ms[0] - link.rtt_ms).abs() > 1e-9 {
                    bad(
                        key("rtt_ms"),
                        "must start with the link's rtt_ms (the RTT before the first handover)"
                            .into(),
                    );
                    good = false;
                }
                let burst_loss = h.loss.unwrap_or(0.0);
                if !(0.0..1.0).contains(&burst_loss) {
                    bad(key("loss"), "must be a fraction in [0, 1)".into());
                    good = false;
                }
                let loss_ms = h.loss_ms.unwrap_or(0.0);
                if !(loss_ms.is_finite() && loss_ms >= 0.0 && loss_ms <= h.every_s * 1000.0) {
                    bad(
                        key("loss_ms"),
                        "must be between 0 and the handover interval".into(),
                    );
                    good = false;
                }
                if link.one_way_ms.is_some() {
                    bad(
                        key("rtt_ms"),
                        "a link with handovers takes no one_way_ms".into(),
                    );
                    good = false;
                }
                ok &= good;
                if good {
                    handover = Some(Handover {
                        every: Duration::from_secs_f64(h.every_s),
                        rtts: h.rtt_ms.iter().map(|&r| ms(r)).collect(),
                        loss: burst_loss,
                        loss_for: ms(loss_ms),
                    });
                }
            }
            if ok {
                let mut spec = match link.one_way_ms {
                    Some([a, b]) => LinkSpec::asymmetric(ms(a), ms(b)),
                    None => LinkSpec::symmetric(ms(link.rtt_ms)),
                };
                spec.jitter = ms(jitter);
                spec.loss = loss;
                spec.loss_one_way = link.loss_one_way.map(|[a, b]| (a, b));
                spec.rate_mbit = link.rate_mbit;
                if let Some(q) = link.queue_packets {
                    spec.queue = QueueLimit::Packets(q);
                }
                links.push(spec);
                congestions.push(congestion);
                handovers.push(handover);
            }
        }
        let mut spec = ChainSpec::chain(links);
        if let Some(hosts) = &chain.hosts {
            if hosts.len() != chain.link.len() + 1 {
                bad(
                    format!("{at}.hosts"),
                    format!(
                        "{} hosts for {} links (need links + 1)",
                        hosts.len(),
                        chain.link.len()
                    ),
                );
            }
            for (h, name) in hosts.iter().enumerate() {
                let valid = !name.is_empty()
                    && name.len() <= 15
                    && name
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_');
                if !valid {
                    bad(
                        format!("{at}.hosts[{h}]"),
                        "1-15 characters of [A-Za-z0-9_-]".into(),
                    );
                } else if hosts[..h].contains(name) {
                    bad(format!("{at}.hosts[{h}]"), format!("{name:?} used twice"));
                }
            }
            spec.hosts = hosts.clone();
        }
        if chain.link.len() < 2 {
            for (i, c) in configs.iter().enumerate() {
                if *c != Config::E2e {
                    bad(
                        format!("{at}.link"),
                        format!("configs[{i}] ({c}) needs a relay: at least two links"),
                    );
                }
            }
        }
        let mut chain = Chain {
            name: chain.name.clone(),
            spec,
            model,
            relay_congestion: congestions,
            handovers,
            turbo_at_bdp: turbo_bdp,
        };
        if turbo_bdp {
            let links = chain.model_links();
            chain.model.turbo_initcwnd =
                model::turbo_window(&links, model.mss).unwrap_or(defaults.turbo_initcwnd);
            if chain.model.turbo_initcwnd > 10_000 {
                bad(
                    "model.turbo_initcwnd".into(),
                    format!(
                        "\"bdp\" gives {} segments on chain {:?}: above 10000",
                        chain.model.turbo_initcwnd, chain.name
                    ),
                );
            }
        }
        chains.push(chain);
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
        configs,
        families,
        sizes,
        reps: file.workload.reps,
        quick_reps: file.workload.quick_reps.unwrap_or(3),
        timeout: Duration::from_secs_f64(timeout_s.clamp(0.001, 86_400.0)),
        model,
        chains,
        graph: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_scenarios_parse() {
        for (name, text) in EMBEDDED {
            let s = Scenario::parse(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&s.name, name);
            assert!(!s.chains.is_empty() || s.graph.is_some());
        }
    }

    #[test]
    fn leo_handover_cycles_its_satellite_hop() {
        let s = Scenario::load("leo-handover").expect("built in");
        let h = s.chains[0].handovers[1]
            .as_ref()
            .expect("the satellite hop");
        assert_eq!(h.every, Duration::from_secs(15));
        assert_eq!(
            h.rtts,
            [Duration::from_millis(30), Duration::from_millis(80)]
        );
        assert_eq!((h.loss, h.loss_for), (0.015, Duration::from_secs(1)));
        assert!(s.chains[0].handovers[0].is_none());
        let bad = r#"
name = "x"
configs = ["e2e", "default"]
[workload]
sizes = ["1MB"]
reps = 1
[[chain]]
name = "c"
[[chain.link]]
rtt_ms = 10
[[chain.link]]
rtt_ms = 30
handover = { every_s = 0.5, rtt_ms = [40, 80], loss = 1.5, loss_ms = 99999 }
"#;
        let e = Scenario::parse(bad, "test").expect_err("invalid");
        let keys: Vec<&str> = e.issues().iter().map(|i| i.key.as_str()).collect();
        for key in ["every_s", "rtt_ms", "loss", "loss_ms"] {
            let full = format!("chain[0].link[1].handover.{key}");
            assert!(
                keys.contains(&full.as_str()),
                "{full} missing from {keys:?}"
            );
        }
    }

    #[test]
    fn paper_ktcp_matches_the_paper() {
        let s = Scenario::load("paper-ktcp").expect("built in");
        let rtts: Vec<f64> = s.chains[0]
            .spec
            .links
            .iter()
            .map(|l| l.effective_rtt().as_secs_f64() * 1000.0)
            .collect();
        assert_eq!(rtts.len(), 3);
        for (got, want) in rtts.iter().zip([32.7, 215.0, 26.0]) {
            assert!((got - want).abs() < 1e-6, "{rtts:?}");
        }
        assert_eq!(s.sizes, [10_000, 100_000, 1_000_000, 10_000_000]);
        assert_eq!(s.chains[0].spec.links[0].rate_mbit, Some(100.0));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let text = r#"
name = "bad"
configs = ["e2e", "warp", "e2e"]
families = ["ipv4-over-ipv6", "v6", "ipv4-over-ipv6"]
[workload]
sizes = ["10KB", "ten", 0]
reps = 0
[[chain]]
name = "a"
hosts = ["client", "server"]
[[chain.link]]
rtt_ms = -1
loss = 1.5
[[chain.link]]
rtt_ms = 10
rate_mbit = 0
"#;
        let err = Scenario::parse(text, "test").expect_err("invalid");
        let keys: Vec<&str> = err.issues().iter().map(|i| i.key.as_str()).collect();
        for want in [
            "configs[1]",
            "configs[2]",
            "families[1]",
            "families[2]",
            "workload.sizes[1]",
            "workload.sizes[2]",
            "workload.reps",
            "chain[0].link[0].rtt_ms",
            "chain[0].link[0].loss",
            "chain[0].link[1].rate_mbit",
            "chain[0].hosts",
        ] {
            assert!(keys.contains(&want), "missing {want} in {keys:?}");
        }
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = r#"
name = "x"
configs = ["e2e"]
colour = "blue"
[workload]
sizes = [1000]
reps = 1
[[chain]]
name = "a"
[[chain.link]]
rtt_ms = 10
"#;
        let err = Scenario::parse(text, "test").expect_err("unknown key");
        assert!(err.to_string().contains("colour"), "{err}");
        let text = text
            .replace("colour = \"blue\"\n", "")
            .replace("rtt_ms = 10", "rtt_ms = 10\nlatency = 3");
        let err = Scenario::parse(&text, "test").expect_err("unknown link key");
        assert!(err.to_string().contains("latency"), "{err}");
    }

    #[test]
    fn sizes_parse_and_format() {
        assert_eq!(parse_size("10KB"), Ok(10_000));
        assert_eq!(parse_size("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("1234"), Ok(1234));
        assert!(parse_size("10XB").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(format_size(10_000), "10KB");
        assert_eq!(format_size(10_000_000), "10MB");
        assert_eq!(format_size(1234), "1234B");
    }

    #[test]
    fn what_if_builds_a_chain() {
        let s = Scenario::what_if(
            &[40.0, 120.0, 20.0],
            Some(&[0.0, 0.0, 0.05]),
            Some(&[100.0, 0.0, 0.0]),
            &[10_000],
            &[Config::E2e, Config::Split],
        )
        .expect("valid");
        let chain = &s.chains[0];
        assert_eq!(chain.spec.hosts, ["client", "r1", "r2", "server"]);
        assert_eq!(chain.spec.links[0].rate_mbit, Some(100.0));
        assert_eq!(chain.spec.links[1].rate_mbit, None);
        assert_eq!(chain.spec.links[2].loss, 0.05);
        // 100 Mbit/s over the whole 180 ms path, twice: 3000 packets.
        assert_eq!(chain.spec.links[0].queue, QueueLimit::Packets(3000));
        assert_eq!(chain.spec.links[1].queue, QueueLimit::Auto);
        let err = Scenario::what_if(&[40.0, 20.0], Some(&[0.0]), None, &[1000], &[Config::E2e])
            .expect_err("length mismatch");
        assert_eq!(err.issues()[0].key, "--loss");
    }

    #[test]
    fn paper_ktcp_turbo_is_the_relay_leg_bdp() {
        let s = Scenario::load("paper-ktcp").expect("built in");
        assert_eq!(s.chains[0].model.turbo_initcwnd, 1857);
        // Without "bdp" the window is fixed, whatever the chain.
        let m = Scenario::load("miniproxy-chain").expect("built in");
        for chain in &m.chains {
            assert_eq!(
                chain.model.turbo_initcwnd,
                crate::model::DEFAULT_TURBO_INITCWND
            );
        }
    }

    #[test]
    fn njit_lossy_drops_data_only_and_runs_bbr_into_the_lossy_leg() {
        let s = Scenario::load("njit-lossy").expect("built in");
        let losses: Vec<f64> = s
            .chains
            .iter()
            .map(|c| {
                let link = &c.spec.links[0];
                assert_eq!(link.one_way_losses().0, 0.0, "ACKs are not dropped");
                assert_eq!(link.effective_rtt(), Duration::from_millis(10));
                assert_eq!(c.relay_congestion, [Some(Congestion::Bbr), None]);
                assert_eq!(c.model_links()[0].loss, link.one_way_losses().1);
                link.one_way_losses().1
            })
            .collect();
        assert_eq!(losses, [0.05, 0.10, 0.20]);
    }

    #[test]
    fn loss_direction_and_congestion_are_validated_with_their_keys() {
        let text = r#"
name = "x"
configs = ["e2e", "split"]
[model]
turbo_initcwnd = "lots"
[workload]
sizes = [1000]
reps = 1
[[chain]]
name = "a"
[[chain.link]]
rtt_ms = 10
loss = 0.1
loss_one_way = [0.0, 1.5]
relay_congestion = "vegas"
[[chain.link]]
rtt_ms = 10
"#;
        let err = Scenario::parse(text, "test").expect_err("invalid");
        let keys: Vec<&str> = err.issues().iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys.iter()
                .filter(|k| **k == "chain[0].link[0].loss_one_way")
                .count(),
            2,
            "{keys:?}"
        );
        assert!(
            keys.contains(&"chain[0].link[0].relay_congestion"),
            "{keys:?}"
        );
        assert!(keys.contains(&"model.turbo_initcwnd"), "{keys:?}");
        let ok = text
            .replace("turbo_initcwnd = \"lots\"", "turbo_initcwnd = \"bdp\"")
            .replace("loss = 0.1\n", "")
            .replace("1.5", "0.25")
            .replace("vegas", "bbr");
        let s = Scenario::parse(&ok, "test").expect("valid");
        assert_eq!(s.chains[0].spec.links[0].one_way_losses(), (0.0, 0.25));
        assert_eq!(s.chains[0].relay_congestion[0], Some(Congestion::Bbr));
        // One relay: no relay-to-relay leg, the default window stays.
        assert_eq!(
            s.chains[0].model.turbo_initcwnd,
            crate::model::DEFAULT_TURBO_INITCWND
        );
    }
}
