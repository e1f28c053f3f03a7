//! The file as written: one struct per TOML table, key for key, with
//! `deny_unknown_fields`. Parsing deserializes each section (and each
//! `[[listen]]`/`[[peer]]`/`[[route]]` element) into these on its own, so one
//! bad element does not hide the others' errors; builders (the lab, bench,
//! soak, tests) fill a [`RawConfig`] and write it with `toml::to_string`
//! instead of formatting TOML by hand. (`toml` leaves `None` fields out
//! by itself, and serde's derive reads missing `Option`s as `None`.)

use serde::{Deserialize, Serialize};

use super::types::{AccessLogFormat, DataPath, Intercept, ListenMode};

/// A whole config file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub name: String,
    pub psk_file: Option<String>,
    pub psk_file_previous: Option<String>,
    /// `"off"` (or empty) turns the admin endpoint off.
    pub admin: Option<String>,
    /// A second address serving only `GET /metrics` (absent: the metrics
    /// are on the admin address only).
    pub metrics: Option<String>,
    pub workers: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<RawListener>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer: Vec<RawPeer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RawRoute>,
    pub direct: Option<RawTuning>,
    pub client: Option<RawTuning>,
    pub upstream: Option<RawTuning>,
    pub timeouts: Option<RawTimeouts>,
    pub forwarding: Option<RawForwarding>,
    pub accel: Option<RawAccel>,
    pub limits: Option<RawLimits>,
    pub policy: Option<RawPolicy>,
    pub tls: Option<RawTls>,
    pub access_log: Option<RawAccessLog>,
}

impl RawConfig {
    /// The file's text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a RawConfig always serializes")
    }
}

/// The top-level keys, in [`RawConfig`]'s order.
pub(super) const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "psk_file",
    "psk_file_previous",
    "admin",
    "metrics",
    "workers",
    "listen",
    "peer",
    "route",
    "direct",
    "client",
    "upstream",
    "timeouts",
    "forwarding",
    "accel",
    "limits",
    "policy",
    "tls",
    "access_log",
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub mode: ListenMode,
    pub addr: String,
    pub intercept: Option<Intercept>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_clients: Vec<String>,
    pub tls: Option<bool>,
    pub reuse_port: Option<bool>,
    pub accept_sockets: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept_proxy_protocol: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syn_option_prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub watch: Vec<String>,
    pub auth_file: Option<String>,
}

impl RawListener {
    /// A listener with only its mode and address set.
    pub fn new(mode: ListenMode, addr: impl Into<String>) -> RawListener {
        RawListener {
            mode,
            addr: addr.into(),
            intercept: None,
            allow_clients: Vec::new(),
            tls: None,
            reuse_port: None,
            accept_sockets: None,
            accept_proxy_protocol: Vec::new(),
            syn_option_prefixes: Vec::new(),
            watch: Vec::new(),
            auth_file: None,
        }
    }
}

/// `[direct]`, `[client]`, `[upstream]`, and the same keys of a `[[peer]]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTuning {
    pub congestion: Option<String>,
    pub nodelay: Option<bool>,
    pub sndbuf: Option<u64>,
    pub rcvbuf: Option<u64>,
    /// A duration or `"off"`.
    pub keepalive: Option<String>,
    /// TCP_USER_TIMEOUT: a duration or `"off"`.
    pub user_timeout: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPeer {
    pub name: String,
    pub addr: String,
    // The leg's tuning keys, as in `RawTuning` (not flattened: serde's
    // flatten cannot deny unknown fields).
    pub congestion: Option<String>,
    pub nodelay: Option<bool>,
    pub sndbuf: Option<u64>,
    pub rcvbuf: Option<u64>,
    pub keepalive: Option<String>,
    pub user_timeout: Option<String>,
    pub pool: Option<RawPool>,
    pub tls: Option<bool>,
    pub server_name: Option<String>,
}

impl RawPeer {
    pub fn new(name: impl Into<String>, addr: impl Into<String>) -> RawPeer {
        RawPeer {
            name: name.into(),
            addr: addr.into(),
            congestion: None,
            nodelay: None,
            sndbuf: None,
            rcvbuf: None,
            keepalive: None,
            user_timeout: None,
            pool: None,
            tls: None,
            server_name: None,
        }
    }

    /// The leg's tuning keys.
    pub fn tuning(&self) -> RawTuning {
        RawTuning {
            congestion: self.congestion.clone(),
            nodelay: self.nodelay,
            sndbuf: self.sndbuf,
            rcvbuf: self.rcvbuf,
            keepalive: self.keepalive.clone(),
            user_timeout: self.user_timeout.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    pub low: Option<usize>,
    pub high: Option<usize>,
    pub idle: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccel {
    pub early_syn: Option<bool>,
    pub early_syn_budget: Option<usize>,
    pub early_syn_prefix_budget: Option<usize>,
    pub early_syn_expiry: Option<String>,
    pub strict: Option<bool>,
    pub pool: Option<bool>,
    pub tfo: Option<bool>,
    pub turbo: Option<RawTurbo>,
    pub zero_rtt: Option<bool>,
    pub zero_rtt_window: Option<String>,
    pub learned_window: Option<bool>,
    pub loss_isolation: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTurbo {
    pub initcwnd: Option<u32>,
    pub initrwnd: Option<u32>,
    pub buffer: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub dst: String,
    pub via: RawVia,
    pub proxy_protocol: Option<String>,
    pub source: Option<String>,
}

impl RawRoute {
    /// `dst` through one hop (`"direct"` or a peer's name).
    pub fn new(dst: impl Into<String>, via: impl Into<String>) -> RawRoute {
        RawRoute {
            dst: dst.into(),
            via: RawVia::One(via.into()),
            proxy_protocol: None,
            source: None,
        }
    }
}

/// `via = "rs1"` or `via = ["rs1", "rs2", "direct"]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RawVia {
    One(String),
    Many(Vec<String>),
}

impl RawVia {
    pub fn names(&self) -> Vec<&str> {
        match self {
            RawVia::One(s) => vec![s.as_str()],
            RawVia::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTimeouts {
    pub connect: Option<String>,
    pub handshake: Option<String>,
    pub idle: Option<String>,
    pub pooled_header: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_connections: Option<usize>,
    pub per_client: Option<usize>,
    pub handshaking_per_client: Option<usize>,
    pub credential_failures: Option<usize>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    pub allow_destinations: Option<Vec<String>>,
    pub deny_destinations: Option<Vec<String>>,
    /// Integers or "first-last" strings; checked one by one so each
    /// error names its element.
    pub allow_ports: Option<Vec<toml::Value>>,
    pub allow_local_destinations: Option<bool>,
    pub allow_link_local: Option<bool>,
    pub allow_host_addresses: Option<bool>,
    pub allow_relay_clients: Option<bool>,
}

/// `[access_log]`: one line per closed connection.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    /// The file lines are appended to.
    pub path: String,
    /// `text` (the default) or `json`.
    pub format: Option<AccessLogFormat>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForwarding {
    pub data_path: Option<DataPath>,
}
