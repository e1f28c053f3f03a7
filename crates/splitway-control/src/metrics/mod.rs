//! The metrics registry the relay's families are declared in, and how it
//! is served.
//!
//! This crate declares only what any process has: the process's series
//! (`process_*`) and `splitway_build`. Every `splitway_*` family of the
//! relay is declared where it is counted, in `splitway-relay` (its
//! `metrics` module and each acceleration's room), with
//! [`label_enum!`](crate::label_enum) and the helpers of [`kit`], into
//! [`MetricsBuilder::registry`]: issue #31, this crate knows no relay word.
//!
//! Every label value is a closed Rust enum (or a name taken from the
//! configuration), so the number of series is fixed by the code and the
//! config, never by traffic. All enum-labelled series are created up front
//! and their handles kept, so a hot-path update is one atomic add, and
//! every series is exported as `0` from the first scrape, which `rate()`
//! needs.

use std::fmt;

use prometheus_client::registry::Registry;

// First, for its `label_enum!` to be in scope in the modules below (the
// macro is exported at the crate root for the relay's rooms).
#[macro_use]
mod family;

/// What a metrics module of the relay uses besides
/// [`label_enum!`](crate::label_enum): [`EnumCounter`](kit::EnumCounter), a
/// counter family with one enum label (the enum led by `label "name";`),
/// and `missing_lines` for its test; for other shapes the counter type, the
/// up-front series and the declaration helper.
pub mod kit {
    pub use super::family::{
        CounterU64, EnumCounter, Keyed, LabelEnum, declare, metadata_lines, missing_lines, series,
    };
}
mod process;

pub use family::METRIC_PREFIX;
pub use process::{ProcessCollector, ProcessSample};

/// The registry: the process's and the build's series, and what the
/// relay declared through [`Metrics::builder`]. Create once, share as
/// `Arc<Metrics>`; the admin server encodes it for `GET /metrics`.
pub struct Metrics {
    registry: Registry,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A registry being assembled: the relay's rooms declare their families in
/// [`MetricsBuilder::registry`] before [`MetricsBuilder::build`] freezes it.
pub struct MetricsBuilder {
    metrics: Metrics,
}

impl MetricsBuilder {
    /// Where a room declares its families: names get the `splitway_`
    /// prefix, like every family of this crate's.
    pub fn registry(&mut self) -> &mut Registry {
        self.metrics
            .registry
            .sub_registry_with_prefix(METRIC_PREFIX)
    }

    pub fn build(self) -> Metrics {
        self.metrics
    }
}

impl Metrics {
    /// [`Metrics::new`], open for the rooms' families.
    pub fn builder() -> MetricsBuilder {
        MetricsBuilder {
            metrics: Metrics::new(),
        }
    }

    /// Creates the registry with every family registered and every
    /// enum-labelled series present at zero.
    pub fn new() -> Self {
        // The process's series keep their usual unprefixed names; the
        // relay's own are `splitway_*`.
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix(METRIC_PREFIX);
        registry.register(
            "build",
            "This build: its version and git commit (value 1)",
            prometheus_client::metrics::info::Info::new([
                ("version", crate::build::VERSION),
                ("commit", crate::build::COMMIT),
            ]),
        );
        Self { registry: root }
    }

    /// Renders the registry in Prometheus's text format; serve it with
    /// [`TEXT_CONTENT_TYPE`].
    pub fn encode_text(&self) -> String {
        openmetrics_to_text(&self.encode())
    }

    /// Renders the registry in the OpenMetrics text format (ends with
    /// `# EOF`); serve it with [`OPENMETRICS_CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String cannot fail, and every metric type registered
        // here (u64 counters, i64 gauges, histograms) encodes infallibly, so
        // an error here is a broken invariant, not a runtime condition.
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding infallible metrics into a String failed");
        out
    }
}

/// Content type of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of [`Metrics::encode_text`]'s output: Prometheus's text
/// format, for a client whose `Accept` does not ask for OpenMetrics.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether an `Accept` header asks for OpenMetrics (Prometheus sends
/// `application/openmetrics-text;version=1.0.0,...;q=0.5,text/plain;...`);
/// a type listed with `q=0` is refused, not asked for.
pub fn accepts_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        })
    })
}

/// OpenMetrics text rewritten as Prometheus text format 0.0.4: no `# EOF`,
/// `# UNIT` or `_created` lines; a counter's `# HELP`/`# TYPE` name its
/// samples' `_total` name, an info metric is a gauge named `_info`.
pub fn openmetrics_to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP waits for its TYPE, which decides the name.
    let mut help: Option<(&str, &str)> = None;
    let mut counters: Vec<&str> = Vec::new();
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split_once(' ').or(Some((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => {
                    counters.push(name);
                    (format!("{name}_total"), "counter")
                }
                "info" => (format!("{name}_info"), "gauge"),
                "stateset" | "gaugehistogram" | "unknown" => (name.to_owned(), "untyped"),
                other => (name.to_owned(), other),
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        let sample = line.split(['{', ' ']).next().unwrap_or_default();
        if sample
            .strip_suffix("_created")
            .is_some_and(|family| counters.contains(&family))
        {
            continue;
        }
        // Exemplars (` # {...}`) are OpenMetrics only.
        let line = line.split(" # ").next().unwrap_or(line);
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn metrics_is_send_and_sync() {
        assert_send_sync::<Metrics>();
    }

    /// The families this crate declares itself, byte for byte: the
    /// process's and the build's (the relay's are its own, and pinned
    /// there).
    #[test]
    fn family_metadata_is_unchanged() {
        let text = Metrics::new().encode();
        let expected = [
            "# HELP process_cpu_seconds User and system CPU time spent, in seconds.",
            "# HELP process_max_fds The limit of open file descriptors (RLIMIT_NOFILE, soft).",
            "# HELP process_open_fds Open file descriptors (sockets, pipes, files).",
            "# HELP process_resident_memory_bytes Resident memory size in bytes.",
            "# HELP process_start_time_seconds Start time of the process since the Unix epoch, in seconds.",
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.",
            "# HELP splitway_build This build: its version and git commit (value 1).",
            "# TYPE process_cpu_seconds counter",
            "# TYPE process_max_fds gauge",
            "# TYPE process_open_fds gauge",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_start_time_seconds gauge",
            "# TYPE process_virtual_memory_bytes gauge",
            "# TYPE splitway_build info",
        ];
        assert_eq!(kit::metadata_lines(&text), expected);
    }

    /// The text format a client gets without asking for OpenMetrics: a
    /// Prometheus parser reads it, counters by their `_total` name, with
    /// the build and process series and a family a room declared.
    #[test]
    fn text_fallback_parses_as_prometheus_text() {
        let mut builder = Metrics::builder();
        let counter: kit::CounterU64 = kit::declare(builder.registry(), "things", "Things seen");
        counter.inc();
        let metrics = builder.build();
        let text = metrics.encode_text();
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE splitway_things_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE splitway_build_info gauge\n"),
            "{text}"
        );
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .expect("parses");
        let sample = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let build = sample("splitway_build_info");
        assert_eq!(build.labels.get("version"), Some(crate::build::VERSION));
        assert_eq!(build.labels.get("commit"), Some(crate::build::COMMIT));
        match sample("process_open_fds").value {
            prometheus_parse::Value::Gauge(n) => assert!(n >= 3.0, "{n}"),
            ref other => panic!("{other:?}"),
        }
        assert!(matches!(
            sample("process_cpu_seconds_total").value,
            prometheus_parse::Value::Counter(_)
        ));
        assert!(matches!(
            sample("splitway_things_total").value,
            prometheus_parse::Value::Counter(n) if n == 1.0
        ));
    }

    #[test]
    fn openmetrics_is_served_only_when_asked_for() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(accepts_openmetrics(Some(prometheus)));
        assert!(accepts_openmetrics(Some("Application/OpenMetrics-Text")));
        assert!(!accepts_openmetrics(Some("*/*")));
        assert!(!accepts_openmetrics(Some("text/plain")));
        assert!(!accepts_openmetrics(Some(
            "application/openmetrics-text;q=0"
        )));
        assert!(!accepts_openmetrics(None));
    }
}
