//! The file as written: one struct per TOML table, key for key, with
//! `deny_unknown_fields`. Parsing deserializes each section (and each
//! `[[listen]]`/`[[peer]]`/`[[route]]` element) into these on its own, so one
//! bad element does not hide the others' errors; builders (the lab, bench,
//! soak, tests) fill a [`RawConfig`] and write it with `toml::to_string`
//! instead of formatting TOML by hand.

use serde::{Deserialize, Serialize};

use super::types::{DataPath, Intercept, ListenMode};

/// A whole config file. Unset options are left out when written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psk_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psk_file_previous: Option<String>,
    /// `"off"` (or empty) turns the admin endpoint off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<RawListener>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer: Vec<RawPeer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RawRoute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<RawTuning>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<RawTuning>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<RawTuning>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<RawTimeouts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<RawForwarding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<RawAccel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RawLimits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<RawPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RawTls>,
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
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub mode: ListenMode,
    pub addr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intercept: Option<Intercept>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_clients: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_port: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_sockets: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept_proxy_protocol: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syn_option_prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub watch: Vec<String>,
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
        }
    }
}

/// `[direct]`, `[client]`, `[upstream]`, and the same keys of a `[[peer]]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTuning {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodelay: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sndbuf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcvbuf: Option<u64>,
    /// A duration or `"off"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPeer {
    pub name: String,
    pub addr: String,
    // The leg's tuning keys, as in `RawTuning` (not flattened: serde's
    // flatten cannot deny unknown fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodelay: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sndbuf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcvbuf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<RawPool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccel {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_syn: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_syn_budget: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_syn_expiry: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tfo: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turbo: Option<RawTurbo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_rtt: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_rtt_window: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTurbo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initcwnd: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrwnd: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub dst: String,
    pub via: RawVia,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooled_header: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client: Option<usize>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_destinations: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_destinations: Option<Vec<String>>,
    /// Integers or "first-last" strings; checked one by one so each
    /// error names its element.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_ports: Option<Vec<toml::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_local_destinations: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForwarding {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_path: Option<DataPath>,
}
