//! The relay's TOML configuration: parsing and whole-file validation.
//!
//! Each section (and each element of `[[listen]]`, `[[peer]]`, `[[route]]`)
//! is deserialized on its own with `deny_unknown_fields`, so one bad element
//! does not hide the errors of the others; then the parsed values are
//! checked together (names, addresses, prefixes, cross-references). Every
//! problem is reported at once, each with the key that caused it.

use std::collections::HashSet;
use std::fmt;
use std::io::Read;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use splitway_proto::auth::Psk;

use crate::policy::{Policy, is_host_local};
use crate::tls::{self, PeerTls, TlsContext};

/// Default admin address (loopback only).
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9090";

/// A fully validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub psk_file: Option<PathBuf>,
    /// Loaded and checked at validation time; `None` when no peer leg exists.
    pub psk: Option<Psk>,
    /// A second key a peer listener also accepts during a key rollover
    /// (`psk_file_previous`); dialers always use `psk`.
    pub psk_previous: Option<Psk>,
    pub admin: Option<SocketAddr>,
    pub listeners: Vec<Listener>,
    pub peers: Vec<Peer>,
    pub routes: Vec<Route>,
    pub direct: LegTuning,
    pub client: LegTuning,
    /// Legs accepted from upstream relays: this relay sends the downloads
    /// on them, so their congestion control is chosen here (`[upstream]`),
    /// as `[[peer]]` chooses it for the legs this relay dials.
    pub upstream: LegTuning,
    pub timeouts: Timeouts,
    pub forwarding: Forwarding,
    pub accel: Accel,
    pub limits: Limits,
    pub policy: Policy,
    /// `[tls]`: this relay's certificate for `tls = true` peer legs.
    pub tls: Option<TlsContext>,
}

/// Connection limits (0 = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Split connections open at once, all listeners together.
    pub max_connections: usize,
    /// Connections open at once from one client address (peer listeners,
    /// whose clients are relays carrying many users, are exempt).
    pub per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 100_000,
            per_client: 0,
        }
    }
}

/// An `[accel]` switch as written: unset means the relay decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Switch {
    /// Not in the file: on wherever this relay's config and host allow it.
    #[default]
    Auto,
    On,
    Off,
}

impl Switch {
    fn from_raw(v: Option<bool>) -> Switch {
        match v {
            None => Switch::Auto,
            Some(true) => Switch::On,
            Some(false) => Switch::Off,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Switch::Auto => "auto",
            Switch::On => "on",
            Switch::Off => "off",
        }
    }
}

/// The `[accel]` switches as the file set them, kept for status and
/// `--check` (the booleans in [`Accel`] are what they resolved to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Requested {
    pub early_syn: Switch,
    pub pool: Switch,
    pub tfo: Switch,
    pub zero_rtt: Switch,
}

/// Connection-time accelerations (the KTCP paper's, plus TFO). Each has its
/// own switch so the lab can measure them one by one; unset switches are on
/// wherever they work (see [`Switch::Auto`] and each field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accel {
    /// The switches as written.
    pub requested: Requested,
    /// Start the next leg when the client's SYN arrives (tc BPF detector on
    /// the tproxy listener's intercept interfaces). Auto: on when a tproxy
    /// listener has `intercept` (and strict mode is off); the relay runs
    /// without it if the detector does not attach.
    pub early_syn: bool,
    /// At most this many early-started legs whose client has not been
    /// accepted yet; beyond it, legs start at accept (SYN-flood bound).
    pub early_syn_budget: usize,
    /// How long an early-started leg waits for its client's accept.
    pub early_syn_expiry: Duration,
    /// Strict mode: hold intercepted SYNs (NFQUEUE) until the next leg is
    /// connected through to the server, so a refused or unreachable server
    /// looks to the client as without relays. Pending SYNs share
    /// `early_syn_budget`; released legs wait `early_syn_expiry`.
    pub strict: bool,
    /// Keep pre-established, authenticated connections to each peer.
    /// Auto: on when there is a `[[peer]]`.
    pub pool: bool,
    /// Accept TCP Fast Open on client-facing listeners (the client chose
    /// TFO; the kernel's server bit decides whether it works). Auto: on.
    pub tfo: bool,
    /// Use TCP_FASTOPEN_CONNECT on direct legs to servers. Only with an
    /// explicit `tfo = true`: SYN data may be replayed to a server that did
    /// not ask for it, and middleboxes on the way to arbitrary servers drop
    /// such SYNs (docs/deployment.md, "TCP Fast Open").
    pub tfo_direct: bool,
    /// Turbo-start on relay↔relay legs only.
    pub turbo: Option<Turbo>,
    /// 0-RTT peer legs: fresh (unpooled) legs to peers open with an
    /// authenticated Hello carrying the Header, and peer listeners take it,
    /// so no round trip goes to a challenge. Where the kernel allows TCP
    /// Fast Open the Hello rides the SYN (half a round trip after the dial);
    /// otherwise the first segment after the handshake. Auto: on.
    pub zero_rtt: bool,
    /// How far a Hello's timestamp may be from this relay's clock; relays'
    /// clocks must agree to well within it (NTP).
    pub zero_rtt_window: Duration,
}

/// KTCP's Turbo-Start: large initial windows and buffers, installed as
/// per-peer routes (`initcwnd`/`initrwnd`) and socket buffers on relay legs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turbo {
    /// Initial congestion window, in segments.
    pub initcwnd: u32,
    /// Initial receive window, in segments.
    pub initrwnd: u32,
    /// Send and receive buffer of relay legs whose peer sets none: the
    /// initial receive window can only be advertised if the buffer holds it.
    pub buffer: usize,
}

impl Default for Accel {
    fn default() -> Self {
        Accel {
            requested: Requested::default(),
            early_syn: false,
            early_syn_budget: 1024,
            early_syn_expiry: Duration::from_secs(10),
            strict: false,
            pool: false,
            tfo: false,
            tfo_direct: false,
            turbo: None,
            zero_rtt: false,
            zero_rtt_window: Duration::from_secs(10),
        }
    }
}

/// Pool watermarks for one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSize {
    /// Refill starts when fewer idle connections than this remain.
    pub low: usize,
    /// Refill tops up to this many.
    pub high: usize,
    /// A pooled connection older than this is closed, not used: it must be
    /// retired before the peer's `timeouts.pooled_header` closes it.
    pub idle: Duration,
}

impl Default for PoolSize {
    fn default() -> Self {
        PoolSize {
            low: 4,
            high: 16,
            idle: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ListenMode {
    Tproxy,
    Socks5,
    HttpConnect,
    Peer,
    /// The destination rides the client's SYN as a TCP option
    /// (`splitway agent`; `splitway_proto::syn_option`).
    SynOption,
}

impl ListenMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ListenMode::Tproxy => "tproxy",
            ListenMode::Socks5 => "socks5",
            ListenMode::HttpConnect => "http-connect",
            ListenMode::Peer => "peer",
            ListenMode::SynOption => "syn-option",
        }
    }
}

/// Validates a listener's syn-option keys: the option is unauthenticated,
/// so `allow_clients` is required; `syn_option_prefixes` are `INDEX=PREFIX`
/// (IPv6, /32 to /127, index 0..=127, each index once).
fn syn_option_prefixes(c: &mut Checker, key: &str, raw: &RawListener) -> Vec<(u8, IpNet)> {
    let mut out: Vec<(u8, IpNet)> = Vec::new();
    if raw.mode != ListenMode::SynOption {
        if !raw.syn_option_prefixes.is_empty() {
            c.err(
                format!("{key}.syn_option_prefixes"),
                "only a mode = \"syn-option\" listener reads the SYN's option",
            );
        }
        return out;
    }
    if raw.allow_clients.is_empty() {
        c.err(
            format!("{key}.allow_clients"),
            "required for mode = \"syn-option\": the destination option is unauthenticated, so the listener must name its clients",
        );
    }
    for (j, entry) in raw.syn_option_prefixes.iter().enumerate() {
        let k = format!("{key}.syn_option_prefixes[{j}]");
        let parsed = entry.split_once('=').and_then(|(i, p)| {
            Some((
                i.trim().parse::<u8>().ok()?,
                p.trim().parse::<IpNet>().ok()?,
            ))
        });
        match parsed {
            Some((index, IpNet::V6(net)))
                if index <= 127 && (32..=127).contains(&net.prefix_len()) =>
            {
                if out.iter().any(|(i, _)| *i == index) {
                    c.err(k, format!("index {index} is used twice"));
                } else {
                    out.push((index, IpNet::V6(net.trunc())));
                }
            }
            _ => c.err(
                k,
                format!("`{entry}`: expected INDEX=IPV6/LEN with INDEX 0..=127 and LEN 32..=127"),
            ),
        }
    }
    out
}

/// Validates `watch`: interface names on a syn-option listener whose SYNs
/// name their real client (no PROXY header: early SYN dials at the SYN).
fn syn_option_watch(c: &mut Checker, key: &str, raw: &RawListener) {
    if raw.watch.is_empty() {
        return;
    }
    if raw.mode != ListenMode::SynOption {
        c.err(
            format!("{key}.watch"),
            "only a mode = \"syn-option\" listener has its SYNs watched (a tproxy listener's are watched on intercept.interfaces)",
        );
    }
    if !raw.accept_proxy_protocol.is_empty() {
        c.err(
            format!("{key}.watch"),
            "cannot be combined with accept_proxy_protocol (early SYN dials at the SYN, before the header names the client)",
        );
    }
    for (j, iface) in raw.watch.iter().enumerate() {
        if iface.is_empty() || iface.len() > 15 || iface.contains(['"', ' ', '/']) {
            c.err(
                format!("{key}.watch[{j}]"),
                format!("`{iface}` is not an interface name"),
            );
        } else if raw.watch[..j].contains(iface) {
            c.err(
                format!("{key}.watch[{j}]"),
                format!("`{iface}` is listed twice"),
            );
        }
    }
}

/// Upper bound of `[[listen]] accept_sockets`.
pub const MAX_ACCEPT_SOCKETS: usize = 256;

#[derive(Debug, Clone)]
pub struct Listener {
    pub mode: ListenMode,
    pub addr: SocketAddr,
    /// A `[::]` listener serves IPv4 too (dual stack) unless a `0.0.0.0`
    /// listener has the same port, in which case it is IPv6-only.
    pub v6_only: bool,
    pub intercept: Option<Intercept>,
    /// Clients allowed to connect. Empty means any for tproxy and peer
    /// listeners, and loopback only for explicit (SOCKS5, HTTP CONNECT)
    /// ones: an explicit proxy open to the world is an open relay.
    pub allow_clients: Vec<IpNet>,
    /// A peer listener with `tls = true`: TLS 1.3 with client certificates
    /// signed by `[tls] ca`.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// SO_REUSEPORT: several relay processes on this host share the
    /// address, the kernel spreading new connections over them (one process
    /// per core, or more connections than one process's fd limit holds).
    pub reuse_port: bool,
    /// Listening sockets, each with its own accept task; `None`: one per
    /// runtime worker thread (the kernel spreads connections over them).
    pub accept_sockets: Option<usize>,
    /// `accept_proxy_protocol`: sources (load balancers) whose connections
    /// start with a PROXY protocol v1/v2 header naming the real client.
    /// Only they may send one, and they must.
    pub accept_proxy_protocol: Vec<IpNet>,
    /// `syn-option` listeners: IPv6 prefixes by index, for the compact
    /// (indexed) destination option.
    pub syn_option_prefixes: Vec<(u8, IpNet)>,
    /// `syn-option` listeners: interfaces whose ingress the early-SYN
    /// detector watches for this listener's option-carrying SYNs.
    pub watch: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intercept {
    pub interfaces: Vec<String>,
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone)]
pub struct Peer {
    pub name: String,
    pub addr: SocketAddr,
    pub tuning: LegTuning,
    pub pool: PoolSize,
    /// `tls = true`: the leg is TLS 1.3, the peer's certificate checked
    /// against `[tls] ca` for `server_name` (default: the peer's name).
    pub tls: Option<PeerTls>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    Direct,
    /// Index into `Config::peers`.
    Peer(usize),
}

#[derive(Debug, Clone)]
pub struct Route {
    pub dst: IpNet,
    /// The first candidate: the hop used until measurements say otherwise.
    pub via: Via,
    /// Every candidate in config order (`via = ["rs1", "direct"]`), `via`
    /// first; one entry for a plain `via = "rs1"`. See `paths`.
    pub candidates: Vec<Via>,
    /// What a `direct` route does for the server to learn the client.
    pub reveal: Reveal,
}

/// How a `via = "direct"` route tells the server who the client is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reveal {
    /// `proxy_protocol`: a PROXY protocol header before the client's bytes.
    pub proxy_protocol: Option<splitway_proto::proxy_protocol::Version>,
    /// `source = "client"`: dial the server from the client's own address
    /// (IP_TRANSPARENT); replies must be routed back to this relay.
    pub client_source: bool,
}

/// Socket tuning for one kind of leg.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LegTuning {
    pub congestion: Option<String>,
    /// `None` = the leg kind's default (Nagle off everywhere: a relay must
    /// not hold back the small segments it forwards).
    pub nodelay: Option<bool>,
    pub sndbuf: Option<usize>,
    pub rcvbuf: Option<usize>,
    /// TCP keepalive idle time; `Some(None)` = explicitly off.
    pub keepalive: Option<Option<Duration>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub handshake: Duration,
    pub idle: Duration,
    /// How long a peer listener keeps an authenticated connection that has
    /// not sent its header yet (an upstream relay's pooled connection).
    pub pooled_header: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(300),
            pooled_header: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPath {
    /// recv/send for small chunks, splice once a read fills the buffer.
    #[default]
    Auto,
    Splice,
    Copy,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Forwarding {
    pub data_path: DataPath,
}

/// One problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// All problems of a config file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigErrors {
    pub path: String,
    pub issues: Vec<ConfigIssue>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} error{}",
            self.path,
            self.issues.len(),
            if self.issues.len() == 1 { "" } else { "s" }
        )?;
        for i in &self.issues {
            writeln!(f, "  {i}")?;
        }
        Ok(())
    }
}

// ---- raw, serde-facing shapes --------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    mode: ListenMode,
    addr: String,
    #[serde(default)]
    intercept: Option<Intercept>,
    #[serde(default)]
    allow_clients: Vec<String>,
    tls: Option<bool>,
    reuse_port: Option<bool>,
    accept_sockets: Option<usize>,
    #[serde(default)]
    accept_proxy_protocol: Vec<String>,
    #[serde(default)]
    syn_option_prefixes: Vec<String>,
    #[serde(default)]
    watch: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTuning {
    congestion: Option<String>,
    nodelay: Option<bool>,
    sndbuf: Option<u64>,
    rcvbuf: Option<u64>,
    keepalive: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    name: String,
    addr: String,
    congestion: Option<String>,
    nodelay: Option<bool>,
    sndbuf: Option<u64>,
    rcvbuf: Option<u64>,
    keepalive: Option<String>,
    pool: Option<RawPool>,
    tls: Option<bool>,
    server_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: String,
    key: String,
    ca: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    low: Option<usize>,
    high: Option<usize>,
    idle: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAccel {
    early_syn: Option<bool>,
    early_syn_budget: Option<usize>,
    early_syn_expiry: Option<String>,
    strict: Option<bool>,
    pool: Option<bool>,
    tfo: Option<bool>,
    turbo: Option<RawTurbo>,
    zero_rtt: Option<bool>,
    zero_rtt_window: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurbo {
    initcwnd: Option<u32>,
    initrwnd: Option<u32>,
    buffer: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    dst: String,
    via: RawVia,
    proxy_protocol: Option<String>,
    source: Option<String>,
}

/// `via = "rs1"` or `via = ["rs1", "rs2", "direct"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawVia {
    One(String),
    Many(Vec<String>),
}

impl RawVia {
    fn names(&self) -> Vec<&str> {
        match self {
            RawVia::One(s) => vec![s.as_str()],
            RawVia::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// Candidates per route: each one is probed once a second at most.
pub const MAX_CANDIDATES: usize = 8;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    connect: Option<String>,
    handshake: Option<String>,
    idle: Option<String>,
    pooled_header: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_connections: Option<usize>,
    per_client: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    allow_destinations: Option<Vec<String>>,
    deny_destinations: Option<Vec<String>>,
    /// Integers or "first-last" strings; checked one by one so each
    /// error names its element.
    allow_ports: Option<Vec<toml::Value>>,
    allow_local_destinations: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawForwarding {
    data_path: Option<DataPath>,
}

const TOP_LEVEL_KEYS: &[&str] = &[
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

/// A key file is a few dozen hex digits; anything much longer (or endless,
/// like a device) is a mistake, not a key.
const MAX_KEY_FILE: u64 = 16 * 1024;

/// Reads a key file, at most [`MAX_KEY_FILE`] bytes.
fn read_key_file(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_KEY_FILE + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_KEY_FILE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("longer than {MAX_KEY_FILE} bytes: not a key file"),
        ));
    }
    Ok(text)
}

/// How [`Config::parse_str`] answers for key files: it reads none.
fn no_key_files(_: &Path) -> std::io::Result<String> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "key files are not read when parsing text alone",
    ))
}

/// Collects issues while walking the file.
struct Checker<'a> {
    issues: Vec<ConfigIssue>,
    read_key: &'a dyn Fn(&Path) -> std::io::Result<String>,
    /// The kernel's congestion controls, read once per parse.
    congestion_controls: Option<Vec<String>>,
}

impl Checker<'_> {
    fn err(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue {
            key: key.into(),
            message: message.into(),
        });
    }

    /// Deserializes one value, recording a failure under `key`.
    fn section<T: DeserializeOwned>(&mut self, key: &str, value: &toml::Value) -> Option<T> {
        match T::deserialize(value.clone()) {
            Ok(v) => Some(v),
            Err(e) => {
                self.err(key, e.message().trim().to_owned());
                None
            }
        }
    }

    /// An array of tables (`[[listen]]` etc.), each element deserialized alone.
    fn elements<T: DeserializeOwned>(
        &mut self,
        table: &toml::Table,
        key: &str,
    ) -> Vec<(String, Option<T>)> {
        match table.get(key) {
            None => Vec::new(),
            Some(toml::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let k = format!("{key}[{i}]");
                    let parsed = self.section::<T>(&k, v);
                    (k, parsed)
                })
                .collect(),
            Some(_) => {
                self.err(key, format!("must be an array of tables ([[{key}]])"));
                Vec::new()
            }
        }
    }

    /// Reads a pre-shared key file, recording a failure under `key`.
    fn key_file(&mut self, key: &str, path: &Path) -> Option<Psk> {
        match (self.read_key)(path) {
            Ok(text) => match Psk::from_hex(&text) {
                Ok(k) => Some(k),
                Err(e) => {
                    self.err(key, format!("{}: {e}", path.display()));
                    None
                }
            },
            Err(e) => {
                self.err(key, format!("cannot read {}: {e}", path.display()));
                None
            }
        }
    }

    fn socket_addr(&mut self, key: &str, text: &str) -> Option<SocketAddr> {
        match text.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.err(
                    key,
                    format!("`{text}` is not an IP:port address (IPv6 as [addr]:port)"),
                );
                None
            }
        }
    }

    fn duration(&mut self, key: &str, text: &str) -> Option<Duration> {
        match parse_duration(text) {
            Some(d) => Some(d),
            None => {
                self.err(
                    key,
                    format!("`{text}` is not a duration (e.g. \"500ms\", \"10s\", \"5m\", \"1h\")"),
                );
                None
            }
        }
    }

    /// A list of prefixes without host bits, each error under `key[i]`.
    fn prefixes(&mut self, key: &str, list: &[String]) -> Vec<IpNet> {
        let mut out = Vec::new();
        for (i, text) in list.iter().enumerate() {
            let k = format!("{key}[{i}]");
            match text.parse::<IpNet>() {
                Ok(n) if n.trunc() != n => self.err(
                    k,
                    format!("`{text}` has host bits set (did you mean {}?)", n.trunc()),
                ),
                Ok(n) => out.push(n),
                Err(_) => self.err(
                    k,
                    format!("`{text}` is not a prefix (e.g. 10.0.0.0/8, 192.0.2.7/32, ::1/128)"),
                ),
            }
        }
        out
    }

    /// One `allow_ports` element: a port, or a "first-last" range.
    fn port_range(&mut self, key: &str, value: &toml::Value) -> Option<RangeInclusive<u16>> {
        let port = |n: i64| u16::try_from(n).ok().filter(|&p| p != 0);
        let range = match value {
            toml::Value::Integer(n) => port(*n).map(|p| p..=p),
            toml::Value::String(s) => {
                let (first, last) = s.split_once('-').unwrap_or((s, s));
                match (first.trim().parse::<i64>(), last.trim().parse::<i64>()) {
                    (Ok(a), Ok(b)) => match (port(a), port(b)) {
                        (Some(a), Some(b)) if a <= b => Some(a..=b),
                        (Some(_), Some(_)) => {
                            self.err(key, format!("`{s}`: the first port is above the last"));
                            return None;
                        }
                        _ => None,
                    },
                    _ => None,
                }
            }
            _ => None,
        };
        if range.is_none() {
            self.err(
                key,
                format!("`{value}` is not a port (1-65535) or a range like \"8000-8100\""),
            );
        }
        range
    }

    fn policy(&mut self, raw: RawPolicy) -> Policy {
        let allow_destinations = self.prefixes(
            "policy.allow_destinations",
            raw.allow_destinations.as_deref().unwrap_or_default(),
        );
        let deny_destinations = self.prefixes(
            "policy.deny_destinations",
            raw.deny_destinations.as_deref().unwrap_or_default(),
        );
        let allow_ports = raw
            .allow_ports
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(|(i, v)| self.port_range(&format!("policy.allow_ports[{i}]"), v))
            .collect();
        Policy {
            allow_destinations,
            deny_destinations,
            allow_ports,
            allow_local_destinations: raw.allow_local_destinations.unwrap_or(false),
        }
    }

    /// A route's `proxy_protocol` and `source`: only a direct route talks
    /// to the server; a peer route's last relay decides for itself.
    /// `peers_only`: the route has no `direct` candidate (an unresolved one
    /// does not count, it has its own error).
    fn reveal(&mut self, key: &str, raw: &RawRoute, peers_only: bool) -> Reveal {
        use splitway_proto::proxy_protocol::Version;
        let direct_only = |c: &mut Checker, name: &str| {
            if peers_only {
                c.err(
                    format!("{key}.{name}"),
                    format!(
                        "only on a route with a \"direct\" candidate (set it on the last relay's route; `{}` lists peers only)",
                        raw.via.names().join(", ")
                    ),
                );
            }
        };
        let proxy_protocol = raw.proxy_protocol.as_deref().and_then(|v| {
            direct_only(self, "proxy_protocol");
            match v {
                "v1" => Some(Version::V1),
                "v2" => Some(Version::V2),
                other => {
                    self.err(
                        format!("{key}.proxy_protocol"),
                        format!("`{other}` is not \"v1\" or \"v2\""),
                    );
                    None
                }
            }
        });
        let client_source = match raw.source.as_deref() {
            None | Some("relay") => false,
            Some("client") => {
                direct_only(self, "source");
                true
            }
            Some(other) => {
                self.err(
                    format!("{key}.source"),
                    format!("`{other}` is not \"relay\" or \"client\""),
                );
                false
            }
        };
        Reveal {
            proxy_protocol,
            client_source,
        }
    }

    fn tuning(&mut self, key: &str, raw: RawTuning) -> LegTuning {
        let available = self
            .congestion_controls
            .get_or_insert_with(splitway_sys::sock::available_congestion_controls)
            .clone();
        let congestion = raw.congestion.and_then(|cc| {
            if cc.is_empty()
                || cc.len() > 15
                || !cc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                self.err(
                    format!("{key}.congestion"),
                    format!("`{cc}` is not a congestion control name"),
                );
                None
            } else if !available.is_empty()
                && !available.contains(&cc)
                && !splitway_sys::cc::is_shipped(&cc)
            {
                self.err(
                    format!("{key}.congestion"),
                    format!(
                        "`{cc}` is not available on this kernel (available: {}; shipped with splitway: {})",
                        available.join(", "),
                        splitway_sys::cc::shipped_names().collect::<Vec<_>>().join(", ")
                    ),
                );
                None
            } else {
                Some(cc)
            }
        });
        let mut buf = |name: &str, v: Option<u64>| -> Option<usize> {
            let v = v?;
            if !(4096..=1 << 30).contains(&v) {
                self.err(
                    format!("{key}.{name}"),
                    format!("{v} is outside 4096..=1073741824 bytes"),
                );
                None
            } else {
                Some(v as usize)
            }
        };
        let sndbuf = buf("sndbuf", raw.sndbuf);
        let rcvbuf = buf("rcvbuf", raw.rcvbuf);
        let keepalive = raw.keepalive.and_then(|k| {
            if k == "off" {
                Some(None)
            } else {
                self.duration(&format!("{key}.keepalive"), &k).map(Some)
            }
        });
        LegTuning {
            congestion,
            nodelay: raw.nodelay,
            sndbuf,
            rcvbuf,
            keepalive,
        }
    }
}

/// The one duration syntax of config files, `PUT /params` and the command
/// line: "250ms", "10s", "5m", "1h" (a bare number is seconds).
pub use splitway_control::params::parse_duration;

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Config {
    /// Reads and validates a config file. Relative paths inside it (the PSK
    /// file) are resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
            path: shown.clone(),
            issues: vec![ConfigIssue {
                key: "(file)".into(),
                message: format!("cannot read: {e}"),
            }],
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::parse(&text, base).map_err(|issues| ConfigErrors {
            path: shown,
            issues,
        })
    }

    /// Parses and validates config text; `base` resolves relative paths.
    pub fn parse(text: &str, base: &Path) -> Result<Config, Vec<ConfigIssue>> {
        Config::parse_with(text, base, &read_key_file)
    }

    /// Parses and validates config text without touching the filesystem:
    /// a `psk_file` (or `psk_file_previous`) is reported as unreadable.
    /// For checks of the text alone, and for fuzzing.
    pub fn parse_str(text: &str) -> Result<Config, Vec<ConfigIssue>> {
        Config::parse_with(text, Path::new("."), &no_key_files)
    }

    fn parse_with(
        text: &str,
        base: &Path,
        read_key: &dyn Fn(&Path) -> std::io::Result<String>,
    ) -> Result<Config, Vec<ConfigIssue>> {
        let table: toml::Table = match text.parse() {
            Ok(t) => t,
            Err(e) => {
                return Err(vec![ConfigIssue {
                    key: "(syntax)".into(),
                    message: e.to_string().trim().replace('\n', " "),
                }]);
            }
        };
        let mut c = Checker {
            issues: Vec::new(),
            read_key,
            congestion_controls: None,
        };

        for key in table.keys() {
            if !TOP_LEVEL_KEYS.contains(&key.as_str()) {
                c.err(
                    key.clone(),
                    format!(
                        "unknown key (expected one of: {})",
                        TOP_LEVEL_KEYS.join(", ")
                    ),
                );
            }
        }

        let name = match table.get("name") {
            Some(v) => c.section::<String>("name", v).and_then(|n| {
                if valid_name(&n) {
                    Some(n)
                } else {
                    c.err("name", format!("`{n}` must be 1-32 of [a-z0-9_-]"));
                    None
                }
            }),
            None => {
                c.err("name", "missing (a short name for this relay, e.g. \"rc\")");
                None
            }
        };

        let admin = match table.get("admin") {
            None => Some(DEFAULT_ADMIN.parse().expect("valid default")),
            Some(v) => match c.section::<String>("admin", v) {
                Some(s) if s.is_empty() || s == "off" => None,
                Some(s) => c.socket_addr("admin", &s),
                None => None,
            },
        };

        // TLS, before the listeners and peers that use it. `None` with an
        // issue recorded when the section is there but unusable.
        let tls_section = table.get("tls");
        let tls = tls_section
            .and_then(|v| c.section::<RawTls>("tls", v))
            .and_then(|raw| {
                tls::load(
                    &base.join(&raw.cert),
                    &base.join(&raw.key),
                    &base.join(&raw.ca),
                )
                .map_err(|errs| {
                    for (sub, msg) in errs {
                        c.err(format!("tls.{sub}"), msg);
                    }
                })
                .ok()
            });
        let tls_user = |c: &mut Checker, key: &str| {
            if tls_section.is_none() {
                c.err(
                    format!("{key}.tls"),
                    "needs a [tls] section (cert, key, ca)",
                );
            }
        };

        // Listeners.
        let mut listeners = Vec::new();
        let mut seen_addrs = HashSet::new();
        let raw_listeners = c.elements::<RawListener>(&table, "listen");
        if raw_listeners.is_empty() && !c.issues.iter().any(|i| i.key == "listen") {
            c.err(
                "listen",
                "no [[listen]] section: the relay would accept nothing",
            );
        }
        for (key, raw) in raw_listeners {
            let Some(raw) = raw else { continue };
            let addr = c.socket_addr(&format!("{key}.addr"), &raw.addr);
            if let Some(a) = addr
                && !seen_addrs.insert(a)
            {
                c.err(
                    format!("{key}.addr"),
                    format!("{a} is already used by another listener"),
                );
            }
            if let Some(i) = &raw.intercept {
                if raw.mode != ListenMode::Tproxy {
                    c.err(
                        format!("{key}.intercept"),
                        "only a mode = \"tproxy\" listener can intercept",
                    );
                }
                if i.interfaces.is_empty() {
                    c.err(
                        format!("{key}.intercept.interfaces"),
                        "needs at least one interface",
                    );
                }
                for (j, iface) in i.interfaces.iter().enumerate() {
                    if iface.is_empty() || iface.len() > 15 || iface.contains(['"', ' ', '/']) {
                        c.err(
                            format!("{key}.intercept.interfaces[{j}]"),
                            format!("`{iface}` is not an interface name"),
                        );
                    }
                }
                if i.ports.is_empty() {
                    c.err(format!("{key}.intercept.ports"), "needs at least one port");
                }
                if i.ports.contains(&0) {
                    c.err(
                        format!("{key}.intercept.ports"),
                        "port 0 cannot be intercepted",
                    );
                }
            }
            let mut allow = Vec::new();
            for (j, p) in raw.allow_clients.iter().enumerate() {
                match p.parse::<IpNet>() {
                    Ok(n) => allow.push(n.trunc()),
                    Err(_) => c.err(
                        format!("{key}.allow_clients[{j}]"),
                        format!("`{p}` is not a prefix (e.g. 10.0.0.0/8)"),
                    ),
                }
            }
            let syn_option_prefixes = syn_option_prefixes(&mut c, &key, &raw);
            syn_option_watch(&mut c, &key, &raw);
            let want_tls = raw.tls == Some(true);
            if want_tls {
                if raw.mode != ListenMode::Peer {
                    c.err(
                        format!("{key}.tls"),
                        "only a mode = \"peer\" listener can use TLS",
                    );
                }
                tls_user(&mut c, &key);
            }
            let reuse_port = raw.reuse_port == Some(true);
            if reuse_port && raw.intercept.is_some() {
                // Each process would install and, on exit, remove the same
                // interception rules under the others' feet.
                c.err(
                    format!("{key}.reuse_port"),
                    "cannot be combined with intercept: install the TPROXY rules by hand when several processes share a port",
                );
            }
            if let Some(n) = raw.accept_sockets
                && !(1..=MAX_ACCEPT_SOCKETS).contains(&n)
            {
                c.err(
                    format!("{key}.accept_sockets"),
                    format!("must be 1 to {MAX_ACCEPT_SOCKETS} (absent: one per worker thread)"),
                );
            }
            let accept_proxy_protocol = c.prefixes(
                &format!("{key}.accept_proxy_protocol"),
                &raw.accept_proxy_protocol,
            );
            if let Some(addr) = addr {
                listeners.push(Listener {
                    mode: raw.mode,
                    addr,
                    v6_only: false,
                    intercept: raw.intercept,
                    allow_clients: allow,
                    tls: tls.as_ref().filter(|_| want_tls).map(|t| t.server.clone()),
                    reuse_port,
                    accept_sockets: raw.accept_sockets,
                    accept_proxy_protocol,
                    syn_option_prefixes,
                    watch: raw.watch,
                });
            }
        }

        let v4_any_ports: HashSet<u16> = listeners
            .iter()
            .filter(|l| l.addr.is_ipv4() && l.addr.ip().is_unspecified())
            .map(|l| l.addr.port())
            .collect();
        for l in &mut listeners {
            l.v6_only = match l.addr {
                SocketAddr::V6(a) => !a.ip().is_unspecified() || v4_any_ports.contains(&a.port()),
                SocketAddr::V4(_) => false,
            };
        }

        // Peers.
        let mut peers: Vec<Peer> = Vec::new();
        let mut peer_names = HashSet::new();
        for (key, raw) in c.elements::<RawPeer>(&table, "peer") {
            let Some(raw) = raw else { continue };
            if !valid_name(&raw.name) {
                c.err(
                    format!("{key}.name"),
                    format!("`{}` must be 1-32 of [a-z0-9_-]", raw.name),
                );
            } else if raw.name == "direct" {
                c.err(format!("{key}.name"), "`direct` is reserved for routes");
            } else if !peer_names.insert(raw.name.clone()) {
                c.err(
                    format!("{key}.name"),
                    format!("peer `{}` is defined twice", raw.name),
                );
            }
            let addr = c.socket_addr(&format!("{key}.addr"), &raw.addr);
            let tuning = c.tuning(
                &key,
                RawTuning {
                    congestion: raw.congestion,
                    nodelay: raw.nodelay,
                    sndbuf: raw.sndbuf,
                    rcvbuf: raw.rcvbuf,
                    keepalive: raw.keepalive,
                },
            );
            let mut pool = PoolSize::default();
            if let Some(p) = raw.pool {
                pool.low = p.low.unwrap_or(pool.low);
                pool.high = p.high.unwrap_or(pool.high.max(pool.low));
                if pool.high > 4096 {
                    c.err(
                        format!("{key}.pool.high"),
                        "at most 4096 pooled connections per peer",
                    );
                }
                if pool.low > pool.high {
                    c.err(
                        format!("{key}.pool.low"),
                        format!("low ({}) is above high ({})", pool.low, pool.high),
                    );
                }
                if let Some(t) = p.idle
                    && let Some(d) = c.duration(&format!("{key}.pool.idle"), &t)
                {
                    pool.idle = d;
                }
            }
            let want_tls = raw.tls == Some(true);
            if want_tls {
                tls_user(&mut c, &key);
            } else if raw.server_name.is_some() {
                c.err(format!("{key}.server_name"), "only used with tls = true");
            }
            let name_text = raw.server_name.as_deref().unwrap_or(&raw.name);
            let server_name = tls::server_name(name_text);
            if want_tls && server_name.is_none() {
                c.err(
                    format!("{key}.server_name"),
                    format!("`{name_text}` is not a DNS name or IP address"),
                );
            }
            let peer_tls = match (&tls, server_name) {
                (Some(t), Some(server_name)) if want_tls => Some(PeerTls {
                    server_name,
                    config: t.client.clone(),
                }),
                _ => None,
            };
            if let Some(addr) = addr {
                peers.push(Peer {
                    name: raw.name,
                    addr,
                    tuning,
                    pool,
                    tls: peer_tls,
                });
            }
        }

        // Routes.
        let mut routes = Vec::new();
        let mut seen_dst = HashSet::new();
        for (key, raw) in c.elements::<RawRoute>(&table, "route") {
            let Some(raw) = raw else { continue };
            let dst = match raw.dst.parse::<IpNet>() {
                Ok(n) => {
                    if n.trunc() != n {
                        c.err(
                            format!("{key}.dst"),
                            format!(
                                "`{}` has host bits set (did you mean {}?)",
                                raw.dst,
                                n.trunc()
                            ),
                        );
                        None
                    } else if !seen_dst.insert(n) {
                        c.err(format!("{key}.dst"), format!("{n} is routed twice"));
                        None
                    } else {
                        Some(n)
                    }
                }
                Err(_) => {
                    c.err(
                        format!("{key}.dst"),
                        format!("`{}` is not a prefix (e.g. 10.0.3.0/24 or ::/0)", raw.dst),
                    );
                    None
                }
            };
            let names = raw.via.names();
            if names.is_empty() {
                c.err(format!("{key}.via"), "lists no candidate");
            } else if names.len() > MAX_CANDIDATES {
                c.err(
                    format!("{key}.via"),
                    format!("at most {MAX_CANDIDATES} candidates"),
                );
            }
            let mut candidates = Vec::new();
            let mut resolved_all = true;
            for (j, name) in names.iter().enumerate() {
                if names[..j].contains(name) {
                    c.err(format!("{key}.via"), format!("`{name}` is listed twice"));
                    resolved_all = false;
                } else if *name == "direct" {
                    candidates.push(Via::Direct);
                } else if let Some(i) = peers.iter().position(|p| p.name == *name) {
                    candidates.push(Via::Peer(i));
                } else if peer_names.contains(*name) {
                    resolved_all = false; // the peer exists but had its own error
                } else {
                    c.err(
                        format!("{key}.via"),
                        format!("`{name}` is neither \"direct\" nor a [[peer]] name"),
                    );
                    resolved_all = false;
                }
            }
            let peers_only = !names.contains(&"direct");
            let reveal = c.reveal(&key, &raw, peers_only);
            if let (Some(dst), true, Some(via)) = (dst, resolved_all, candidates.first().cloned()) {
                routes.push(Route {
                    dst,
                    via,
                    candidates,
                    reveal,
                });
            }
        }

        let direct = match table.get("direct") {
            Some(v) => c
                .section::<RawTuning>("direct", v)
                .map(|r| c.tuning("direct", r))
                .unwrap_or_default(),
            None => LegTuning::default(),
        };
        let client = match table.get("client") {
            Some(v) => c
                .section::<RawTuning>("client", v)
                .map(|r| c.tuning("client", r))
                .unwrap_or_default(),
            None => LegTuning::default(),
        };
        let upstream = match table.get("upstream") {
            Some(v) => c
                .section::<RawTuning>("upstream", v)
                .map(|r| c.tuning("upstream", r))
                .unwrap_or_default(),
            None => LegTuning::default(),
        };

        let mut timeouts = Timeouts::default();
        if let Some(v) = table.get("timeouts")
            && let Some(raw) = c.section::<RawTimeouts>("timeouts", v)
        {
            for (name, text, slot) in [
                ("connect", raw.connect, &mut timeouts.connect),
                ("handshake", raw.handshake, &mut timeouts.handshake),
                ("idle", raw.idle, &mut timeouts.idle),
                (
                    "pooled_header",
                    raw.pooled_header,
                    &mut timeouts.pooled_header,
                ),
            ] {
                if let Some(t) = text {
                    let key = format!("timeouts.{name}");
                    if let Some(d) = c.duration(&key, &t) {
                        if d.is_zero() {
                            c.err(key, "must be greater than zero");
                        } else {
                            *slot = d;
                        }
                    }
                }
            }
        }

        let forwarding = match table.get("forwarding") {
            Some(v) => c
                .section::<RawForwarding>("forwarding", v)
                .map(|r| Forwarding {
                    data_path: r.data_path.unwrap_or_default(),
                })
                .unwrap_or_default(),
            None => Forwarding::default(),
        };

        let limits = match table.get("limits") {
            Some(v) => c
                .section::<RawLimits>("limits", v)
                .map(|r| {
                    let d = Limits::default();
                    Limits {
                        max_connections: r.max_connections.unwrap_or(d.max_connections),
                        per_client: r.per_client.unwrap_or(d.per_client),
                    }
                })
                .unwrap_or_default(),
            None => Limits::default(),
        };

        let policy = match table.get("policy") {
            Some(v) => c
                .section::<RawPolicy>("policy", v)
                .map(|r| c.policy(r))
                .unwrap_or_default(),
            None => Policy::default(),
        };

        let mut accel = Accel::default();
        let intercepting = listeners
            .iter()
            .any(|l| l.mode == ListenMode::Tproxy && l.intercept.is_some());
        // Early SYN also serves syn-option listeners with `watch`.
        let watching = intercepting
            || listeners
                .iter()
                .any(|l| l.mode == ListenMode::SynOption && !l.watch.is_empty());
        let raw_accel = match table.get("accel") {
            Some(v) => c.section::<RawAccel>("accel", v),
            None => Some(RawAccel::default()),
        };
        if let Some(raw) = raw_accel {
            accel.requested = Requested {
                early_syn: Switch::from_raw(raw.early_syn),
                pool: Switch::from_raw(raw.pool),
                tfo: Switch::from_raw(raw.tfo),
                zero_rtt: Switch::from_raw(raw.zero_rtt),
            };
            accel.strict = raw.strict.unwrap_or(false);
            // A tproxy listener that takes PROXY headers learns the client
            // only after accept: dialing at the SYN would be too early.
            let proxied_tproxy = listeners
                .iter()
                .any(|l| l.mode == ListenMode::Tproxy && !l.accept_proxy_protocol.is_empty());
            accel.early_syn = match accel.requested.early_syn {
                Switch::Auto => watching && !accel.strict && !proxied_tproxy,
                s => s == Switch::On,
            };
            accel.pool = match accel.requested.pool {
                Switch::Auto => !peers.is_empty(),
                s => s == Switch::On,
            };
            accel.tfo = accel.requested.tfo != Switch::Off;
            accel.tfo_direct = accel.requested.tfo == Switch::On;
            accel.zero_rtt = accel.requested.zero_rtt != Switch::Off;
            if let Some(t) = raw.zero_rtt_window
                && let Some(d) = c.duration("accel.zero_rtt_window", &t)
            {
                if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&d) {
                    c.err(
                        "accel.zero_rtt_window",
                        format!("{d:?} is outside 1s..=300s"),
                    );
                }
                accel.zero_rtt_window = d;
            }
            if let Some(b) = raw.early_syn_budget {
                if b == 0 {
                    c.err(
                        "accel.early_syn_budget",
                        "must be at least 1 (use early_syn = false to disable)",
                    );
                }
                accel.early_syn_budget = b;
            }
            if let Some(t) = raw.turbo {
                let turbo = Turbo {
                    initcwnd: t.initcwnd.unwrap_or(64),
                    initrwnd: t.initrwnd.unwrap_or(64),
                    buffer: t.buffer.unwrap_or(8 << 20) as usize,
                };
                // A long haul's BDP exceeds 1024 segments (100 Mbit/s x
                // 215 ms = 1857); the kernel has no cap of its own.
                for (k, v) in [("initcwnd", turbo.initcwnd), ("initrwnd", turbo.initrwnd)] {
                    if !(1..=65_535).contains(&v) {
                        c.err(
                            format!("accel.turbo.{k}"),
                            format!("{v} is outside 1..=65535 segments"),
                        );
                    }
                }
                if !(64 << 10..=1 << 30).contains(&turbo.buffer) {
                    c.err(
                        "accel.turbo.buffer",
                        format!("{} is outside 65536..=1073741824 bytes", turbo.buffer),
                    );
                }
                accel.turbo = Some(turbo);
            }
            if let Some(t) = raw.early_syn_expiry
                && let Some(d) = c.duration("accel.early_syn_expiry", &t)
            {
                accel.early_syn_expiry = d;
            }
            if accel.early_syn && !watching {
                c.err(
                    "accel.early_syn",
                    "needs a tproxy listener with `intercept` or a syn-option listener with `watch` (where SYNs are watched)",
                );
            }
            if accel.strict && !intercepting {
                c.err(
                    "accel.strict",
                    "needs a tproxy listener with `intercept` (the relay holds the SYNs its rules intercept)",
                );
            }
            if accel.early_syn || accel.strict {
                // Both dial at the SYN, before a PROXY header can name the client.
                for (i, l) in listeners.iter().enumerate() {
                    // Any tproxy listener: SYNs the detector or the strict
                    // queue see may reach it through hand-written rules too.
                    if l.mode == ListenMode::Tproxy && !l.accept_proxy_protocol.is_empty() {
                        c.err(
                            format!("listen[{i}].accept_proxy_protocol"),
                            "cannot be combined with accel.early_syn or accel.strict on a tproxy listener (they dial the server at the SYN, before the header names the client)",
                        );
                    }
                }
            }
        }
        if accel.turbo.is_some() {
            // Each peer listener's allow_clients prefix becomes a turbo-start
            // route: a broad one would give client and server legs inside it
            // turbo windows too. Upstream relays outside them get a host
            // route when they authenticate.
            for (i, l) in listeners.iter().enumerate() {
                if l.mode != ListenMode::Peer {
                    continue;
                }
                for (j, n) in l.allow_clients.iter().enumerate() {
                    let narrowest_broad = if n.addr().is_ipv4() { 24 } else { 64 };
                    if n.prefix_len() < narrowest_broad {
                        c.err(
                            format!("listen[{i}].allow_clients[{j}]"),
                            format!(
                                "{n} is broader than /{narrowest_broad}: with [accel.turbo] each prefix becomes a turbo-start route, so clients and servers inside it would get turbo windows too; list the upstream relays by /{narrowest_broad} or narrower (or turn turbo off)"
                            ),
                        );
                    }
                }
            }
        }
        for p in &peers {
            if accel.pool && p.pool.idle >= timeouts.pooled_header {
                c.err(
                    format!("peer.{}.pool.idle", p.name),
                    format!(
                        "{:?} must be below timeouts.pooled_header ({:?}), or the next relay closes pooled connections before they are retired",
                        p.pool.idle, timeouts.pooled_header
                    ),
                );
            }
        }

        // The PSK is needed as soon as any leg touches another relay.
        // Judged on the raw file, so an element with its own error still counts.
        let raw_peer_listener = match table.get("listen") {
            Some(toml::Value::Array(items)) => items
                .iter()
                .any(|l| l.get("mode").and_then(toml::Value::as_str) == Some("peer")),
            _ => false,
        };
        let needs_psk = table.contains_key("peer") || raw_peer_listener;
        let psk_file = match table.get("psk_file") {
            Some(v) => c.section::<String>("psk_file", v).map(|p| base.join(p)),
            None => None,
        };
        let psk = match &psk_file {
            Some(p) => c.key_file("psk_file", p),
            None => {
                if needs_psk {
                    c.err("psk_file", "missing: peers and peer listeners need the shared key (generate one with `splitway keygen`)");
                }
                None
            }
        };

        let psk_previous = match table.get("psk_file_previous") {
            Some(v) => c
                .section::<String>("psk_file_previous", v)
                .and_then(|p| c.key_file("psk_file_previous", &base.join(p))),
            None => None,
        };
        if psk_previous.is_some() && psk.is_none() && !c.issues.iter().any(|i| i.key == "psk_file")
        {
            c.err("psk_file_previous", "needs psk_file (the current key)");
        }

        if c.issues.is_empty() {
            Ok(Config {
                psk_previous,
                name: name.expect("checked"),
                psk_file,
                psk,
                admin,
                listeners,
                peers,
                routes,
                direct,
                client,
                upstream,
                timeouts,
                forwarding,
                accel,
                limits,
                policy,
                tls,
            })
        } else {
            Err(c.issues)
        }
    }

    /// Warnings that do not stop the relay but an operator should see.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let explicit = matches!(l.mode, ListenMode::Socks5 | ListenMode::HttpConnect);
            if explicit && !l.addr.ip().is_loopback() && l.allow_clients.is_empty() {
                w.push(format!(
                    "listen[{i}]: {} listener on non-loopback {} without allow_clients: only loopback clients are accepted",
                    l.mode.as_str(),
                    l.addr
                ));
            }
        }
        if !self.policy.allow_local_destinations {
            for n in &self.policy.allow_destinations {
                if is_host_local(n.network()) {
                    w.push(format!(
                        "policy.allow_destinations: {n} is host-local: only loopback clients reach it unless policy.allow_local_destinations = true"
                    ));
                }
            }
        }
        if self.routes.is_empty() {
            w.push("no [[route]]: every connection will be refused (no route)".into());
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PSK_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    /// A fresh directory per call: tests run in parallel, and one test
    /// rewriting a shared key file would let another read it half-written.
    fn fresh_dir(tag: &str) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!("swcfg-{tag}-{}-{n}", std::process::id()))
    }

    fn with_psk(text: &str) -> Result<Config, Vec<ConfigIssue>> {
        let dir = fresh_dir("psk");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("psk.key"), PSK_HEX).unwrap();
        let parsed = Config::parse(text, &dir);
        // Keys are read during parsing; the files are no longer needed.
        let _ = std::fs::remove_dir_all(&dir);
        parsed
    }

    #[test]
    fn issue_example_parses() {
        let cfg = with_psk(
            r#"
            name = "rc"
            psk_file = "psk.key"
            [[listen]]
            mode = "tproxy"
            addr = "0.0.0.0:7000"
            intercept = { interfaces = ["eth0"], ports = [80, 443] }
            [[listen]]
            mode = "socks5"
            addr = "127.0.0.1:1080"
            [[listen]]
            mode = "http-connect"
            addr = "127.0.0.1:3128"
            [[listen]]
            mode = "peer"
            addr = "0.0.0.0:7100"
            [[peer]]
            name = "rs"
            addr = "10.0.12.2:7100"
            congestion = "bbr"
            [[route]]
            dst = "10.0.3.0/24"
            via = "rs"
            [[route]]
            dst = "0.0.0.0/0"
            via = "direct"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.listeners.len(), 4);
        assert_eq!(cfg.peers[0].tuning.congestion.as_deref(), Some("bbr"));
        assert_eq!(cfg.routes[0].via, Via::Peer(0));
        assert_eq!(cfg.routes[1].via, Via::Direct);
        assert!(cfg.psk.is_some());
        assert_eq!(cfg.admin, Some(DEFAULT_ADMIN.parse().unwrap()));
        assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
    }

    #[test]
    fn via_takes_a_list_of_candidates_and_checks_each() {
        let head = "name = \"rc\"\npsk_file = \"psk.key\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n[[peer]]\nname = \"rs1\"\naddr = \"10.0.12.2:7100\"\n[[peer]]\nname = \"rs2\"\naddr = \"10.0.13.2:7100\"\n";
        let cfg = with_psk(&format!(
            "{head}[[route]]\ndst = \"10.0.3.0/24\"\nvia = [\"rs2\", \"rs1\", \"direct\"]\nproxy_protocol = \"v2\"\n[[route]]\ndst = \"10.0.4.0/24\"\nvia = \"rs1\"\n"
        ))
        .unwrap();
        assert_eq!(cfg.routes[0].via, Via::Peer(1));
        assert_eq!(
            cfg.routes[0].candidates,
            [Via::Peer(1), Via::Peer(0), Via::Direct]
        );
        assert_eq!(cfg.routes[1].candidates, [Via::Peer(0)]);

        let issues = with_psk(&format!(
            "{head}[[route]]\ndst = \"10.0.3.0/24\"\nvia = []\n\
             [[route]]\ndst = \"10.0.4.0/24\"\nvia = [\"rs1\", \"rs1\"]\n\
             [[route]]\ndst = \"10.0.5.0/24\"\nvia = [\"rs1\", \"rs9\"]\n\
             [[route]]\ndst = \"10.0.6.0/24\"\nvia = [\"rs1\", \"rs2\"]\nproxy_protocol = \"v2\"\n\
             [[route]]\ndst = \"10.0.7.0/24\"\nvia = [\"direct\", \"rs1\", \"rs2\", \"a\", \"b\", \"c\", \"d\", \"e\", \"f\"]\n"
        ))
        .unwrap_err();
        let found: Vec<(&str, &str)> = issues
            .iter()
            .map(|i| (i.key.as_str(), i.message.as_str()))
            .collect();
        for (key, needle) in [
            ("route[0].via", "lists no candidate"),
            ("route[1].via", "`rs1` is listed twice"),
            ("route[2].via", "`rs9` is neither"),
            ("route[3].proxy_protocol", "lists peers only"),
            ("route[4].via", "at most 8 candidates"),
        ] {
            assert!(
                found.iter().any(|(k, m)| *k == key && m.contains(needle)),
                "{key}: {needle} not in {found:?}"
            );
        }
    }

    #[test]
    fn every_error_is_reported_with_its_key() {
        let issues = with_psk(
            r#"
            name = "Bad Name"
            psk_file = "psk.key"
            colour = "blue"
            [[listen]]
            mode = "tproxy"
            addr = "0.0.0.0"
            [[listen]]
            mode = "carrier-pigeon"
            addr = "127.0.0.1:1"
            [[peer]]
            name = "rs"
            addr = "10.0.12.2:7100"
            congestion = "warp"
            sndbuf = 12
            [[route]]
            dst = "10.0.3.0/33"
            via = "rs"
            [[route]]
            dst = "10.0.4.0/24"
            via = "nowhere"
            [timeouts]
            idle = "forever"
            "#,
        )
        .unwrap_err();
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        for k in [
            "colour",
            "name",
            "listen[0].addr",
            "listen[1]",
            "peer[0].congestion",
            "peer[0].sndbuf",
            "route[0].dst",
            "route[1].via",
            "timeouts.idle",
        ] {
            assert!(keys.contains(&k), "missing {k} in {issues:#?}");
        }
    }

    #[test]
    fn unknown_key_inside_an_element_is_named() {
        let issues = with_psk(
            r#"
            name = "rs"
            [[listen]]
            mode = "peer"
            addr = "0.0.0.0:7100"
            port = 7
            "#,
        )
        .unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "listen[0]" && i.message.contains("port")),
            "{issues:?}"
        );
        assert!(
            issues.iter().any(|i| i.key == "psk_file"),
            "peer listener without PSK must be refused: {issues:?}"
        );
    }

    #[test]
    fn bad_psk_is_refused() {
        let dir = fresh_dir("bad");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("short.key"), "abcd").unwrap();
        let issues = Config::parse(
            "name = \"r\"\npsk_file = \"short.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
            &dir,
        )
        .unwrap_err();
        assert!(issues.iter().any(|i| i.key == "psk_file"), "{issues:?}");
    }

    #[test]
    fn previous_key_for_rollover() {
        let dir = fresh_dir("roll");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("new.key"), PSK_HEX).unwrap();
        std::fs::write(dir.join("old.key"), PSK_HEX.replace('0', "f")).unwrap();
        let cfg = Config::parse(
            "name = \"r\"\npsk_file = \"new.key\"\npsk_file_previous = \"old.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
            &dir,
        )
        .unwrap();
        assert!(cfg.psk.is_some() && cfg.psk_previous.is_some());
        assert_ne!(cfg.psk, cfg.psk_previous);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("-1s"), None);
    }

    const MINIMAL: &str = "name = \"r\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n";

    #[test]
    fn policy_section_parses() {
        let cfg = Config::parse_str(&format!(
            "{MINIMAL}[policy]\nallow_destinations = [\"10.0.0.0/8\", \"192.0.2.7/32\", \"::1/128\"]\n\
             deny_destinations = [\"10.9.0.0/16\"]\nallow_ports = [80, 443, \"8000-8100\", \"9000\"]\n"
        ))
        .unwrap();
        let p = &cfg.policy;
        assert_eq!(p.allow_destinations.len(), 3);
        assert_eq!(p.deny_destinations, vec!["10.9.0.0/16".parse().unwrap()]);
        assert_eq!(
            p.allow_ports,
            vec![80..=80, 443..=443, 8000..=8100, 9000..=9000]
        );
        assert!(!p.allow_local_destinations);
        // ::1/128 is host-local: the operator is told it needs the switch.
        assert!(
            cfg.warnings()
                .iter()
                .any(|w| w.contains("::1/128") && w.contains("allow_local_destinations")),
            "{:?}",
            cfg.warnings()
        );
    }

    #[test]
    fn absent_policy_allows_any_destination_but_local_ones_to_remote_clients() {
        let cfg = Config::parse_str(MINIMAL).unwrap();
        assert_eq!(cfg.policy, Policy::default());
        let empty = Config::parse_str(&format!(
            "{MINIMAL}[policy]\nallow_destinations = []\nallow_local_destinations = true\n"
        ))
        .unwrap();
        assert!(empty.policy.allow_destinations.is_empty());
        assert!(empty.policy.allow_local_destinations);
    }

    #[test]
    fn every_policy_error_is_reported_with_its_key() {
        let issues = Config::parse_str(&format!(
            "{MINIMAL}[policy]\nallow_destinations = [\"10.0.0.0/8\", \"10.0.0.1/8\", \"nowhere\"]\n\
             deny_destinations = [\"192.0.2.7\"]\n\
             allow_ports = [80, 0, 70000, \"9000-8000\", \"http\", \"-5\", true]\n"
        ))
        .unwrap_err();
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        for k in [
            "policy.allow_destinations[1]",
            "policy.allow_destinations[2]",
            "policy.deny_destinations[0]",
            "policy.allow_ports[1]",
            "policy.allow_ports[2]",
            "policy.allow_ports[3]",
            "policy.allow_ports[4]",
            "policy.allow_ports[5]",
            "policy.allow_ports[6]",
        ] {
            assert!(keys.contains(&k), "missing {k} in {issues:#?}");
        }
        assert!(!keys.contains(&"policy.allow_destinations[0]"));
        assert!(!keys.contains(&"policy.allow_ports[0]"));
        assert_eq!(issues.len(), 9, "{issues:#?}");

        let unknown =
            Config::parse_str(&format!("{MINIMAL}[policy]\nallow_dst = []\n")).unwrap_err();
        assert!(
            unknown
                .iter()
                .any(|i| i.key == "policy" && i.message.contains("allow_dst")),
            "{unknown:?}"
        );
        let not_a_list =
            Config::parse_str(&format!("{MINIMAL}[policy]\nallow_ports = 80\n")).unwrap_err();
        assert!(
            not_a_list.iter().any(|i| i.key == "policy"),
            "{not_a_list:?}"
        );
    }

    #[test]
    fn parse_str_reads_no_key_file() {
        let issues = Config::parse_str(
            "name = \"r\"\npsk_file = \"/etc/hostname\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
        )
        .unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "psk_file" && i.message.contains("not read")),
            "{issues:?}"
        );
    }

    #[test]
    fn endless_key_file_is_refused_not_read_forever() {
        let issues = Config::parse(
            "name = \"r\"\npsk_file = \"/dev/zero\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:1\"\n",
            Path::new("."),
        )
        .unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "psk_file" && i.message.contains("not a key file")),
            "{issues:?}"
        );
    }

    #[test]
    fn explicit_listener_open_to_the_world_warns() {
        let cfg = with_psk(
            "name = \"r\"\n[[listen]]\nmode = \"socks5\"\naddr = \"0.0.0.0:1080\"\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
        )
        .unwrap();
        assert_eq!(cfg.warnings().len(), 1);
    }

    const RC: &str = "name = \"rc\"\npsk_file = \"psk.key\"\n\
        [[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
        intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
        [[peer]]\nname = \"rs\"\naddr = \"10.0.12.2:7100\"\n\
        [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"rs\"\n";

    #[test]
    fn unset_accel_switches_are_on_where_they_apply() {
        // Nothing to pool to, nowhere to watch SYNs: those stay off.
        let cfg = Config::parse_str(MINIMAL).unwrap();
        assert_eq!(cfg.accel.requested, Requested::default());
        assert_eq!(cfg.accel.requested.pool, Switch::Auto);
        assert!(!cfg.accel.pool && !cfg.accel.early_syn);
        assert!(cfg.accel.zero_rtt && cfg.accel.tfo);
        assert!(!cfg.accel.tfo_direct, "TFO to servers is opt-in");
        // A peer and an intercepting listener: pool and early SYN too.
        let cfg = with_psk(RC).unwrap();
        assert!(cfg.accel.pool && cfg.accel.early_syn && cfg.accel.zero_rtt);
        // Each can be turned off; tfo = true also covers direct legs.
        let cfg = with_psk(&format!(
            "{RC}[accel]\npool = false\nearly_syn = false\nzero_rtt = false\ntfo = true\n"
        ))
        .unwrap();
        assert!(!cfg.accel.pool && !cfg.accel.early_syn && !cfg.accel.zero_rtt);
        assert!(cfg.accel.tfo && cfg.accel.tfo_direct);
        assert_eq!(cfg.accel.requested.pool, Switch::Off);
        assert_eq!(cfg.accel.requested.tfo, Switch::On);
        let cfg = with_psk(&format!("{RC}[accel]\ntfo = false\n")).unwrap();
        assert!(!cfg.accel.tfo && !cfg.accel.tfo_direct);
        // Strict replaces the detector: auto early SYN stays off with it.
        let cfg = with_psk(&format!("{RC}[accel]\nstrict = true\n")).unwrap();
        assert!(cfg.accel.strict && !cfg.accel.early_syn);
        // Insisting on early SYN without an intercepting listener is an error.
        let issues =
            Config::parse_str(&format!("{MINIMAL}[accel]\nearly_syn = true\n")).unwrap_err();
        assert!(
            issues.iter().any(|i| i.key == "accel.early_syn"),
            "{issues:?}"
        );
    }

    #[test]
    fn turbo_refuses_broad_upstream_prefixes() {
        let rs = |prefix: &str| {
            format!(
                "name = \"rs\"\npsk_file = \"psk.key\"\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:7100\"\n\
                 allow_clients = [\"10.0.12.0/24\", \"{prefix}\"]\n\
                 [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\nturbo = {{ initcwnd = 40 }}\n"
            )
        };
        for broad in ["0.0.0.0/0", "10.0.0.0/8", "fd00::/48"] {
            let issues = with_psk(&rs(broad)).unwrap_err();
            assert!(
                issues
                    .iter()
                    .any(|i| i.key == "listen[0].allow_clients[1]" && i.message.contains("turbo")),
                "{broad}: {issues:?}"
            );
        }
        for narrow in ["10.0.13.0/24", "192.0.2.7/32", "fd00:1::/64"] {
            assert!(with_psk(&rs(narrow)).is_ok(), "{narrow}");
        }
        // Without turbo a broad prefix is only an ACL.
        assert!(with_psk(&rs("0.0.0.0/0").replace("turbo = { initcwnd = 40 }", "")).is_ok());
    }

    #[test]
    fn strict_needs_an_intercepting_tproxy_listener() {
        let issues = Config::parse_str(&format!("{MINIMAL}[accel]\nstrict = true\n")).unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "accel.strict" && i.message.contains("intercept")),
            "{issues:?}"
        );
        let cfg = Config::parse_str(
            "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
             intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
             [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\nstrict = true\n",
        )
        .unwrap();
        assert!(cfg.accel.strict);
        assert!(
            !Config::parse_str(MINIMAL).unwrap().accel.strict,
            "off by default"
        );
    }

    #[test]
    fn proxy_protocol_and_source_only_on_direct_routes() {
        use splitway_proto::proxy_protocol::Version;
        let cfg = with_psk(
            r#"
            name = "r"
            psk_file = "psk.key"
            [[listen]]
            mode = "peer"
            addr = "0.0.0.0:7100"
            accept_proxy_protocol = ["192.0.2.0/24", "2001:db8::/32"]
            [[peer]]
            name = "rs"
            addr = "10.0.12.2:7100"
            [[route]]
            dst = "10.0.3.0/24"
            via = "direct"
            proxy_protocol = "v2"
            source = "client"
            [[route]]
            dst = "0.0.0.0/0"
            via = "direct"
            proxy_protocol = "v1"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.listeners[0].accept_proxy_protocol.len(), 2);
        assert_eq!(cfg.routes[0].reveal.proxy_protocol, Some(Version::V2));
        assert!(cfg.routes[0].reveal.client_source);
        assert_eq!(cfg.routes[1].reveal.proxy_protocol, Some(Version::V1));
        assert!(!cfg.routes[1].reveal.client_source);

        let issues = with_psk(
            r#"
            name = "r"
            psk_file = "psk.key"
            [[listen]]
            mode = "socks5"
            addr = "127.0.0.1:1080"
            accept_proxy_protocol = ["192.0.2.1/24", "nope"]
            [[peer]]
            name = "rs"
            addr = "10.0.12.2:7100"
            [[route]]
            dst = "10.0.3.0/24"
            via = "rs"
            proxy_protocol = "v2"
            source = "client"
            [[route]]
            dst = "0.0.0.0/0"
            via = "direct"
            proxy_protocol = "v3"
            source = "server"
            "#,
        )
        .unwrap_err();
        let keys: Vec<_> = issues.iter().map(|i| i.key.as_str()).collect();
        for key in [
            "listen[0].accept_proxy_protocol[0]",
            "listen[0].accept_proxy_protocol[1]",
            "route[0].proxy_protocol",
            "route[0].source",
            "route[1].proxy_protocol",
            "route[1].source",
        ] {
            assert!(keys.contains(&key), "{key} missing from {issues:?}");
        }
        assert_eq!(issues.len(), 6, "{issues:?}");
    }

    #[test]
    fn accept_proxy_protocol_turns_auto_early_syn_off() {
        let cfg = Config::parse_str(
            "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
             intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
             accept_proxy_protocol = [\"10.0.0.0/8\"]\n\
             [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
        )
        .unwrap();
        assert!(!cfg.accel.early_syn);
    }

    #[test]
    fn accept_proxy_protocol_refused_with_syn_time_dials() {
        let issues = Config::parse_str(
            "name = \"r\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n\
             intercept = { interfaces = [\"eth0\"], ports = [80] }\n\
             accept_proxy_protocol = [\"10.0.0.0/8\"]\n\
             [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\nearly_syn = true\n",
        )
        .unwrap_err();
        assert!(
            issues
                .iter()
                .any(|i| i.key == "listen[0].accept_proxy_protocol" && i.message.contains("SYN")),
            "{issues:?}"
        );
    }

    /// `syn-option`: `allow_clients` is required (the option is
    /// unauthenticated); `syn_option_prefixes` are validated, each error
    /// with its key.
    #[test]
    fn syn_option_listener_keys_are_validated() {
        let base = |listen: &str| {
            format!(
                "name = \"rc\"\npsk_file = \"psk.key\"\n[[listen]]\n{listen}\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n"
            )
        };
        let keys = |text: &str| -> Vec<String> {
            with_psk(text)
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(|i| i.key)
                .collect()
        };
        assert_eq!(
            keys(&base("mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"")),
            ["listen[0].allow_clients"]
        );
        assert_eq!(
            keys(&base(
                "mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"\nallow_clients = [\"10.0.0.0/8\"]\nsyn_option_prefixes = [\"3=2001:db8::/48\", \"3=2001:db9::/48\", \"200=2001:db8::/48\", \"1=2001:db8::/16\", \"2=10.0.0.0/8\"]"
            )),
            [
                "listen[0].syn_option_prefixes[1]",
                "listen[0].syn_option_prefixes[2]",
                "listen[0].syn_option_prefixes[3]",
                "listen[0].syn_option_prefixes[4]",
            ]
        );
        assert_eq!(
            keys(&base(
                "mode = \"socks5\"\naddr = \"127.0.0.1:1080\"\nsyn_option_prefixes = [\"3=2001:db8::/48\"]"
            )),
            ["listen[0].syn_option_prefixes"]
        );
        let cfg = with_psk(&base(
            "mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"\nallow_clients = [\"10.0.0.0/8\"]\nsyn_option_prefixes = [\"3=2001:db8::1/48\"]",
        ))
        .unwrap();
        assert_eq!(cfg.listeners[0].mode, ListenMode::SynOption);
        assert_eq!(
            cfg.listeners[0].syn_option_prefixes,
            [(3, "2001:db8::/48".parse().unwrap())]
        );
        // Early SYN stays off without `watch`: nowhere to see the SYNs.
        assert!(!cfg.accel.early_syn);
    }

    /// `watch` on a syn-option listener turns auto early SYN on; it is
    /// refused elsewhere, with bad names, twice, or beside PROXY headers.
    #[test]
    fn syn_option_watch_turns_early_syn_on_and_is_validated() {
        let base = |listen: &str| {
            format!(
                "name = \"rc\"\npsk_file = \"psk.key\"\n[[listen]]\n{listen}\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n"
            )
        };
        let keys = |text: &str| -> Vec<String> {
            with_psk(text)
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(|i| i.key)
                .collect()
        };
        let synopt =
            "mode = \"syn-option\"\naddr = \"0.0.0.0:7200\"\nallow_clients = [\"10.0.0.0/8\"]";
        let cfg = with_psk(&base(&format!("{synopt}\nwatch = [\"eth0\"]"))).unwrap();
        assert_eq!(cfg.listeners[0].watch, ["eth0"]);
        assert!(
            cfg.accel.early_syn,
            "auto early SYN with a watched listener"
        );
        let off = with_psk(&base(&format!(
            "{synopt}\nwatch = [\"eth0\"]\n[accel]\nearly_syn = false"
        )))
        .unwrap();
        assert!(!off.accel.early_syn);
        assert_eq!(
            keys(&base(&format!(
                "{synopt}\nwatch = [\"eth0\", \"a b\", \"eth0\", \"\"]"
            ))),
            [
                "listen[0].watch[1]",
                "listen[0].watch[2]",
                "listen[0].watch[3]"
            ]
        );
        assert_eq!(
            keys(&base(
                "mode = \"socks5\"\naddr = \"127.0.0.1:1080\"\nwatch = [\"eth0\"]"
            )),
            ["listen[0].watch"]
        );
        assert_eq!(
            keys(&base(&format!(
                "{synopt}\nwatch = [\"eth0\"]\naccept_proxy_protocol = [\"10.0.0.1/32\"]"
            ))),
            ["listen[0].watch"]
        );
    }
}
