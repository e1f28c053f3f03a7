//! The relay's own metric families, declared in splitway-control's
//! registry with its kit (issue #31: splitway-control knows no relay word):
//! connections (`connections`: accepted, active, closed, denied, accept
//! errors, setup time), peer legs (`peer`: authentication failures,
//! connect failures, handshakes) and bytes (`forward`: forwarded, sent per
//! leg, data path chosen). The rooms declare theirs in their own folders
//! into [`MetricsBuilder::registry`]; [`Metrics`] is what every part of the
//! relay counts through, and what `/metrics` serves ([`Metrics::served`]).
//!
//! Every label value is a closed enum (or, for `peer`, a name from the
//! configuration), so the number of series is fixed by the code and the
//! config, never by traffic. Enum-labelled series are created up front and
//! kept as handles: a hot-path update is one atomic add.

mod connections;
mod forward;
mod peer;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

pub use connections::{
    ActiveGuard, CloseReason, ConnectionMetrics, DenyReason, Mode, SETUP_SECONDS_BUCKETS,
};
pub use forward::{Direction, ForwardMetrics, Leg, Path};
pub(crate) use peer::auth_reason;
pub use peer::{AuthFailureReason, LegSide, PeerHandshake, PeerLabels, PeerMetrics};

/// The relay's metrics: splitway-control's registry (process and build
/// series, the rooms' families) with the relay's own families. Create once
/// (`relay::metrics_with_rooms`), share as `Arc<Metrics>`.
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
///
/// The accelerations' families (`zero_rtt_total`, `early_syn_total`,
/// `strict_syn_total`, `accel_state`, the pools', paths', learned windows',
/// loss isolation's and PROXY refusals') are declared in their rooms, in
/// `relay::metrics_with_rooms`.
#[derive(Debug)]
pub struct Metrics {
    served: Arc<splitway_control::Metrics>,
    connections: ConnectionMetrics,
    peers: PeerMetrics,
    forward: ForwardMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A registry being assembled: the rooms declare their families in
/// [`MetricsBuilder::registry`] before [`MetricsBuilder::build`] freezes it.
pub struct MetricsBuilder {
    registry: splitway_control::metrics::MetricsBuilder,
    connections: ConnectionMetrics,
    peers: PeerMetrics,
    forward: ForwardMetrics,
}

impl MetricsBuilder {
    /// Where a room declares its families (under the `splitway_` prefix).
    pub fn registry(&mut self) -> &mut Registry {
        self.registry.registry()
    }

    pub fn build(self) -> Metrics {
        Metrics {
            served: Arc::new(self.registry.build()),
            connections: self.connections,
            peers: self.peers,
            forward: self.forward,
        }
    }
}

impl Metrics {
    /// The relay's families declared (every enum-labelled series at zero),
    /// open for the rooms'.
    pub fn builder() -> MetricsBuilder {
        let mut registry = splitway_control::Metrics::builder();
        let r = registry.registry();
        // Handles are Arc-backed: a clone updates the series in the registry.
        let connections = ConnectionMetrics::register(r);
        let peers = PeerMetrics::register(r);
        let forward = ForwardMetrics::register(r);
        MetricsBuilder {
            registry,
            connections,
            peers,
            forward,
        }
    }

    /// The relay's families alone (tests).
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// What the admin server's `GET /metrics` encodes: the whole registry.
    pub fn served(&self) -> Arc<splitway_control::Metrics> {
        Arc::clone(&self.served)
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

    /// The whole registry in Prometheus's text format.
    pub fn encode_text(&self) -> String {
        self.served.encode_text()
    }

    /// The whole registry in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        self.served.encode()
    }
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
        use splitway_control::metrics::kit::metadata_lines;
        let text = Metrics::new().encode();
        // The process's and the build's lines, which splitway-control pins.
        let base = splitway_control::Metrics::new().encode();
        let mut expected = metadata_lines(&base);
        expected.extend([
            "# HELP splitway_accept_errors Failed accept() calls (e.g. out of file descriptors), by listener mode.",
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
            "# TYPE splitway_accept_errors counter",
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
        ]);
        expected.sort_unstable();
        assert_eq!(metadata_lines(&text), expected);
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

    /// The value of the one series `name{labels}` in OpenMetrics `text`
    /// (labels in any order, no others).
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<f64> = text
            .lines()
            .filter_map(|line| {
                let (series, number) = line.rsplit_once(' ')?;
                let inner = series
                    .strip_prefix(name)?
                    .strip_prefix('{')?
                    .strip_suffix('}')?;
                let pairs: Vec<&str> = inner.split(',').collect();
                let all = pairs.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| pairs.contains(&format!("{k}=\"{v}\"").as_str()));
                all.then(|| number.parse().expect("a number"))
            })
            .collect();
        assert_eq!(matching.len(), 1, "{name}{labels:?} in:\n{text}");
        matching[0]
    }

    /// What the relay counts lands in its own series, histogram buckets
    /// included (the admin server's own test serves such a registry over
    /// HTTP to a Prometheus parser).
    #[test]
    fn counted_values_land_in_their_series() {
        let metrics = Metrics::new();
        for _ in 0..3 {
            metrics.accepted(Mode::Tproxy);
        }
        let _active = [
            metrics.active(Mode::HttpConnect),
            metrics.active(Mode::HttpConnect),
        ];
        metrics.closed(Mode::Socks5, CloseReason::ConnectTimeout);
        metrics.closed(Mode::Socks5, CloseReason::ConnectTimeout);
        for _ in 0..5 {
            metrics.auth_failure(AuthFailureReason::BadMac);
        }
        metrics.bytes(Direction::ToServer, Path::Splice, 1_000_000);
        metrics.bytes(Direction::ToClient, Path::Copy, 1234);
        metrics.bytes(Direction::ToClient, Path::Copy, 1234);
        metrics.data_path_chosen(Path::Splice);
        metrics.observe_setup(Mode::Tproxy, Duration::from_micros(300));
        metrics.observe_setup(Mode::Tproxy, Duration::from_secs(3));
        metrics.register_peer("osaka");
        metrics.peer_connect_failure("tokyo");
        metrics.peer_connect_failure("tokyo");
        let text = metrics.encode();
        let accepted = "splitway_connections_accepted_total";
        assert_eq!(value(&text, accepted, &[("mode", "tproxy")]), 3.0);
        assert_eq!(value(&text, accepted, &[("mode", "socks5")]), 0.0);
        let active = "splitway_connections_active";
        assert_eq!(value(&text, active, &[("mode", "http_connect")]), 2.0);
        let closed = "splitway_connections_closed_total";
        let timeout = [("mode", "socks5"), ("reason", "connect_timeout")];
        assert_eq!(value(&text, closed, &timeout), 2.0);
        let auth = "splitway_peer_auth_failures_total";
        assert_eq!(value(&text, auth, &[("reason", "bad_mac")]), 5.0);
        let bytes = "splitway_forwarded_bytes_total";
        let splice = [("direction", "to_server"), ("path", "splice")];
        assert_eq!(value(&text, bytes, &splice), 1_000_000.0);
        let copy = [("direction", "to_client"), ("path", "copy")];
        assert_eq!(value(&text, bytes, &copy), 2468.0);
        let chosen = "splitway_data_path_chosen_total";
        assert_eq!(value(&text, chosen, &[("path", "splice")]), 1.0);
        let failures = "splitway_peer_connect_failures_total";
        assert_eq!(value(&text, failures, &[("peer", "tokyo")]), 2.0);
        assert_eq!(value(&text, failures, &[("peer", "osaka")]), 0.0);
        let tproxy = [("mode", "tproxy")];
        assert_eq!(value(&text, "splitway_setup_seconds_count", &tproxy), 2.0);
        let sum = value(&text, "splitway_setup_seconds_sum", &tproxy);
        assert!((sum - 3.0003).abs() < 1e-9, "sum {sum}");
        let bucket = |le: &str| {
            value(
                &text,
                "splitway_setup_seconds_bucket",
                &[("mode", "tproxy"), ("le", le)],
            )
        };
        assert_eq!(bucket("0.00025"), 0.0);
        assert_eq!(bucket("0.0005"), 1.0);
        assert_eq!(bucket("2.5"), 1.0);
        assert_eq!(bucket("5.0"), 2.0);
        assert_eq!(bucket("+Inf"), 2.0);
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
