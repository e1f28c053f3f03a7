//! The bench report: a terminal table, JSON with every raw round, and the
//! markdown the README carries (with where the numbers came from).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use super::error::BenchError;
use super::plan::{BenchArgs, FIXED_RATE, Plan, RESULTS_DIR};
use super::procs::Method;
use super::stats;

/// One measured value of one method in one round.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub round: u32,
    pub method: String,
    pub metric: String,
    pub value: f64,
}

/// The median of a metric for a method, and medians of its per-round
/// ratios to direct TCP and to HAProxy.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub method: String,
    pub metric: String,
    pub rounds: usize,
    pub median: f64,
    pub ratio_to_direct: Option<f64>,
    pub ratio_to_haproxy: Option<f64>,
}

/// The durations and counts of a run, as the report states them.
#[derive(Debug, Clone, Serialize)]
pub struct RunPlan {
    /// Rounds, methods interleaved within each.
    pub rounds: u32,
    pub quick: bool,
    /// Length of each timed test in a round.
    pub test_seconds: f64,
    /// New connections per second of the fixed-rate setup test, and for how long.
    pub fixed_rate_per_s: f64,
    pub fixed_rate_seconds: f64,
    /// Connections held open for the idle-memory figure.
    pub idle_connections: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub date: String,
    pub commit: String,
    pub commit_dirty: bool,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub load_average_start: String,
    pub load_average_end: String,
    /// The command line that produced this report.
    pub command: String,
    /// How the run was planned (its keys sit at the top level of the JSON).
    #[serde(flatten)]
    pub plan: RunPlan,
    pub methods: Vec<String>,
    pub notes: Vec<String>,
    /// Medians and ratios per method and metric.
    pub summary: Vec<Summary>,
    /// Every raw measurement.
    pub samples: Vec<Sample>,
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// (key, label, unit) of the metrics in table order.
const METRICS: &[(&str, &str)] = &[
    ("bulk1_gbps", "bulk, 1 stream (Gbit/s)"),
    ("bulk8_gbps", "bulk, 8 streams (Gbit/s)"),
    ("bulk1_cpu_s_per_gb", "proxy CPU-s per GB, 1 stream"),
    ("bulk8_cpu_s_per_gb", "proxy CPU-s per GB, 8 streams"),
    ("bulk8_rss_per_conn_bytes", "RSS per active bulk conn (B)"),
    ("rr64_tps", "64 B req/resp per s, 1 conn"),
    ("rr64_p50_us", "64 B req/resp p50 (µs)"),
    ("rr64_p99_us", "64 B req/resp p99 (µs)"),
    ("rr1k_tps", "1 KB req/resp per s, 1 conn"),
    ("conn_rate", "new conn/s (closed loop)"),
    ("conn_p50_us", "  connect→1st byte p50 (µs)"),
    ("conn_p99_us", "  connect→1st byte p99 (µs)"),
    ("conn_failures", "  failed connections"),
    ("fixed_rate", "fixed-rate run, achieved conn/s"),
    ("fixed_p50_us", "  connect→1st byte p50 (µs)"),
    ("fixed_p99_us", "  connect→1st byte p99 (µs)"),
    ("fixed_p999_us", "  connect→1st byte p99.9 (µs)"),
    ("fixed_failures", "  failed connections"),
    ("idle_conn_bytes", "RSS per idle proxied conn (B)"),
    ("idle_rss_bytes", "idle RSS after start (B)"),
    ("startup_ms", "exec → listening (ms)"),
];

fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Bytes: exact below 100 KiB (with thousands separators), MiB above.
fn fmt_bytes(v: f64) -> String {
    if v >= 100.0 * 1024.0 {
        return format!("{:.1} MiB", v / (1024.0 * 1024.0));
    }
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.2}"))
}

impl BenchReport {
    pub fn begin(plan: &Plan, args: &BenchArgs) -> BenchReport {
        let mut command = String::from("splitway lab bench");
        if args.quick {
            command.push_str(" --quick");
        }
        if args.accept_compare {
            command.push_str(" --accept-compare");
        }
        if args.footprint {
            command.push_str(" --footprint");
        }
        if let Some(r) = args.rounds {
            let _ = write!(command, " --rounds {r}");
        }
        BenchReport {
            date: command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])
                .unwrap_or_else(|| "unknown".into()),
            commit: command_output("git", &["rev-parse", "HEAD"])
                .unwrap_or_else(|| "unknown".into()),
            commit_dirty: command_output("git", &["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty()),
            kernel: command_output("uname", &["-r"]).unwrap_or_else(|| "unknown".into()),
            cpu_model: cpu_model(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_average_start: load_average(),
            load_average_end: String::new(),
            command,
            plan: RunPlan {
                rounds: plan.rounds,
                quick: args.quick,
                test_seconds: plan.test_time.as_secs_f64(),
                fixed_rate_per_s: FIXED_RATE,
                fixed_rate_seconds: plan.fixed_time.as_secs_f64(),
                idle_connections: plan.idle_connections,
            },
            methods: plan.methods().iter().map(|m| m.name().to_owned()).collect(),
            notes: Vec::new(),
            summary: Vec::new(),
            samples: Vec::new(),
        }
    }

    pub fn finish(&mut self, samples: Vec<Sample>, notes: Vec<String>) {
        self.load_average_end = load_average();
        self.notes = notes;
        self.summary = summarise(&samples, self.plan.rounds);
        self.samples = samples;
    }

    fn get(&self, method: Method, metric: &str) -> Option<&Summary> {
        self.summary
            .iter()
            .find(|s| s.method == method.name() && s.metric == metric)
    }

    /// Rows are metrics; each cell is `median (× direct, × HAProxy)`.
    pub fn render_table(&self) -> String {
        let methods: Vec<Method> = Method::EVERY
            .into_iter()
            .filter(|m| self.methods.iter().any(|n| n == m.name()))
            .collect();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "splitway lab bench: {} round(s), medians; (a, b) = median of per-round ratios to direct, to HAProxy",
            self.plan.rounds
        );
        let _ = write!(out, "{:<34}", "metric");
        for &m in &methods {
            let _ = write!(out, " {:>22}", m.name());
        }
        out.push('\n');
        for (key, label) in METRICS {
            if !methods.iter().any(|m| self.get(*m, key).is_some()) {
                continue;
            }
            let _ = write!(out, "{label:<34}");
            for &m in &methods {
                let cell = self.get(m, key).map_or_else(
                    || "–".to_owned(),
                    |s| {
                        format!(
                            "{} ({}, {})",
                            fmt_value(s.median),
                            fmt_ratio(s.ratio_to_direct),
                            fmt_ratio(s.ratio_to_haproxy)
                        )
                    },
                );
                let _ = write!(out, " {cell:>22}");
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "load average {} → {}; kernel {}; {} × {}",
            self.load_average_start, self.load_average_end, self.kernel, self.cpus, self.cpu_model
        );
        out
    }

    /// A table row of `method`: one column per group of metrics, the
    /// metrics of a group joined by ` / `.
    fn row(&self, md: &mut String, method: Method, columns: &[&[(&str, Ratio)]]) {
        let mut line = format!("| {} |", method.label());
        for column in columns {
            let cells: Vec<String> = column
                .iter()
                .map(|&(key, ratio)| self.cell(method, key, ratio))
                .collect();
            line.push_str(&format!(" {} |", cells.join(" / ")));
        }
        md.push_str(&line);
        md.push('\n');
    }

    fn cell(&self, method: Method, key: &str, ratio: Ratio) -> String {
        match self.get(method, key) {
            None => "–".into(),
            Some(s) => {
                let r = match ratio {
                    Ratio::None => None,
                    Ratio::Direct => s.ratio_to_direct,
                };
                let value = if key.contains("bytes") {
                    fmt_bytes(s.median)
                } else {
                    fmt_value(s.median)
                };
                match (ratio, r) {
                    (Ratio::None, _) => value,
                    (_, Some(r)) if method != Method::Direct => format!("{value} ({r:.2})"),
                    _ => value,
                }
            }
        }
    }

    /// The README's markdown: three tables and where the numbers came from.
    pub fn render_markdown(&self) -> String {
        let mut md = String::new();
        let short = &self.commit[..self.commit.len().min(12)];
        let _ = writeln!(
            md,
            "Side by side on loopback in one network namespace, one run, methods interleaved per round; \
             medians over {} rounds, ratios taken per round then the median.\n",
            self.plan.rounds
        );
        md.push_str(
            "| method | bulk, 1 stream, Gbit/s (× direct) | bulk, 8 streams (× direct) | proxy CPU-s per GB, 1 / 8 streams | 64 B req/resp per s (× direct) | 1 KB req/resp per s (× direct) | new conn/s (× direct) |\n\
             |---|---|---|---|---|---|---|\n",
        );
        use Ratio::{Direct, None as Plain};
        for m in Method::ALL {
            self.row(
                &mut md,
                m,
                &[
                    &[("bulk1_gbps", Direct)],
                    &[("bulk8_gbps", Direct)],
                    &[("bulk1_cpu_s_per_gb", Plain), ("bulk8_cpu_s_per_gb", Plain)],
                    &[("rr64_tps", Direct)],
                    &[("rr1k_tps", Direct)],
                    &[("conn_rate", Direct)],
                ],
            );
        }
        let _ = writeln!(
            md,
            "\n| method | setup at {} new conn/s: connect → first response byte p50 / p99 / p99.9 µs (p50 × direct) | user-space bytes per idle proxied conn ({} open) | bytes per active bulk conn | RSS after start (idle) | exec → listening, ms |\n\
             |---|---|---|---|---|---|",
            fmt_value(self.plan.fixed_rate_per_s),
            fmt_bytes(self.plan.idle_connections as f64)
        );
        for m in Method::ALL {
            let setup = [
                ("fixed_p50_us", Direct),
                ("fixed_p99_us", Plain),
                ("fixed_p999_us", Plain),
            ];
            self.row(
                &mut md,
                m,
                &[
                    &setup,
                    &[("idle_conn_bytes", Plain)],
                    &[("bulk8_rss_per_conn_bytes", Plain)],
                    &[("idle_rss_bytes", Plain)],
                    &[("startup_ms", Plain)],
                ],
            );
        }
        md.push_str(
            "\n| method (× HAProxy) | bulk, 1 stream | bulk, 8 streams | 64 B req/resp | 1 KB req/resp | new conn/s | setup p50 at 1,000/s |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for m in [Method::Socat, Method::Splitway1, Method::Splitway2] {
            let r = |key: &str| fmt_ratio(self.get(m, key).and_then(|s| s.ratio_to_haproxy));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                m.label(),
                r("bulk1_gbps"),
                r("bulk8_gbps"),
                r("rr64_tps"),
                r("rr1k_tps"),
                r("conn_rate"),
                r("fixed_p50_us"),
            );
        }
        let _ = writeln!(
            md,
            "\n**Where these numbers came from.** `{}` (`make bench`) on {}, commit `{}`{}, kernel {}, {} vCPU {}; \
             load average {} at start, {} at end. The 2 cores were shared with other work during the run, so \
             absolute figures vary between runs (up to 2×); trust the ratios, which are taken within each round. \
             Every raw round is in `bench-results/{}`. Method: backends and load generators are in the \
             `splitway` binary (blocking sockets, one thread per stream); bulk = {} s upload per stream, timed until the \
             sink confirms every byte; request/response = ping-pong over one connection for {} s; new connections = \
             4 closed-loop threads for {} s, each connect, 64 B request, 64 B response, close; the fixed-rate run \
             opens {} connections/s for {} s from 8 threads. splitway is reached through its HTTP CONNECT listener \
             (one extra round trip per new connection, included in its setup latency; none for bulk or \
             request/response). HAProxy runs in TCP mode with `option splice-request`/`splice-response` and \
             `tune.pipesize 262144` (`maxpipes 64`, so its fd reservation fits the fd limit); socat forks per connection (its idle memory is not measured). CPU is \
             utime+stime of the proxy processes and their children; memory is RSS, excluding kernel socket buffers; \
             bytes per active bulk connection is the RSS growth of a freshly started proxy half-way through 8 streams, \
             divided by 8 (socat's includes its forked processes); the relay pair's CPU and memory are both relays together. Percentiles are nearest-rank over {} \
             fixed-rate connections per round.",
            self.command,
            self.date,
            short,
            if self.commit_dirty {
                " (with uncommitted changes)"
            } else {
                ""
            },
            self.kernel,
            self.cpus,
            self.cpu_model,
            self.load_average_start,
            self.load_average_end,
            self.json_name(),
            self.plan.test_seconds,
            self.plan.test_seconds,
            self.plan.test_seconds,
            fmt_value(self.plan.fixed_rate_per_s),
            self.plan.fixed_rate_seconds,
            (self.plan.fixed_rate_per_s * self.plan.fixed_rate_seconds).round(),
        );
        for note in &self.notes {
            let _ = writeln!(md, "\n- {note}");
        }
        md
    }

    fn json_name(&self) -> String {
        let date: String = self
            .date
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        format!("{date}-{}.json", &self.commit[..self.commit.len().min(8)])
    }

    /// Writes `bench-results/<date>-<commit>.json`, bench-results/latest.md and
    /// `extra_json` if given; returns the paths written.
    pub fn write_files(&self, extra_json: Option<&Path>) -> Result<Vec<PathBuf>, BenchError> {
        let dir = Path::new(RESULTS_DIR);
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
            op: format!("create {}", dir.display()),
            source,
        })?;
        let json = serde_json::to_string_pretty(self).map_err(|e| BenchError::Io {
            op: "serialise the bench report".into(),
            source: std::io::Error::other(e),
        })?;
        let mut paths = vec![dir.join(self.json_name()), dir.join("latest.md")];
        if let Some(extra) = extra_json {
            paths.push(extra.to_path_buf());
        }
        for path in &paths {
            let text = if path.extension().is_some_and(|e| e == "md") {
                self.render_markdown()
            } else {
                json.clone()
            };
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|source| BenchError::Io {
                    op: format!("create {}", parent.display()),
                    source,
                })?;
            }
            std::fs::write(path, text).map_err(|source| BenchError::Io {
                op: format!("write {}", path.display()),
                source,
            })?;
        }
        Ok(paths)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ratio {
    None,
    Direct,
}

fn value_in(samples: &[Sample], round: u32, method: &str, metric: &str) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.round == round && s.method == method && s.metric == metric)
        .map(|s| s.value)
}

/// Medians per (method, metric) and medians of per-round ratios.
pub fn summarise(samples: &[Sample], rounds: u32) -> Vec<Summary> {
    let mut out = Vec::new();
    for method in Method::EVERY {
        for (metric, _) in METRICS {
            let values: Vec<f64> = samples
                .iter()
                .filter(|s| s.method == method.name() && s.metric == *metric)
                .map(|s| s.value)
                .collect();
            let Some(median) = stats::median(&values) else {
                continue;
            };
            let ratio_to = |reference: Method| {
                let pairs: Vec<_> = (0..rounds)
                    .map(|r| {
                        (
                            value_in(samples, r, method.name(), metric),
                            value_in(samples, r, reference.name(), metric),
                        )
                    })
                    .collect();
                stats::median_of_ratios(&pairs)
            };
            out.push(Summary {
                method: method.name().into(),
                metric: (*metric).into(),
                rounds: values.len(),
                median,
                ratio_to_direct: ratio_to(Method::Direct),
                ratio_to_haproxy: ratio_to(Method::Haproxy),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(round: u32, method: Method, metric: &str, value: f64) -> Sample {
        Sample {
            round,
            method: method.name().into(),
            metric: metric.into(),
            value,
        }
    }

    #[test]
    fn summary_takes_ratios_within_rounds() {
        let samples = vec![
            sample(0, Method::Direct, "bulk1_gbps", 80.0),
            sample(0, Method::Haproxy, "bulk1_gbps", 40.0),
            sample(0, Method::Splitway1, "bulk1_gbps", 20.0),
            sample(1, Method::Direct, "bulk1_gbps", 40.0),
            sample(1, Method::Haproxy, "bulk1_gbps", 20.0),
            sample(1, Method::Splitway1, "bulk1_gbps", 10.0),
            sample(2, Method::Direct, "bulk1_gbps", 60.0),
            sample(2, Method::Haproxy, "bulk1_gbps", 30.0),
            sample(2, Method::Splitway1, "bulk1_gbps", 15.0),
        ];
        let summary = summarise(&samples, 3);
        let sw = summary
            .iter()
            .find(|s| s.method == "splitway-1" && s.metric == "bulk1_gbps")
            .expect("splitway summarised");
        assert_eq!(sw.median, 15.0);
        assert_eq!(sw.ratio_to_direct, Some(0.25));
        assert_eq!(sw.ratio_to_haproxy, Some(0.5));
        assert_eq!(sw.rounds, 3);
        assert!(
            !summary.iter().any(|s| s.method == "socat"),
            "no samples, no row"
        );
    }

    fn report(samples: Vec<Sample>) -> BenchReport {
        let mut report = BenchReport {
            date: "2026-11-24T00:00:00Z".into(),
            commit: "0123456789abcdef".into(),
            commit_dirty: false,
            kernel: "6.18".into(),
            cpu_model: "test".into(),
            cpus: 2,
            load_average_start: "0.00 0.00 0.00".into(),
            load_average_end: String::new(),
            command: "splitway lab bench".into(),
            plan: RunPlan {
                rounds: 1,
                quick: true,
                test_seconds: 1.0,
                fixed_rate_per_s: 1000.0,
                fixed_rate_seconds: 1.0,
                idle_connections: 100,
            },
            methods: Method::ALL.iter().map(|m| m.name().to_owned()).collect(),
            notes: Vec::new(),
            summary: Vec::new(),
            samples: Vec::new(),
        };
        report.finish(samples, Vec::new());
        report
    }

    /// The plan is its own struct but its keys stay where readers of the
    /// committed JSON files find them.
    #[test]
    fn plan_keys_stay_at_the_top_of_the_json() {
        let json = serde_json::to_value(report(Vec::new())).unwrap();
        let top = json.as_object().unwrap();
        for key in [
            "rounds",
            "quick",
            "test_seconds",
            "fixed_rate_per_s",
            "fixed_rate_seconds",
            "idle_connections",
        ] {
            assert!(top.contains_key(key), "{key} missing: {json}");
        }
        assert!(!top.contains_key("plan"), "{json}");
    }

    /// Every row of the markdown tables has as many cells as its header.
    #[test]
    fn markdown_rows_match_their_headers() {
        let md = report(vec![
            sample(0, Method::Direct, "bulk1_gbps", 80.0),
            sample(0, Method::Splitway1, "fixed_p99_us", 300.0),
        ])
        .render_markdown();
        let mut columns = None;
        let mut rows = 0;
        for line in md.lines().filter(|l| l.starts_with('|')) {
            let cells = line.matches('|').count();
            if line.starts_with("|---") {
                continue;
            }
            match columns {
                Some(n) if !line.starts_with("| method") => {
                    assert_eq!(cells, n, "{line}");
                    rows += 1;
                }
                _ => columns = Some(cells),
            }
        }
        assert!(rows >= 2 * Method::ALL.len(), "{md}");
        assert!(md.contains("| 80"), "the sample shows: {md}");
    }

    #[test]
    fn bytes_format() {
        assert_eq!(fmt_bytes(3379.4), "3,379");
        assert_eq!(fmt_bytes(999.0), "999");
        assert_eq!(fmt_bytes(65_282.0), "65,282");
        assert_eq!(fmt_bytes(16.0 * 1024.0 * 1024.0), "16.0 MiB");
    }
}
