//! The relay's Prometheus metrics.
//!
//! Every label value is a closed Rust enum (or, for `peer`, a name taken from
//! the configuration), so the number of series is fixed by the code and the
//! config, never by traffic. Addresses never become label values.
//!
//! All enum-labelled series are created up front and their handles kept in
//! arrays indexed by the enum, so a hot-path update is one atomic add: no
//! hashing, no lock, no allocation. Creating them up front also exports every
//! series as `0` from the first scrape, which `rate()` needs.
//!
//! Each family is declared (name, help, labels) in the submodule of the
//! relay area that counts it, as a handle type with a `register` function;
//! [`Metrics::new`] only assembles them into one registry. An acceleration
//! with a room of its own in `splitway-relay` declares its families there,
//! with [`label_enum!`](crate::label_enum) and the helpers of [`kit`], into
//! [`MetricsBuilder::registry`] (issue #31: this crate is to know no relay
//! word; the families still here move as their areas get rooms).

use std::fmt;
use std::time::Duration;

use prometheus_client::registry::Registry;

/// Prefix of every metric name this crate exports.
pub const METRIC_PREFIX: &str = "splitway";

// First, for its `label_enum!` to be in scope in the modules below (the
// macro is exported at the crate root for the relay's rooms).
#[macro_use]
mod family;

mod connections;
/// What a room's metrics module uses besides [`label_enum!`](crate::label_enum):
/// [`EnumCounter`](kit::EnumCounter), a counter family with one enum label
/// (the enum led by `label "name";`), and `missing_lines` for its test; for
/// other shapes the counter type, the up-front series and the declaration
/// helper.
pub mod kit {
    pub use super::family::{
        CounterU64, EnumCounter, Keyed, LabelEnum, declare, missing_lines, series,
    };
}
mod forward;
mod peer;
mod process;

pub use connections::{
    ActiveGuard, CloseReason, ConnectionMetrics, DenyReason, Mode, SETUP_SECONDS_BUCKETS,
};
pub use forward::{Direction, ForwardMetrics, Leg, Path};
pub use peer::{AuthFailureReason, LegSide, PeerHandshake, PeerLabels, PeerMetrics};
pub use process::{ProcessCollector, ProcessSample};

/// The relay's metrics registry. Create once, share as `Arc<Metrics>`.
///
/// Exported families (all prefixed `splitway_`), by the submodule that
/// declares them:
///
/// | name | type | labels | declared in |
/// | --- | --- | --- | --- |
/// | `connections_accepted_total` | counter | `mode` | `connections` |
/// | `connections_active` | gauge | `mode` | `connections` |
/// | `connections_closed_total` | counter | `mode`, `reason` | `connections` |
/// | `denied_total` | counter | `reason` | `connections` |
/// | `accept_errors_total` | counter | `mode` | `connections` |
/// | `setup_seconds` | histogram | `mode` | `connections` |
/// | `peer_auth_failures_total` | counter | `reason` | `peer` |
/// | `peer_connect_failures_total` | counter | `peer` (config names) | `peer` |
/// | `peer_handshakes_total` | counter | `side`, `handshake` | `peer` |
/// | `forwarded_bytes_total` | counter | `direction`, `path` | `forward` |
/// | `leg_sent_bytes_total` | counter | `leg`, `direction` | `forward` |
/// | `data_path_chosen_total` | counter | `path` | `forward` |
pub struct Metrics {
    registry: Registry,
    connections: ConnectionMetrics,
    peers: PeerMetrics,
    forward: ForwardMetrics,
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
        let registry = &mut *registry;
        // Handles are Arc-backed: a clone updates the series in the registry.
        let metrics = Self {
            connections: ConnectionMetrics::register(registry),
            peers: PeerMetrics::register(registry),
            forward: ForwardMetrics::register(registry),
            registry: Registry::default(),
        };
        Self {
            registry: root,
            ..metrics
        }
    }

    /// Counts a connection accepted in `mode`.
    pub fn accepted(&self, mode: Mode) {
        self.connections.accepted(mode);
    }

    /// Counts a connection as active in `mode` until the guard is dropped.
    pub fn active(&self, mode: Mode) -> ActiveGuard {
        self.connections.active(mode)
    }

    /// Counts a connection in `mode` closed for `reason`.
    pub fn closed(&self, mode: Mode, reason: CloseReason) {
        self.connections.closed(mode, reason);
    }

    /// Counts a connection refused by policy or limits. The caller also
    /// counts it closed with [`CloseReason::NotAllowed`].
    pub fn denied(&self, reason: DenyReason) {
        self.connections.denied(reason);
    }

    /// Counts a failed `accept()` on a listener of `mode`.
    pub fn accept_error(&self, mode: Mode) {
        self.connections.accept_error(mode);
    }

    /// Counts a failed peer authentication.
    pub fn auth_failure(&self, reason: AuthFailureReason) {
        self.peers.auth_failure(reason);
    }

    /// Adds `n` bytes forwarded in `direction` over `path`.
    pub fn bytes(&self, direction: Direction, path: Path, n: u64) {
        self.forward.bytes(direction, path, n);
    }

    /// Adds `n` bytes written to a leg of kind `leg` in `direction`.
    ///
    /// Counted where the relay writes, so every forwarded byte is counted
    /// once per leg it leaves on: on a client relay, `{leg="peer",
    /// direction="to_server"}` is the upload carried over the long haul and
    /// `{leg="client", direction="to_client"}` the download delivered.
    pub fn leg_bytes(&self, leg: Leg, direction: Direction, n: u64) {
        self.forward.leg_bytes(leg, direction, n);
    }

    /// Counts one connection direction that moved data over `path`.
    pub fn data_path_chosen(&self, path: Path) {
        self.forward.data_path_chosen(path);
    }

    /// Records the time from accept until the next leg was connected.
    pub fn observe_setup(&self, mode: Mode, elapsed: Duration) {
        self.connections.observe_setup(mode, elapsed);
    }

    /// Creates the `peer_connect_failures_total` series for a configured
    /// peer at zero, so it is exported before the first event.
    ///
    /// `peer` must be a peer name from the configuration (see [`PeerLabels`]).
    pub fn register_peer(&self, peer: &str) {
        self.peers.register_peer(peer);
    }

    /// Counts a failed connect to the configured peer named `peer`.
    ///
    /// `peer` must be a peer name from the configuration (see [`PeerLabels`]).
    /// Allocates a label set: failures are off the hot path.
    pub fn peer_connect_failure(&self, peer: &str) {
        self.peers.connect_failure(peer);
    }

    /// Counts how a peer leg was authenticated.
    pub fn peer_handshake(&self, side: LegSide, handshake: PeerHandshake) {
        self.peers.handshake(side, handshake);
    }

    /// Current `connections_active{mode}` value.
    pub fn active_count(&self, mode: Mode) -> i64 {
        self.connections.active_count(mode)
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
        assert_send_sync::<ActiveGuard>();
    }

    #[test]
    fn label_values_are_snake_case_and_unique() {
        fn check(values: &[&str]) {
            for value in values {
                assert!(
                    value
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                    "{value} is not snake_case"
                );
            }
            let mut sorted = values.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                values.len(),
                "duplicate label value in {values:?}"
            );
        }
        check(&Mode::ALL.map(Mode::as_str));
        check(&CloseReason::ALL.map(CloseReason::as_str));
        check(&AuthFailureReason::ALL.map(AuthFailureReason::as_str));
        check(&DenyReason::ALL.map(DenyReason::as_str));
        check(&Direction::ALL.map(Direction::as_str));
        check(&Path::ALL.map(Path::as_str));
        check(&Leg::ALL.map(Leg::as_str));
        assert_eq!(Mode::HttpConnect.to_string(), "http_connect");
        assert_eq!(CloseReason::COUNT, 15);
        assert_eq!(AuthFailureReason::COUNT, 8);
    }

    #[test]
    fn index_matches_position_in_all() {
        for (position, mode) in Mode::ALL.into_iter().enumerate() {
            assert_eq!(mode.index(), position);
        }
        for (position, reason) in CloseReason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), position);
        }
    }

    /// Every family's name, type, unit and help text, byte for byte: they
    /// are declared across the submodules, and dashboards, the README and
    /// the integration tests read them.
    #[test]
    fn family_metadata_is_unchanged() {
        let text = Metrics::new().encode();
        let mut meta: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("# ") && *l != "# EOF")
            .collect();
        meta.sort_unstable();
        let expected = [
            "# HELP process_cpu_seconds User and system CPU time spent, in seconds.",
            "# HELP process_max_fds The limit of open file descriptors (RLIMIT_NOFILE, soft).",
            "# HELP process_open_fds Open file descriptors (sockets, pipes, files).",
            "# HELP process_resident_memory_bytes Resident memory size in bytes.",
            "# HELP process_start_time_seconds Start time of the process since the Unix epoch, in seconds.",
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.",
            "# HELP splitway_accept_errors Failed accept() calls (e.g. out of file descriptors), by listener mode.",
            "# HELP splitway_build This build: its version and git commit (value 1).",
            "# HELP splitway_connections_accepted Connections accepted, by how they arrived.",
            "# HELP splitway_connections_active Connections currently being relayed.",
            "# HELP splitway_connections_closed Connections closed, by mode and reason.",
            "# HELP splitway_data_path_chosen Connection directions that moved data, by data path.",
            "# HELP splitway_denied Connections refused by access policy or connection limits, by reason.",
            "# HELP splitway_forwarded_bytes Bytes forwarded, by direction and data path.",
            "# HELP splitway_leg_sent_bytes Bytes the relay wrote to its legs, by leg kind and direction.",
            "# HELP splitway_peer_auth_failures Peer relay authentication failures, by reason.",
            "# HELP splitway_peer_connect_failures Failed connects to a configured peer relay, by peer name.",
            "# HELP splitway_peer_handshakes Peer legs by how they were authenticated, on the dialing and the accepting end.",
            "# HELP splitway_setup_seconds Time from accept until the next leg is connected.",
            "# TYPE process_cpu_seconds counter",
            "# TYPE process_max_fds gauge",
            "# TYPE process_open_fds gauge",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_start_time_seconds gauge",
            "# TYPE process_virtual_memory_bytes gauge",
            "# TYPE splitway_accept_errors counter",
            "# TYPE splitway_build info",
            "# TYPE splitway_connections_accepted counter",
            "# TYPE splitway_connections_active gauge",
            "# TYPE splitway_connections_closed counter",
            "# TYPE splitway_data_path_chosen counter",
            "# TYPE splitway_denied counter",
            "# TYPE splitway_forwarded_bytes counter",
            "# TYPE splitway_leg_sent_bytes counter",
            "# TYPE splitway_peer_auth_failures counter",
            "# TYPE splitway_peer_connect_failures counter",
            "# TYPE splitway_peer_handshakes counter",
            "# TYPE splitway_setup_seconds histogram",
            "# UNIT splitway_leg_sent_bytes bytes",
            "# UNIT splitway_setup_seconds seconds",
        ];
        assert_eq!(meta, expected);
    }

    /// The text format a client gets without asking for OpenMetrics: a
    /// Prometheus parser reads it, counters by their `_total` name, with
    /// the build and process series.
    #[test]
    fn text_fallback_parses_as_prometheus_text() {
        let metrics = Metrics::new();
        metrics.accepted(Mode::Socks5);
        let text = metrics.encode_text();
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE splitway_connections_accepted_total counter\n"),
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
        assert!(
            scrape
                .samples
                .iter()
                .any(|s| s.metric == "splitway_connections_accepted_total"
                    && matches!(s.value, prometheus_parse::Value::Counter(n) if n == 1.0)),
            "{text}"
        );
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

    #[test]
    fn active_guard_decrements_on_drop() {
        let metrics = Metrics::new();
        let first = metrics.active(Mode::Socks5);
        let second = metrics.active(Mode::Socks5);
        assert_eq!(metrics.active_count(Mode::Socks5), 2);
        assert_eq!(metrics.active_count(Mode::Tproxy), 0);
        drop(first);
        assert_eq!(metrics.active_count(Mode::Socks5), 1);
        drop(second);
        assert_eq!(metrics.active_count(Mode::Socks5), 0);
    }

    #[test]
    fn encode_names_every_family_and_ends_with_eof() {
        let metrics = Metrics::new();
        metrics.register_peer("tokyo");
        let text = metrics.encode();
        for family in [
            "splitway_connections_accepted_total{mode=\"http_connect\"} 0",
            "splitway_connections_active{mode=\"peer\"} 0",
            "splitway_connections_closed_total{mode=\"tproxy\",reason=\"ttl_exceeded\"} 0",
            "splitway_peer_auth_failures_total{reason=\"bad_mac\"} 0",
            "splitway_denied_total{reason=\"port\"} 0",
            "splitway_accept_errors_total{mode=\"socks5\"} 0",
            "splitway_forwarded_bytes_total{direction=\"to_client\",path=\"splice\"} 0",
            "splitway_data_path_chosen_total{path=\"copy\"} 0",
            "splitway_setup_seconds_count{mode=\"socks5\"} 0",
            "splitway_peer_connect_failures_total{peer=\"tokyo\"} 0",
            "# UNIT splitway_setup_seconds seconds",
            "splitway_leg_sent_bytes_total{leg=\"direct\",direction=\"to_server\"} 0",
        ] {
            assert!(text.contains(family), "missing {family:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn denials_and_accept_errors_land_in_their_series_only() {
        let metrics = Metrics::new();
        metrics.denied(DenyReason::Port);
        metrics.denied(DenyReason::Port);
        metrics.denied(DenyReason::Downstream);
        metrics.accept_error(Mode::Peer);
        let text = metrics.encode();
        for line in [
            "splitway_denied_total{reason=\"port\"} 2",
            "splitway_denied_total{reason=\"downstream\"} 1",
            "splitway_denied_total{reason=\"destination\"} 0",
            "splitway_accept_errors_total{mode=\"peer\"} 1",
            "splitway_accept_errors_total{mode=\"tproxy\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn leg_bytes_land_in_their_series_only() {
        let metrics = Metrics::new();
        metrics.leg_bytes(Leg::Peer, Direction::ToServer, 1000);
        metrics.leg_bytes(Leg::Peer, Direction::ToServer, 24);
        metrics.leg_bytes(Leg::Client, Direction::ToClient, 7);
        let text = metrics.encode();
        for line in [
            "splitway_leg_sent_bytes_total{leg=\"peer\",direction=\"to_server\"} 1024",
            "splitway_leg_sent_bytes_total{leg=\"client\",direction=\"to_client\"} 7",
            "splitway_leg_sent_bytes_total{leg=\"peer\",direction=\"to_client\"} 0",
            "splitway_leg_sent_bytes_total{leg=\"direct\",direction=\"to_server\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }
}
