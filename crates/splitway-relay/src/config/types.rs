//! The validated configuration's types: what the relay runs on.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use splitway_proto::auth::Psk;

use crate::policy::Policy;
use crate::tls::{PeerTls, TlsContext};

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
    /// `metrics`: an address serving only `GET /metrics`, for a scraper
    /// that must not reach the admin API (a cluster's Prometheus).
    pub metrics: Option<SocketAddr>,
    /// Threads that run connections (`workers`); `None`: one per CPU.
    pub workers: Option<usize>,
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
    /// `[access_log]`; `None`: off.
    pub access_log: Option<AccessLogConfig>,
}

/// `[access_log]`: where closed connections are logged, one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    pub path: PathBuf,
    pub format: AccessLogFormat,
}

/// An access log line's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessLogFormat {
    /// `key=value` pairs.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

/// Connection limits (0 = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Split connections open at once, all listeners together.
    pub max_connections: usize,
    /// Connections open at once from one client address (peer listeners,
    /// whose clients are relays carrying many users, are exempt).
    pub per_client: usize,
    /// SOCKS5 and CONNECT connections from one client address still in
    /// their handshake (request not read yet), and peer-listener
    /// connections not yet authenticated; 0 = unlimited. Bounds what a
    /// silent source holds for `timeouts.handshake` each.
    pub handshaking_per_client: usize,
    /// Wrong proxy credentials (`auth_file`) from one address (IPv6: its
    /// /64) before it is reset at accept there; one is forgiven every 6 s.
    /// 0 = unlimited.
    pub credential_failures: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 100_000,
            per_client: 0,
            handshaking_per_client: 64,
            credential_failures: 10,
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
    pub(super) fn from_raw(v: Option<bool>) -> Switch {
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
    pub learned_window: Switch,
    pub loss_isolation: Switch,
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
    /// At most this many of them for one client prefix (IPv4 /24, IPv6
    /// /64), so one flooding prefix cannot take the whole budget. Default:
    /// an eighth of `early_syn_budget` (at least 1).
    pub early_syn_prefix_budget: usize,
    /// How long an early-started leg waits for its client's accept at
    /// most; an unanswered one is closed sooner, after a few of its
    /// prefix's handshake round trips (`early_syn::EarlyStarts`).
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
    /// Relay legs (dialed to a `[[peer]]` without a `congestion` key, or
    /// accepted from an upstream relay when `[upstream]` has none) run
    /// [`LEARNED_WINDOW_CC`]: each connection starts from the window the
    /// last one to the same peer reached, validated by RTT, paced, and
    /// retreating on loss (docs/congestion.md). Auto: on when the relay has
    /// relay legs and no `[accel.turbo]` (which sets their window itself).
    pub learned_window: bool,
    /// Client legs whose client's last leg lost data without queueing run
    /// [`LOSS_TOLERANT_CC`] (`loss_isolation`); the others keep the kernel's
    /// default. Auto: on unless `[client] congestion` names an algorithm.
    pub loss_isolation: bool,
}

/// The congestion control loss isolation gives lossy client legs: a
/// model-based algorithm that random loss does not slow.
pub use crate::loss_isolation::LOSS_TOLERANT_CC;

/// The congestion control that gives relay legs their learned window.
pub const LEARNED_WINDOW_CC: &str = "splitway_resume";

/// Socket buffers of relay legs with a learned window. The initial receive
/// window is what the receive buffer holds (Linux 6.10+), and an
/// autotuned buffer starts at 128 KB and grows one round trip at a time,
/// so a sender resuming at the path's window would wait on the receiver's
/// slow start instead of its own. 4 MiB holds 100 Mbit/s × 320 ms; the
/// kernel caps it at net.core.rmem_max / wmem_max.
pub const LEARNED_WINDOW_BUFFER: usize = 4 << 20;

impl Accel {
    /// Socket buffers for relay legs whose config sets none: turbo-start's,
    /// or the learned window's.
    pub fn relay_leg_buffer(&self) -> Option<usize> {
        self.turbo
            .map(|t| t.buffer)
            .or(self.learned_window.then_some(LEARNED_WINDOW_BUFFER))
    }
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
            early_syn_prefix_budget: 1024 / 8,
            early_syn_expiry: Duration::from_secs(10),
            strict: false,
            pool: false,
            tfo: false,
            tfo_direct: false,
            turbo: None,
            zero_rtt: false,
            zero_rtt_window: Duration::from_secs(10),
            learned_window: false,
            loss_isolation: false,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

// What each mode is (its name, whether it intercepts, ...) is the
// listeners' knowledge: `listeners/mode.rs`.

/// Candidates per route: each one is probed once a second at most.
pub const MAX_CANDIDATES: usize = 8;

/// Upper bound of `workers`.
pub const MAX_WORKERS: usize = 1024;

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
    /// `auth_file`: SOCKS5 and HTTP proxy clients must give a user name
    /// and password from this list (on top of `allow_clients`).
    pub users: Option<std::sync::Arc<super::users::ProxyUsers>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// TCP_USER_TIMEOUT: how long sent data may stay unacknowledged (and,
    /// with keepalive, how long probes may go unanswered) before the kernel
    /// drops the connection; `None`: the leg kind's default
    /// (`tuning::PEER_USER_TIMEOUT_DEFAULT` on relay legs, none on client
    /// and server legs); `Some(None)`: off.
    pub user_timeout: Option<Option<Duration>>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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
    /// The full key path (`listen[2].intercept.interfaces[0]`), or what
    /// failed when no key did (`(syntax)`, `(file)`).
    pub key: String,
    pub message: String,
    /// Where in the file: the key, or the nearest of its parents written
    /// there (`None` for a key the file lacks wholly, or its unreadable file).
    pub at: Option<Location>,
}

/// A place in a config file, both numbers from 1 (as editors count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    /// In characters, not bytes.
    pub column: usize,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// All problems of a config file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigErrors {
    pub path: String,
    pub issues: Vec<ConfigIssue>,
}

impl ConfigErrors {
    /// One line per issue, `file:line:col: key: message` as compilers write
    /// them, so that an editor jumps to each (`file: key: message` for a
    /// key the file does not have).
    pub fn lines(&self) -> Vec<String> {
        self.issues
            .iter()
            .map(|i| match i.at {
                Some(at) => format!("{}:{at}: {i}", self.path),
                None => format!("{}: {i}", self.path),
            })
            .collect()
    }
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
        for line in self.lines() {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}
