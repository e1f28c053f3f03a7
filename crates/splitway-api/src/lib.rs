//! The admin API's answers as types: the relay serialises them, `splitway
//! ctl` and the tests deserialise them.
//!
//! The JSON is the wire format documented in `docs/deployment.md`; the
//! types reproduce it field for field (names, nesting, `null`s), so a
//! client older than these types reads the same documents.
//!
//! Reading is lenient about *missing* fields (every struct defaults them:
//! an older relay sends fewer) and, with the `strict` feature (on in tests),
//! strict about *unknown* ones: a field the relay adds without adding it
//! here fails the round-trip tests instead of being silently dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Declares API structs: serde derives, defaults for missing fields and,
/// under `strict`, no unknown fields.
macro_rules! api {
    ($($item:item)*) => {$(
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        #[cfg_attr(any(test, feature = "strict"), serde(deny_unknown_fields))]
        $item
    )*};
}

api! {
    /// `GET /status`.
    pub struct Status {
        /// The relay's `name`.
        pub name: String,
        pub version: String,
        pub uptime_seconds: f64,
        /// Bumped by every applied reload.
        pub config_generation: u64,
        /// Threads running connections (the config's `workers`, or one
        /// per CPU).
        pub workers: u64,
        pub listeners: Vec<Listener>,
        pub peers: Vec<Peer>,
        pub routes: Vec<Route>,
        /// Early-SYN counters; `null` when the SYN detector is not running.
        pub early_syn: Option<EarlySyn>,
        /// Effective state of each acceleration, by name (`early_syn`,
        /// `tfo_client`, ...): what runs, not what the file asked for.
        pub accel: BTreeMap<String, Accel>,
        /// BPF congestion controls this process registered or shares.
        pub congestion_controls: Vec<CongestionControl>,
        /// What `splitway_resume` learned per peer and did; `null` when it
        /// is not registered on the host.
        pub learned_windows: Option<LearnedWindows>,
        pub features: Features,
        pub connections_open: u64,
        pub limits: Limits,
        pub connections_active: ConnectionsActive,
        /// The log filter, present when the binary lets the admin API change it.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub log_level: Option<String>,
    }

    /// One `[[listen]]` entry.
    pub struct Listener {
        /// `tproxy`, `socks5`, `http_connect`, `peer`, ...
        pub mode: String,
        pub addr: String,
        /// TPROXY interception; `null` without.
        pub intercept: Option<Intercept>,
        /// PROXY protocol versions accepted from clients (`v1`, `v2`).
        pub accept_proxy_protocol: Vec<String>,
        /// One entry per accept socket; `null` for a listener not bound.
        pub accept_paths: Option<Vec<AcceptPath>>,
        /// Users in the listener's `auth_file` (proxy clients must give
        /// one's credentials); `null`: none asked.
        pub users: Option<usize>,
    }

    pub struct Intercept {
        pub interfaces: Vec<String>,
        pub ports: Vec<u16>,
    }

    pub struct AcceptPath {
        /// Connections this accept socket accepted.
        pub accepted: u64,
    }

    /// One `[[peer]]`.
    pub struct Peer {
        pub name: String,
        pub addr: String,
        /// Congestion control on legs to this peer; `null` for the default.
        pub congestion: Option<String>,
        /// `null` when pooling to this peer is off.
        pub pool: Option<Pool>,
    }

    /// A pool of pre-opened relay legs to one peer.
    pub struct Pool {
        /// Idle connections ready to take.
        pub level: u64,
        /// Refill dials under way.
        pub in_flight: u64,
        pub low: u64,
        pub high: u64,
        pub idle_seconds: f64,
        pub taken: u64,
        pub refilled: u64,
        pub dead: u64,
        pub expired: u64,
        pub misses: u64,
        pub dial_failures: u64,
        pub last_error: Option<String>,
    }

    /// One `[[route]]`, in the relay's order.
    pub struct Route {
        pub dst: String,
        /// `direct` or a peer's name.
        pub via: String,
        /// PROXY protocol version sent to the server; `null` for none.
        pub proxy_protocol: Option<String>,
        /// Source address of the server leg: `client` or `relay`.
        pub source: String,
    }

    /// Counters of the running SYN detector.
    pub struct EarlySynStats {
        pub pending: u64,
        pub budget: u64,
        pub markers: u64,
        pub started: u64,
        pub hits: u64,
        pub misses: u64,
        pub duplicates: u64,
        pub over_budget: u64,
        /// Refused by the client prefix's share of the budget.
        pub prefix_over_budget: u64,
        /// That share: early legs one client prefix may hold at once.
        pub prefix_budget: u64,
        pub denied: u64,
        pub expired: u64,
        /// Accepts whose SYN the detector did not report (a near prefix).
        pub near: u64,
        /// Client prefixes whose SYNs the detector only samples.
        pub near_prefixes: u64,
    }

    pub struct Accel {
        /// `auto`, `on` or `off`.
        pub requested: String,
        /// `active`, `unavailable`, `off`, ...
        pub state: String,
        pub reason: String,
    }

    pub struct CongestionControl {
        pub name: String,
        /// `this process` or `another process`.
        pub held_by: String,
        /// Whether the kernel lists it now.
        pub available: bool,
    }

    /// `splitway_resume`'s state. The algorithm is registered machine-wide,
    /// so this is the host's: every relay on it shares the windows and the
    /// counters.
    pub struct LearnedWindows {
        pub events: LearnedWindowEvents,
        /// One entry per peer address a relay leg ran to, newest first.
        pub peers: Vec<LearnedWindow>,
    }

    /// Counters since the algorithm's maps were created.
    pub struct LearnedWindowEvents {
        /// Connections that started from a saved window.
        pub jumps: u64,
        /// Saved windows not used: the RTT no longer matched.
        pub rtt_mismatches: u64,
        /// Jumps whose unvalidated phase ended without a loss.
        pub validated: u64,
        /// Losses in the unvalidated phase: the window retreated and the
        /// peer's entry was forgotten.
        pub retreats: u64,
        /// Windows saved when a connection ended.
        pub saved: u64,
    }

    /// The window saved for one peer address.
    pub struct LearnedWindow {
        pub addr: String,
        /// The `[[peer]]` with this address; `null` for an upstream relay
        /// (its legs are accepted, not dialed).
        pub peer: Option<String>,
        /// The largest final congestion window of the connections that
        /// saved it since the last loss.
        pub cwnd_segments: u64,
        /// The path's bandwidth-delay product without its queue, as the
        /// best-measuring connection since the last loss saw it (its
        /// highest delivery rate, or its largest flight, over its minimum
        /// RTT).
        pub bdp_segments: u64,
        /// What a new leg whose RTT matches `min_rtt_ms` jumps to: the BDP
        /// capped at the cwnd, or half the cwnd where no delivery rate was
        /// measured. A leg with a shorter RTT jumps to a proportionally
        /// smaller window.
        pub jump_segments: u64,
        /// The path's RTT without queueing, as the connection that measured
        /// the BDP saw it.
        pub min_rtt_ms: f64,
        pub age_s: f64,
        /// A saving connection left slow start (a loss or HyStart), so the
        /// window measured the path's capacity rather than how far it grew.
        pub capacity_estimate: bool,
        /// Young enough to be resumed from (at most 600 s).
        pub current: bool,
    }

    /// The older summary of `accel`, kept for existing readers.
    pub struct Features {
        pub data_path: String,
        pub early_syn: bool,
        pub strict: bool,
        pub pool: bool,
        pub tfo: bool,
        /// `null` when 0-RTT is off.
        pub zero_rtt: Option<ZeroRtt>,
        /// `null` when turbo-start is off.
        pub turbo_start: Option<TurboStart>,
    }

    pub struct ZeroRtt {
        pub window_ms: u64,
    }

    pub struct TurboStart {
        pub initcwnd: u32,
        pub initrwnd: u32,
        pub buffer: u64,
        /// Destinations whose routes carry the larger windows.
        pub routes: Vec<String>,
    }

    pub struct Limits {
        /// 0: no limit.
        pub max_connections: u64,
        /// 0: no limit.
        pub per_client: u64,
    }

    /// Active connections by the mode of the listener that accepted them.
    pub struct ConnectionsActive {
        pub tproxy: i64,
        pub socks5: i64,
        pub http_connect: i64,
        pub peer: i64,
    }

    /// `GET /connections?sample=N`.
    pub struct Connections {
        pub total: u64,
        pub by_state: BTreeMap<String, u64>,
        pub by_mode: BTreeMap<String, u64>,
        /// At most N connections, oldest first.
        pub sample: Vec<Connection>,
    }

    pub struct Connection {
        /// Hexadecimal, 16 digits.
        pub id: String,
        pub mode: String,
        pub state: String,
        pub client: String,
        pub dst: String,
        pub age_seconds: f64,
        /// Next hop: a peer relay's name, or `direct` for a server leg;
        /// absent until the next leg is up.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub via: Option<String>,
        /// Bytes forwarded so far each way (absent from relays before
        /// they were counted per connection).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub bytes_to_server: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub bytes_to_client: Option<u64>,
    }

    /// One entry of `GET /params`.
    pub struct Param {
        /// Dotted name, e.g. `pool.rs.low`.
        pub name: String,
        pub kind: ParamKind,
        pub description: String,
        pub value: ParamValue,
    }

    /// `PUT /params` done: the changes that took effect.
    pub struct ParamsChanged {
        pub changed: Vec<ParamChanged>,
    }

    pub struct ParamChanged {
        pub name: String,
        pub old: ParamValue,
        pub new: ParamValue,
    }

    /// `POST /drain`.
    pub struct Drain {
        pub draining: bool,
        /// Connections still open when the drain started.
        pub open_connections: u64,
    }

    /// `POST /reload` done.
    pub struct Reload {
        pub reloaded: bool,
        pub generation: u64,
        /// Keys whose new value is in effect.
        pub changed: Vec<ReloadChange>,
        /// Keys whose new value only a restart applies; their old value stays.
        pub needs_restart: Vec<String>,
    }

    pub struct ReloadChange {
        pub key: String,
        pub old: String,
        pub new: String,
    }

    /// Any error answer (4xx, 5xx).
    pub struct ErrorBody {
        pub error: String,
        /// The HTTP status again.
        pub status: u16,
        /// One per problem: `PUT /params` names each parameter, `POST
        /// /reload` sends the config errors as text. Absent otherwise.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub errors: Option<Vec<ErrorDetail>>,
    }

    /// A refused parameter of `PUT /params`.
    pub struct ParamError {
        pub param: String,
        pub message: String,
    }
}

/// `{"detector": "dead"}`: the SYN detector stopped for good. Outside
/// `api!`: `detector` is required (no `serde(default)`) and other fields
/// are ignored even under `strict`, so that `detector` alone tells it from
/// the counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EarlySynDead {
    pub detector: String,
}

/// `GET /status`'s `early_syn` when the detector runs or has died.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EarlySyn {
    /// Tried first: it has a required field, the counters have none.
    Dead(EarlySynDead),
    Running(EarlySynStats),
}

/// A parameter's type and range (`{"type": "int", "min": 0, "max": 4096}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ParamKind {
    #[default]
    Bool,
    Int {
        min: i64,
        max: i64,
    },
    /// Bounds as written (`"500ms"`, `"1h"`).
    Duration {
        min: String,
        max: String,
    },
    Choice {
        choices: Vec<String>,
    },
    Text {
        max_len: u64,
    },
    /// A kind newer than this client.
    #[serde(other)]
    Unknown,
}

/// The `PUT /params` body: parameter name to new value
/// (`{"pool.rs.low": 8, "timeouts.idle": "5m"}`).
pub type ParamsUpdate = BTreeMap<String, ParamValue>;

/// A parameter's value: durations travel as text (`"30s"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Text(String),
}

impl Default for ParamValue {
    fn default() -> Self {
        ParamValue::Text(String::new())
    }
}

impl std::fmt::Display for ParamValue {
    /// Booleans as `on`/`off`, as `splitway ctl set` takes them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Bool(true) => f.write_str("on"),
            ParamValue::Bool(false) => f.write_str("off"),
            ParamValue::Int(n) => write!(f, "{n}"),
            ParamValue::Text(s) => f.write_str(s),
        }
    }
}

/// An entry of [`ErrorBody::errors`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErrorDetail {
    Param(ParamError),
    Text(String),
}

impl std::fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorDetail::Param(e) => write!(f, "{}: {}", e.param, e.message),
            ErrorDetail::Text(s) => f.write_str(s),
        }
    }
}

api! {
    /// `GET /routes`: every route in config order with its candidates as
    /// measured (`docs/paths.md`).
    pub struct RoutesView {
        /// The least time between two changes of a route's choice, unless
        /// the chosen candidate goes down.
        pub hold_s: u64,
        pub probe_every_s: f64,
        pub routes: Vec<RouteView>,
    }

    pub struct RouteView {
        pub index: usize,
        pub dst: String,
        /// The candidate new connections go to.
        pub chosen: String,
        /// More than one candidate: measured, probed and chosen among.
        pub probed: bool,
        pub flips: u64,
        pub changed_s_ago: Option<f64>,
        pub candidates: Vec<CandidateView>,
    }

    pub struct CandidateView {
        pub name: String,
        /// `up`, `down` or `unknown` (not measured yet).
        pub state: String,
        pub estimate_ms: Option<f64>,
        pub leg_rtt_ms: Option<f64>,
        pub onward_ms: Option<f64>,
        pub retrans_per_leg: Option<f64>,
        /// Retransmitted segments per segment sent on sampled legs, recent
        /// ones weighing most; it adds to `estimate_ms`.
        #[serde(default)]
        pub loss: Option<f64>,
        pub probes: u64,
        pub down_reason: Option<String>,
        /// The window learned on legs to this peer; `null` for `direct`,
        /// or when nothing is learned (yet).
        #[serde(default)]
        pub learned_window: Option<LearnedWindow>,
    }
}

api! {
    /// What `splitway ctl routes --json` prints: the routing table and
    /// peers of `GET /status`, and `GET /routes` (`null` from a relay
    /// without path choice).
    pub struct RoutesReport {
        pub routes: Vec<Route>,
        pub peers: Vec<Peer>,
        pub paths: Option<RoutesView>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Reads a wire document and checks that writing it gives it back.
    fn round_trip<T: Serialize + for<'de> Deserialize<'de>>(text: &str) -> T {
        let doc: Value = serde_json::from_str(text).expect("a JSON fixture");
        let typed: T = serde_json::from_value(doc.clone()).expect("deserialises");
        assert_eq!(serde_json::to_value(&typed).unwrap(), doc, "same JSON back");
        typed
    }

    #[test]
    fn early_syn_dead_and_running_are_told_apart() {
        let dead: EarlySyn = round_trip(r#"{"detector": "dead"}"#);
        assert!(matches!(dead, EarlySyn::Dead(_)));
        let running: EarlySyn = round_trip(
            r#"{"pending": 1, "budget": 1024, "markers": 0, "started": 5, "hits": 4,
                "misses": 1, "duplicates": 0, "over_budget": 0, "prefix_over_budget": 3,
                "prefix_budget": 128, "denied": 0, "expired": 0, "near": 7, "near_prefixes": 1}"#,
        );
        assert!(
            matches!(running, EarlySyn::Running(s) if s.hits == 4 && s.prefix_over_budget == 3)
        );
    }

    /// Without `strict` (as `splitway ctl` reads), counters must still not
    /// read as a dead detector: `detector` is required.
    #[test]
    fn counters_without_detector_are_not_dead() {
        let running: EarlySyn = serde_json::from_str(r#"{"pending": 1}"#).unwrap();
        assert!(matches!(running, EarlySyn::Running(_)), "{running:?}");
    }

    #[test]
    fn params_and_errors_keep_their_shapes() {
        let params: Vec<Param> = round_trip(
            r#"[
            {"name": "pool.rs.low", "kind": {"type": "int", "min": 0, "max": 4096},
             "description": "refill below this", "value": 4},
            {"name": "timeouts.idle", "kind": {"type": "duration", "min": "1s", "max": "1d"},
             "description": "idle", "value": "5m"},
            {"name": "early_syn", "kind": {"type": "bool"}, "description": "x", "value": true}
        ]"#,
        );
        assert_eq!(params[0].value, ParamValue::Int(4));
        assert_eq!(params[2].value.to_string(), "on");
        let errors: ErrorBody = round_trip(
            r#"{"error": "invalid parameters, nothing changed", "status": 400,
                "errors": [{"param": "pool.rx.low", "message": "unknown parameter"}, "line 3: bad"]}"#,
        );
        let lines: Vec<String> = errors
            .errors
            .unwrap()
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(lines, ["pool.rx.low: unknown parameter", "line 3: bad"]);
        let plain: ErrorBody = round_trip(r#"{"error": "no such endpoint", "status": 404}"#);
        assert!(plain.errors.is_none());
    }

    #[test]
    fn unknown_fields_are_refused_under_strict() {
        let err = serde_json::from_str::<Drain>(
            r#"{"draining": true, "open_connections": 1, "new_field": 2}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("new_field"), "{err}");
    }

    #[test]
    fn unknown_param_kinds_still_read() {
        let kind: ParamKind = serde_json::from_str(r#"{"type": "ratio"}"#).unwrap();
        assert_eq!(kind, ParamKind::Unknown);
    }
}
