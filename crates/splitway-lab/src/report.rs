//! Results of a lab run: terminal tables, the JSON file and SVG charts.
//!
//! The JSON holds, per chain and per (configuration, size): `config`,
//! `size_bytes`, `n`, `failures`, `ttfb_ms` / `total_ms` / `connect_ms` as
//! `{p10, median, p90, mean, samples}` (null when nothing was measured), `model_ttfb_ms`,
//! `model_total_ms`, `model_connect_ms`, `status` (`ok`, `n/a`, `failed`),
//! a `note`, the emulator's stats for that batch, `emulator_shift` (how far
//! the emulator's release lateness could have moved the TTFB and download
//! time, against each figure's tolerance), the `suspect` verdict with its
//! reasons and `premise` (why the model did not apply: a queue overflowed);
//! plus the scenario, git commit, kernel, date and load average of the run.
//! How the verdicts are derived: `docs/lab.md`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::family::Families;
use crate::model::{self, Config};
use crate::scenario::{Chain, Scenario, format_size};

/// p10 / median / p90 of a sample, in milliseconds, with its mean and
/// every value: on a lossy path a download either has a loss to repair or
/// not, and with about half of them lossy the median flips between the
/// two modes from run to run, so comparisons need the values themselves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub p10: f64,
    pub median: f64,
    pub p90: f64,
    pub mean: f64,
    /// Every value, sorted.
    pub samples: Vec<f64>,
}

impl Spread {
    /// None for an empty sample. Percentiles interpolate linearly.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let pos = q * (v.len() - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = pos.ceil() as usize;
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        Some(Spread {
            p10: at(0.1),
            median: at(0.5),
            p90: at(0.9),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            samples: v.clone(),
        })
    }
}

/// Whether a (configuration, size) was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    #[serde(rename = "ok")]
    Ok,
    /// Not available: the configuration is not implemented or a tool is
    /// missing. Never a number.
    #[serde(rename = "n/a")]
    NotAvailable,
    /// Set up or every download failed.
    #[serde(rename = "failed")]
    Failed,
    /// Measured, but the relay reported a feature of this configuration
    /// unavailable: the note says what ran instead.
    #[serde(rename = "degraded")]
    Degraded,
}

/// One (configuration, size) of one chain.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub config: String,
    pub size_bytes: u64,
    /// Successful downloads.
    pub n: usize,
    pub failures: usize,
    pub status: Status,
    pub ttfb_ms: Option<Spread>,
    pub total_ms: Option<Spread>,
    pub connect_ms: Option<Spread>,
    pub model_ttfb_ms: f64,
    pub model_total_ms: f64,
    pub model_connect_ms: f64,
    /// Why n/a or failed, or how the client reached the relay.
    pub note: Option<String>,
    /// The emulator's counters for this batch (null when not measured).
    pub emulator: Option<crate::emu::stats::EmuStats>,
    /// How far the emulator's lateness could have moved this row's figures
    /// (null when not measured).
    pub emulator_shift: Option<crate::verdict::EmulatorShift>,
    /// The emulator could have moved a figure beyond its tolerance, lost
    /// packets itself, or the client did not reach the relay.
    pub suspect: bool,
    pub suspect_reasons: Vec<String>,
    /// Why the model's premises failed for this row (empty: they held).
    pub premise: Vec<String>,
    /// What the learned windows did during this row's downloads (host-wide
    /// counters of `splitway_resume`, read from the last relay before and
    /// after); absent where no relay runs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned_window_events: Option<splitway_api::LearnedWindowEvents>,
    /// The windows the last relay had saved once this row's downloads
    /// ended (it sends the downloads, so these are what its next legs
    /// toward the client's side jump to).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub learned_windows_after: Vec<splitway_api::LearnedWindow>,
}

impl Measurement {
    /// A row with the model filled in and nothing measured yet.
    pub fn unmeasured(chain: &Chain, config: Config, size: u64) -> Self {
        let p = model::predict(&chain.model_links(), config, size, &chain.model);
        Measurement {
            config: config.name().to_owned(),
            size_bytes: size,
            n: 0,
            failures: 0,
            status: Status::NotAvailable,
            ttfb_ms: None,
            total_ms: None,
            connect_ms: None,
            model_ttfb_ms: round3(p.ttfb_ms),
            model_total_ms: round3(p.total_ms),
            model_connect_ms: round3(p.connect_ms),
            note: None,
            emulator: None,
            emulator_shift: None,
            suspect: false,
            suspect_reasons: Vec::new(),
            premise: Vec::new(),
            learned_window_events: None,
            learned_windows_after: Vec::new(),
        }
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Results of one chain.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    pub name: String,
    /// The address families: `ipv4` or `ipv6` on every leg, or
    /// `ipv4-over-ipv6` / `ipv6-over-ipv4` (the ends' over the relay
    /// legs').
    pub family: &'static str,
    pub hosts: Vec<String>,
    pub description: String,
    pub links: Vec<LinkSummary>,
    /// The model's parameters for this chain (Turbo-Start's window resolved).
    pub model: model::ModelParams,
    pub results: Vec<Measurement>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LinkSummary {
    pub rtt_ms: f64,
    /// Loss toward the server and toward the client.
    pub loss_to_server: f64,
    pub loss_to_client: f64,
    /// splitway's congestion control on this link, when the scenario sets it.
    pub relay_congestion: Option<model::Congestion>,
    pub rate_mbit: Option<f64>,
    pub jitter_ms: f64,
}

impl ChainReport {
    /// `chain` run over `family`: named with the family's suffix.
    pub fn over(chain: &Chain, family: Families) -> Self {
        let mut out = ChainReport::new(chain);
        out.family = family.name();
        out.name = format!("{}{}", chain.name, family.chain_suffix());
        out
    }

    pub fn new(chain: &Chain) -> Self {
        ChainReport {
            name: chain.name.clone(),
            family: "ipv4",
            hosts: chain.spec.hosts.clone(),
            description: chain.describe(),
            links: chain
                .spec
                .links
                .iter()
                .zip(&chain.relay_congestion)
                .map(|(l, cc)| LinkSummary {
                    rtt_ms: l.effective_rtt().as_secs_f64() * 1000.0,
                    loss_to_server: l.one_way_losses().0,
                    loss_to_client: l.one_way_losses().1,
                    relay_congestion: *cc,
                    rate_mbit: l.rate_mbit,
                    jitter_ms: l.jitter.as_secs_f64() * 1000.0,
                })
                .collect(),
            model: chain.model,
            results: Vec::new(),
        }
    }

    fn find(&self, config: &str, size: u64) -> Option<&Measurement> {
        self.results
            .iter()
            .find(|m| m.config == config && m.size_bytes == size)
    }
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct LabReport {
    pub scenario: String,
    pub description: String,
    pub origin: String,
    /// False for `--model-only` output: nothing was measured.
    pub measured: bool,
    pub quick: bool,
    pub reps: u32,
    pub commit: String,
    pub kernel: String,
    pub date: String,
    /// `/proc/loadavg`'s 1, 5 and 15 minute load averages when the run
    /// started and when it ended (the lab shares the machine's cores).
    pub load_average_start: String,
    pub load_average_end: String,
    /// The scenario's model parameters; with `turbo_initcwnd = "bdp"` each
    /// chain's `model` holds the window actually used.
    pub model: model::ModelParams,
    /// Congestion control of the end hosts and of splitway's legs.
    pub end_host_congestion: String,
    pub relay_congestion: String,
    /// `--loss-seed`: the emulator's loss PRNG seed (None: random per run).
    pub loss_seed: Option<u64>,
    pub chains: Vec<ChainReport>,
}

impl LabReport {
    pub fn new(scenario: &Scenario, measured: bool, quick: bool, reps: u32) -> Self {
        LabReport {
            scenario: scenario.name.clone(),
            description: scenario.description.clone(),
            origin: scenario.origin.clone(),
            measured,
            quick,
            reps,
            commit: git_commit(),
            kernel: kernel_release(),
            date: utc_now_iso8601(),
            load_average_start: load_average(),
            load_average_end: String::new(),
            model: scenario.model,
            end_host_congestion: model::END_HOST_CONGESTION.into(),
            relay_congestion: model::RELAY_CONGESTION.into(),
            loss_seed: None,
            chains: Vec::new(),
        }
    }

    /// Model-only report: every row unmeasured, each chain over each of
    /// `families`.
    pub fn model_only(scenario: &Scenario, configs: &[Config], families: &[Families]) -> Self {
        let mut report = LabReport::new(scenario, false, false, 0);
        for chain in &scenario.chains {
            for &family in families {
                let chain = &*chain.over(family);
                let mut cr = ChainReport::over(chain, family);
                for &config in configs {
                    for &size in &scenario.sizes {
                        let mut m = Measurement::unmeasured(chain, config, size);
                        m.note = Some("model only".into());
                        cr.results.push(m);
                    }
                }
                report.chains.push(cr);
            }
        }
        report
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serialises")
    }

    /// The terminal tables, one per chain.
    pub fn render_tables(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nscenario {} ({}) — {}{}",
            self.scenario,
            self.origin,
            self.description,
            if self.quick { " [quick]" } else { "" }
        );
        let _ = writeln!(
            out,
            "commit {}  kernel {}  {}  reps {}  load {} → {}",
            short(&self.commit),
            self.kernel,
            self.date,
            self.reps,
            self.load_average_start,
            if self.load_average_end.is_empty() {
                "-"
            } else {
                &self.load_average_end
            }
        );
        for chain in &self.chains {
            let _ = writeln!(
                out,
                "\n== {}: {} ({})",
                chain.name,
                chain.description,
                chain.hosts.join(" → ")
            );
            let _ = writeln!(
                out,
                "{:<14} {:>6} {:>5} {:>26} {:>8} {:>6} {:>26} {:>8} {:>6} {:>7}",
                "config",
                "size",
                "n/ok",
                "TTFB ms p10/med/p90",
                "model",
                "ratio",
                "total ms p10/med/p90",
                "model",
                "ratio",
                "vs e2e"
            );
            for m in &chain.results {
                let e2e = chain
                    .find("e2e", m.size_bytes)
                    .and_then(|e| e.total_ms.as_ref());
                let ok = format!("{}/{}", m.n, m.n + m.failures);
                let cell = |s: Option<&Spread>| match s {
                    Some(s) => format!("{:.1}/{:.1}/{:.1}", s.p10, s.median, s.p90),
                    None => match m.status {
                        _ if !self.measured => "(model only)".into(),
                        Status::Ok => "-".into(),
                        Status::NotAvailable => "n/a".into(),
                        Status::Failed => "failed".into(),
                        Status::Degraded => "-".into(),
                    },
                };
                let ratio = |s: Option<&Spread>, model: f64| match s {
                    Some(s) if model > 0.0 => format!("{:.2}", s.median / model),
                    _ => "-".into(),
                };
                let speedup = match (m.total_ms.as_ref(), e2e) {
                    (Some(t), Some(e)) if t.median > 0.0 => format!("{:.2}x", e.median / t.median),
                    _ => "-".into(),
                };
                let mut flag = String::new();
                for (on, word) in [
                    (m.status == Status::Degraded, " DEGRADED"),
                    (m.suspect, " SUSPECT"),
                    (!m.premise.is_empty(), " PREMISE"),
                ] {
                    if on {
                        flag.push_str(word);
                    }
                }
                let _ = writeln!(
                    out,
                    "{:<14} {:>6} {:>5} {:>26} {:>8.1} {:>6} {:>26} {:>8.1} {:>6} {:>7}{}",
                    m.config,
                    format_size(m.size_bytes),
                    ok,
                    cell(m.ttfb_ms.as_ref()),
                    m.model_ttfb_ms,
                    ratio(m.ttfb_ms.as_ref(), m.model_ttfb_ms),
                    cell(m.total_ms.as_ref()),
                    m.model_total_ms,
                    ratio(m.total_ms.as_ref(), m.model_total_ms),
                    speedup,
                    flag
                );
            }
            let mut notes: Vec<String> = Vec::new();
            for m in &chain.results {
                if let Some(n) = &m.note {
                    let line = format!("{}: {}", m.config, n);
                    if !notes.contains(&line) {
                        notes.push(line);
                    }
                }
                for (kind, reasons) in [("suspect", &m.suspect_reasons), ("premise", &m.premise)] {
                    for r in reasons {
                        let line =
                            format!("{} {}: {kind}: {r}", m.config, format_size(m.size_bytes));
                        if !notes.contains(&line) {
                            notes.push(line);
                        }
                    }
                }
            }
            for n in notes {
                let _ = writeln!(out, "  note: {n}");
            }
        }
        out.push_str(&self.render_families());
        out
    }

    /// Where a chain ran over more than IPv4 (`--family both`, mixed
    /// families): each configuration's median over its IPv4 one, TTFB and
    /// total, per size. Empty otherwise.
    pub fn render_families(&self) -> String {
        let mut out = String::new();
        for other in self.chains.iter().filter(|c| c.family != "ipv4") {
            let Some(family) = Families::parse(other.family) else {
                continue;
            };
            let Some(v4) = self.chains.iter().find(|c| {
                c.family == "ipv4" && other.name == format!("{}{}", c.name, family.chain_suffix())
            }) else {
                continue;
            };
            let _ = writeln!(
                out,
                "\n== {}: {} / IPv4, medians (TTFB, total)",
                v4.name,
                family.label().unwrap_or("IPv4")
            );
            for m in &other.results {
                let Some(m4) = v4.find(&m.config, m.size_bytes) else {
                    continue;
                };
                let ratio = |a: Option<&Spread>, b: Option<&Spread>| match (a, b) {
                    (Some(a), Some(b)) if b.median > 0.0 => format!("{:.3}", a.median / b.median),
                    _ => "-".into(),
                };
                let _ = writeln!(
                    out,
                    "{:<14} {:>6} {:>7} {:>7}",
                    m.config,
                    format_size(m.size_bytes),
                    ratio(m.ttfb_ms.as_ref(), m4.ttfb_ms.as_ref()),
                    ratio(m.total_ms.as_ref(), m4.total_ms.as_ref())
                );
            }
        }
        out
    }

    /// Writes one SVG chart per chain under `dir`; returns their paths.
    pub fn write_charts(&self, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
            path: dir.to_owned(),
            source,
        })?;
        let mut paths = Vec::new();
        for (i, chain) in self.chains.iter().enumerate() {
            let file = format!(
                "{}{}.svg",
                slug(&self.scenario),
                if self.chains.len() > 1 {
                    format!("-{}", slug(&chain.name))
                } else {
                    String::new()
                }
            );
            let path = dir.join(file);
            chart::draw(self, i, &path)?;
            paths.push(path);
        }
        Ok(paths)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot draw chart {path}: {detail}")]
    Chart { path: PathBuf, detail: String },
}

fn short(commit: &str) -> &str {
    if commit.len() >= 12 && commit.chars().all(|c| c.is_ascii_hexdigit()) {
        &commit[..12]
    } else {
        commit
    }
}

fn slug(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').to_owned()
}

/// `git rev-parse HEAD`, else `$SPLITWAY_COMMIT`, else "unknown".
pub fn git_commit() -> String {
    let from_git = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty());
    from_git
        .or_else(|| std::env::var("SPLITWAY_COMMIT").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// The 1, 5 and 15 minute load averages, or "unknown".
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now_iso8601() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    iso8601(secs)
}

fn iso8601(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The SVG chart, laid out like the KTCP paper's Fig. 3 (TTFB) and Fig. 4
/// (download completion time): seconds on a linear axis from zero, one group
/// of bars per object size, one bar per configuration (median, whiskers
/// p10–p90), the model's prediction as a black diamond on each bar. The
/// legend sits beside the plots, so every x slot holds a size.
mod chart {
    use super::*;
    use plotters::prelude::*;

    const PALETTE: [RGBColor; 8] = [
        RGBColor(0x4c, 0x72, 0xb0),
        RGBColor(0xdd, 0x84, 0x52),
        RGBColor(0x55, 0xa8, 0x68),
        RGBColor(0xc4, 0x4e, 0x52),
        RGBColor(0x81, 0x72, 0xb3),
        RGBColor(0x93, 0x78, 0x60),
        RGBColor(0xda, 0x8b, 0xc3),
        RGBColor(0x8c, 0x8c, 0x8c),
    ];
    const WIDTH: u32 = 1200;
    const HEIGHT: u32 = 900;
    const LEGEND_WIDTH: u32 = 220;

    /// Selects a metric and its model value from a row, in ms.
    type Pick = fn(&Measurement) -> (Option<Spread>, f64);

    fn err(path: &Path, e: impl std::fmt::Display) -> ReportError {
        ReportError::Chart {
            path: path.to_owned(),
            detail: e.to_string(),
        }
    }

    fn diamond(at: (i32, i32)) -> Polygon<(i32, i32)> {
        let (x, y) = at;
        Polygon::new(
            vec![(x, y - 5), (x + 4, y), (x, y + 5), (x - 4, y)],
            BLACK.filled(),
        )
    }

    pub fn draw(report: &LabReport, index: usize, path: &Path) -> Result<(), ReportError> {
        let chain = &report.chains[index];
        let mut configs: Vec<&str> = Vec::new();
        let mut sizes: Vec<u64> = Vec::new();
        for m in &chain.results {
            if !configs.contains(&m.config.as_str()) {
                configs.push(&m.config);
            }
            if !sizes.contains(&m.size_bytes) {
                sizes.push(m.size_bytes);
            }
        }
        let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(path, e))?;
        let title = format!(
            "{} — {} ({}), median of {} per bar",
            report.scenario, chain.name, chain.description, report.reps
        );
        let root = root
            .titled(&title, ("sans-serif", 20))
            .map_err(|e| err(path, e))?;
        let (plots, legend) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
        let panels = plots.split_evenly((2, 1));
        let paper = report.scenario == "paper-ktcp";
        let metrics: [(String, Pick); 2] = [
            (
                format!(
                    "Time to first byte (s){}",
                    if paper { ", as KTCP Fig. 3" } else { "" }
                ),
                |m| (m.ttfb_ms.clone(), m.model_ttfb_ms),
            ),
            (
                format!(
                    "Download completion time (s){}",
                    if paper { ", as KTCP Fig. 4" } else { "" }
                ),
                |m| (m.total_ms.clone(), m.model_total_ms),
            ),
        ];
        let groups = sizes.len().max(1);
        let per_group = configs.len().max(1);
        let width = 0.8 / per_group as f64;
        for (panel, (caption, pick)) in panels.iter().zip(metrics) {
            let mut max = 0.001_f64;
            for m in &chain.results {
                let (s, model) = pick(m);
                let values = s.map(|s| [s.p90, s.median]).unwrap_or_default();
                for v in values.into_iter().chain([model]) {
                    if v.is_finite() {
                        max = max.max(v / 1000.0);
                    }
                }
            }
            let mut chart = ChartBuilder::on(panel)
                .caption(&caption, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..groups as f64, 0.0..max * 1.08)
                .map_err(|e| err(path, e))?;
            let size_labels: Vec<String> = sizes.iter().map(|s| format_size(*s)).collect();
            chart
                .configure_mesh()
                .disable_x_mesh()
                .label_style(("sans-serif", 14))
                .x_labels(groups * 2 + 1)
                .x_label_formatter(&|x| {
                    let i = x.floor() as usize;
                    if (x - i as f64 - 0.5).abs() < 0.26 {
                        size_labels.get(i).cloned().unwrap_or_default()
                    } else {
                        String::new()
                    }
                })
                .y_desc("s")
                .y_label_formatter(&|y| format!("{y:.2}"))
                .draw()
                .map_err(|e| err(path, e))?;
            for (c, config) in configs.iter().enumerate() {
                let color = PALETTE[c % PALETTE.len()];
                let mut bars = Vec::new();
                let mut whiskers = Vec::new();
                let mut markers = Vec::new();
                for (g, size) in sizes.iter().enumerate() {
                    let Some(m) = chain
                        .results
                        .iter()
                        .find(|m| m.config == *config && m.size_bytes == *size)
                    else {
                        continue;
                    };
                    let x0 = g as f64 + 0.1 + c as f64 * width;
                    let x1 = x0 + width * 0.9;
                    let xm = (x0 + x1) / 2.0;
                    let (spread, model) = pick(m);
                    if let Some(sp) = spread {
                        let sec = |v: f64| v / 1000.0;
                        bars.push(Rectangle::new(
                            [(x0, 0.0), (x1, sec(sp.median))],
                            color.filled(),
                        ));
                        whiskers.push(PathElement::new(
                            vec![(xm, sec(sp.p10)), (xm, sec(sp.p90))],
                            BLACK,
                        ));
                    }
                    if model > 0.0 {
                        markers.push((xm, model / 1000.0));
                    }
                }
                chart.draw_series(bars).map_err(|e| err(path, e))?;
                chart.draw_series(whiskers).map_err(|e| err(path, e))?;
                chart
                    .draw_series(
                        markers
                            .into_iter()
                            .map(|p| EmptyElement::at(p) + diamond((0, 0))),
                    )
                    .map_err(|e| err(path, e))?;
            }
        }
        draw_legend(&legend, chain, &configs).map_err(|e| err(path, e))?;
        root.present().map_err(|e| err(path, e))?;
        Ok(())
    }

    /// One entry per configuration, then the model's marker and the
    /// whiskers, in pixel coordinates of the legend column.
    fn draw_legend<DB: DrawingBackend>(
        area: &DrawingArea<DB, plotters::coord::Shift>,
        chain: &ChainReport,
        configs: &[&str],
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let font = ("sans-serif", 15).into_font();
        let mut y = 60;
        for (c, config) in configs.iter().enumerate() {
            let color = PALETTE[c % PALETTE.len()];
            let degraded = chain
                .results
                .iter()
                .any(|m| m.config == *config && m.status == Status::Degraded);
            let label = if degraded {
                format!("{config} (degraded)")
            } else {
                (*config).to_owned()
            };
            area.draw(&Rectangle::new([(10, y - 6), (24, y + 6)], color.filled()))?;
            area.draw(&Text::new(label, (32, y - 8), font.clone()))?;
            y += 24;
        }
        y += 10;
        area.draw(&(EmptyElement::at((17, y)) + diamond((0, 0))))?;
        area.draw(&Text::new("model", (32, y - 8), font.clone()))?;
        y += 24;
        area.draw(&PathElement::new(vec![(17, y - 7), (17, y + 7)], BLACK))?;
        area.draw(&Text::new("p10–p90", (32, y - 8), font))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_percentiles() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).expect("non-empty");
        assert_eq!(s.median, 3.0);
        assert!((s.p10 - 1.4).abs() < 1e-9);
        assert!((s.p90 - 4.6).abs() < 1e-9);
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn json_has_the_documented_shape() {
        let scenario = Scenario::load("paper-ktcp").expect("built in");
        let chain = &scenario.chains[0];
        let mut report = LabReport::new(&scenario, true, true, 3);
        let mut cr = ChainReport::new(chain);
        let mut ok = Measurement::unmeasured(chain, Config::E2e, 10_000);
        ok.status = Status::Ok;
        ok.n = 3;
        ok.failures = 1;
        ok.ttfb_ms = Spread::of(&[548.0, 549.0, 550.0]);
        ok.total_ms = Spread::of(&[549.0, 550.0, 551.0]);
        ok.emulator = Some(crate::emu::stats::EmuStats::new(Vec::new()));
        cr.results.push(ok);
        let mut na = Measurement::unmeasured(chain, Config::FullTfo, 10_000);
        na.note = Some("not implemented by the relay yet".into());
        cr.results.push(na);
        report.chains.push(cr);

        let v: serde_json::Value = serde_json::from_str(&report.to_json()).expect("valid JSON");
        for key in [
            "scenario",
            "commit",
            "kernel",
            "date",
            "load_average_start",
            "chains",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!(v["date"].as_str().is_some_and(|d| d.ends_with('Z')));
        let rows = v["chains"][0]["results"].as_array().expect("results");
        let ok = &rows[0];
        assert_eq!(ok["config"], "e2e");
        assert_eq!(ok["size_bytes"], 10_000);
        assert_eq!(ok["n"], 3);
        assert_eq!(ok["failures"], 1);
        assert_eq!(ok["status"], "ok");
        for metric in ["ttfb_ms", "total_ms"] {
            for q in ["p10", "median", "p90"] {
                assert!(ok[metric][q].is_f64(), "{metric}.{q}");
            }
        }
        assert_eq!(ok["ttfb_ms"]["median"], 549.0);
        assert!(
            ok["model_ttfb_ms"]
                .as_f64()
                .is_some_and(|m| (m - 547.5).abs() < 0.5)
        );
        assert!(ok["model_total_ms"].is_f64());
        assert_eq!(ok["suspect"], false);
        assert!(ok["emulator"].is_object());
        let na = &rows[1];
        assert_eq!(na["status"], "n/a");
        assert!(na["ttfb_ms"].is_null(), "n/a rows carry no number");
        assert!(na["model_ttfb_ms"].is_f64());
    }

    #[test]
    fn chart_has_one_slot_per_size_and_marks_the_model() {
        let scenario = Scenario::load("paper-ktcp").expect("built in");
        let chain = &scenario.chains[0];
        let mut report = LabReport::new(&scenario, true, true, 3);
        let mut cr = ChainReport::new(chain);
        for config in [Config::E2e, Config::Full] {
            for size in [10_000, 1_000_000] {
                let mut m = Measurement::unmeasured(chain, config, size);
                m.status = Status::Ok;
                m.n = 3;
                m.ttfb_ms = Spread::of(&[m.model_ttfb_ms, m.model_ttfb_ms * 1.01]);
                m.total_ms = Spread::of(&[m.model_total_ms, m.model_total_ms * 1.02]);
                cr.results.push(m);
            }
        }
        report.chains.push(cr);
        let dir = std::env::temp_dir().join(format!("swlab-chart-{}", std::process::id()));
        let paths = report.write_charts(&dir).expect("chart drawn");
        let svg = std::fs::read_to_string(&paths[0]).expect("chart written");
        std::fs::remove_dir_all(&dir).expect("remove the chart");
        for text in [
            "10KB",
            "1MB",
            "e2e",
            "full",
            "model",
            "KTCP Fig. 3",
            "KTCP Fig. 4",
        ] {
            assert!(svg.contains(text), "chart lacks {text:?}");
        }
        // Two panels, each with one label per size: no empty slot.
        assert_eq!(svg.matches("\n10KB\n").count(), 2);
        assert_eq!(svg.matches("\n1MB\n").count(), 2);
    }

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("2 relays"), "2-relays");
        assert_eq!(slug("paper-ktcp"), "paper-ktcp");
        assert_eq!(slug("5% loss"), "5-loss");
    }
}
