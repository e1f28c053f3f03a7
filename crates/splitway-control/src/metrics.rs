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

use std::fmt::{self, Write as _};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

pub use crate::path_metrics::PathMetrics;

/// Prefix of every metric name this crate exports.
pub const METRIC_PREFIX: &str = "splitway";

/// Upper bounds (seconds) of the `setup_seconds` histogram buckets: a
/// 1-2.5-5 ladder (exponential per decade) from 50 µs to 10 s. Chosen over
/// `exponential_buckets` so the `le` labels stay human-readable.
pub const SETUP_SECONDS_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Defines a label-value enum with `ALL`, `COUNT`, `as_str()`, `Display` and
/// an `EncodeLabelValue` impl that writes `as_str()`.
///
/// The derive from prometheus-client would export the Rust variant name
/// (`HttpConnect`); the exported values are the snake_case names instead.
macro_rules! label_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($value),+].len()] = [$($name::$variant),+];
            /// Number of values.
            pub const COUNT: usize = Self::ALL.len();

            /// The label value exported to Prometheus.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $value, )+
                }
            }

            /// Position in [`Self::ALL`]; indexes the pre-resolved handles.
            #[allow(dead_code)] // enums used only through a `Family` need no index
            const fn index(self) -> usize {
                self as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
                encoder.write_str(self.as_str())
            }
        }
    };
}

label_enum! {
    /// How a connection reached the relay.
    pub enum Mode {
        /// Transparently intercepted (TPROXY).
        Tproxy => "tproxy",
        /// SOCKS5 `CONNECT`.
        Socks5 => "socks5",
        /// HTTP `CONNECT`.
        HttpConnect => "http_connect",
        /// From an upstream splitway peer relay.
        Peer => "peer",
        /// The destination rode the client's SYN as a TCP option.
        SynOption => "syn_option",
    }
}

label_enum! {
    /// Why a relayed connection ended.
    pub enum CloseReason {
        /// Both directions finished normally.
        Completed => "completed",
        /// The client (on a peer listener: the upstream relay) reset the
        /// connection.
        ClientReset => "client_reset",
        /// The next leg (the server, or the next relay downstream) reset the
        /// connection. The label keeps its first name, `upstream_reset`, so
        /// dashboards and alerts keep working (docs/deployment.md).
        NextLegReset => "upstream_reset",
        /// The next leg's connect was refused.
        ConnectRefused => "connect_refused",
        /// The next leg's destination was unreachable.
        ConnectUnreachable => "connect_unreachable",
        /// The next leg's connect timed out.
        ConnectTimeout => "connect_timeout",
        /// The destination name did not resolve.
        ResolveFailed => "resolve_failed",
        /// No route matched the destination.
        NoRoute => "no_route",
        /// The relay-chain TTL ran out.
        TtlExceeded => "ttl_exceeded",
        /// Policy forbids the destination or the client.
        NotAllowed => "not_allowed",
        /// No data moved for the idle timeout.
        IdleTimeout => "idle_timeout",
        /// The client did not finish its handshake in time.
        HandshakeTimeout => "handshake_timeout",
        /// Peer or proxy authentication failed.
        AuthFailed => "auth_failed",
        /// The client's request could not be parsed.
        BadRequest => "bad_request",
        /// A bug or resource failure inside the relay.
        Internal => "internal",
    }
}

label_enum! {
    /// Why a peer relay's authentication was rejected.
    pub enum AuthFailureReason {
        /// The header did not start with the protocol magic.
        BadMagic => "bad_magic",
        /// Unsupported protocol version.
        BadVersion => "bad_version",
        /// The MAC did not verify.
        BadMac => "bad_mac",
        /// Verified, but refused (e.g. stale timestamp, replay, unknown key).
        Rejected => "rejected",
        /// The header was structurally invalid.
        Malformed => "malformed",
        /// The peer did not send its header in time.
        Timeout => "timeout",
        /// The peer closed before completing its header.
        Closed => "closed",
        /// The TLS handshake failed (no TLS, or a certificate not signed
        /// by the configured CA).
        Tls => "tls",
    }
}

label_enum! {
    /// Why the relay refused a connection before relaying any byte: access
    /// policy or connection limits. Each also counts in
    /// `connections_closed_total{reason="not_allowed"}`.
    pub enum DenyReason {
        /// The client's address is not in the listener's `allow_clients`.
        Client => "client",
        /// The destination address is outside `policy.allow_destinations`
        /// or inside `policy.deny_destinations`.
        Destination => "destination",
        /// The destination port is outside `policy.allow_ports`.
        Port => "port",
        /// A host-local destination (loopback, unspecified) asked for by a
        /// client from another host.
        Local => "local",
        /// `limits.max_connections` reached.
        ConnectionLimit => "connection_limit",
        /// `limits.per_client` reached for the client's address.
        PerClientLimit => "per_client_limit",
        /// The next relay refused the destination by its own policy.
        Downstream => "downstream",
        /// The destination is this relay itself: one of its listening ports
        /// on one of its own addresses (a direct connection to a TPROXY
        /// port, a proxy request for the relay's own listener).
        SelfDial => "self",
        /// The client SYN's IP TTL (or the hop limit carried from an
        /// upstream relay) ran out: a routing loop through relays.
        Loop => "loop",
        /// The open-file limit is near: new connections are shed so those
        /// already open keep their descriptors.
        Descriptors => "descriptors",
        /// A `syn-option` listener's client SYN carried no usable
        /// destination option (stripped by a middlebox, lost to a SYN
        /// cookie, malformed, or an unknown IPv6 prefix index).
        SynOption => "syn_option",
    }
}

label_enum! {
    /// Which way relayed bytes flowed.
    pub enum Direction {
        /// From the client towards the server (or next relay).
        ToServer => "to_server",
        /// From the server (or next relay) back to the client.
        ToClient => "to_client",
    }
}

label_enum! {
    /// What a leg of a relayed connection connects to.
    pub enum Leg {
        /// An end client (accepted via tproxy, SOCKS5 or HTTP CONNECT).
        Client => "client",
        /// Another splitway relay (accepted from upstream or dialled downstream).
        Peer => "peer",
        /// The final server.
        Direct => "direct",
    }
}

label_enum! {
    /// How relayed bytes were moved between the two sockets.
    pub enum Path {
        /// Zero-copy `splice(2)` through a pipe.
        Splice => "splice",
        /// Userspace read/write copy.
        Copy => "copy",
        /// A TLS leg: records sealed and opened in user space (no kTLS).
        Tls => "tls",
    }
}

label_enum! {
    /// What became of a client SYN seen by the early-SYN detector.
    pub enum EarlySynOutcome {
        /// The next leg was started at the SYN.
        Started => "started",
        /// The accepted connection found its early-started leg.
        Hit => "hit",
        /// The accepted connection found none; its leg started at accept.
        Miss => "miss",
        /// A retransmitted SYN whose leg was already started.
        Duplicate => "duplicate",
        /// Refused by the early-start budget (SYN flood protection).
        OverBudget => "over_budget",
        /// The client never completed its handshake; the leg was closed.
        Expired => "expired",
        /// The client would be refused at accept (`allow_clients`,
        /// `[limits]`): no leg was started for its SYN.
        Denied => "denied",
        /// The client's prefix is near (its accepts follow its SYNs within
        /// 200 µs): the detector did not report this SYN, whose leg
        /// started at accept.
        Near => "near",
    }
}

label_enum! {
    /// What became of a 0-RTT peer Hello (`[accel] zero_rtt`), on either end.
    pub enum ZeroRttOutcome {
        /// Dialer: the Hello went out in the SYN or right after the handshake.
        Sent => "sent",
        /// Dialer: the peer refused the Hello (stale, full, or no 0-RTT
        /// there); the leg was redialed with the challenge handshake.
        Fallback => "fallback",
        /// Acceptor: verified and fresh; the next leg started.
        Accepted => "accepted",
        /// Acceptor: outside the time window or older than this process.
        Stale => "stale",
        /// Acceptor: a nonce seen before (a replayed SYN).
        Replay => "replay",
        /// Acceptor: the replay window was full.
        Full => "full",
    }
}

label_enum! {
    /// Which end of a peer leg counted its handshake.
    pub enum LegSide {
        /// This relay dialed the leg (upstream end).
        Dial => "dial",
        /// This relay accepted the leg (downstream end).
        Accept => "accept",
    }
}

label_enum! {
    /// How a peer leg was authenticated before its Header was acted on.
    pub enum PeerHandshake {
        /// A 0-RTT Hello that rode the TCP Fast Open SYN.
        HelloSyn => "hello_syn",
        /// A 0-RTT Hello in the first segment after the handshake.
        Hello => "hello",
        /// The version-1 challenge–response on a fresh leg (a Hello
        /// refused, 0-RTT off, or a TLS leg).
        Challenge => "challenge",
        /// A pooled connection, authenticated in advance (dialer only).
        Pooled => "pooled",
    }
}

label_enum! {
    /// An acceleration whose effective state is exported.
    pub enum AccelName {
        EarlySyn => "early_syn",
        Strict => "strict",
        Pool => "pool",
        ZeroRtt => "zero_rtt",
        /// TCP Fast Open on the legs to and from peer relays.
        TfoPeer => "tfo_peer",
        /// TCP Fast Open accepted on client-facing listeners.
        TfoClient => "tfo_client",
        /// TCP Fast Open on direct legs to servers.
        TfoServer => "tfo_server",
        TurboStart => "turbo_start",
    }
}

label_enum! {
    /// What an acceleration is doing right now.
    pub enum AccelState {
        /// Switched off (explicitly, or nothing to apply it to).
        Off => "off",
        /// Running.
        Active => "active",
        /// Asked for (or auto) but this host cannot run it; `ctl status`
        /// says why.
        Unavailable => "unavailable",
    }
}

label_enum! {
    /// What strict mode did with a client SYN it held (NFQUEUE verdicts).
    pub enum StrictOutcome {
        /// The next leg reached the server: the SYN went on to the listener.
        Released => "released",
        /// The server (or a downstream relay's server) refused: reset.
        Refused => "refused",
        /// Our or a downstream relay's policy refused the destination: reset.
        Denied => "denied",
        /// The next leg timed out: the SYN was dropped.
        Timeout => "timeout",
        /// The server or a relay was unreachable: the SYN was dropped.
        Unreachable => "unreachable",
        /// A retransmitted SYN whose first copy is still held: dropped.
        Duplicate => "duplicate",
        /// A retransmitted SYN of a connection already released: let through.
        Retransmit => "retransmit",
        /// Beyond the pending-SYN budget (a flood): dropped.
        OverBudget => "over_budget",
        /// Not a TCP packet we could read: let through.
        Unparsed => "unparsed",
    }
}

label_enum! {
    /// Why a listener with `accept_proxy_protocol` refused a connection.
    pub enum ProxyRefusal {
        /// A trusted source sent no PROXY header (its first bytes are not one).
        Missing => "missing",
        /// The connection closed inside the header.
        Truncated => "truncated",
        /// A v1 line over 107 bytes, or a v2 length over the relay's limit.
        TooLong => "too_long",
        /// A header that breaks the specification (fields, version,
        /// command, family, a length that lies, a TLV that overruns).
        Malformed => "malformed",
        /// The header did not arrive within `timeouts.handshake`.
        Timeout => "timeout",
        /// A source outside `accept_proxy_protocol` sent a header.
        Untrusted => "untrusted",
    }
}

label_enum! {
    /// What happened to a peer's connection pool.
    pub enum PoolEvent {
        /// A pooled connection was taken for a split connection.
        Taken => "taken",
        /// A new authenticated connection joined the pool.
        Refilled => "refilled",
        /// A pooled connection was found dead and discarded.
        Dead => "dead",
        /// A pooled connection reached its idle lifetime and was closed.
        Expired => "expired",
        /// The pool was empty when a connection was needed.
        Miss => "miss",
        /// A refill dial or its authentication failed.
        DialFailure => "dial_failure",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EarlySynLabels {
    outcome: EarlySynOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZeroRttLabels {
    outcome: ZeroRttOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    side: LegSide,
    handshake: PeerHandshake,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccelLabels {
    accel: AccelName,
    state: AccelState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StrictLabels {
    outcome: StrictOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProxyRefusalLabels {
    reason: ProxyRefusal,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolEventLabels {
    peer: String,
    event: PoolEvent,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: Mode,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    mode: Mode,
    reason: CloseReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeniedLabels {
    reason: DenyReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthFailureLabels {
    reason: AuthFailureReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BytesLabels {
    direction: Direction,
    path: Path,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LegBytesLabels {
    leg: Leg,
    direction: Direction,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: Path,
}

/// Label set of `splitway_peer_connect_failures_total`.
///
/// `peer` must be a peer NAME from the configuration, never an address or any
/// other value derived from traffic: the config is what bounds this label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// Configured peer name.
    pub peer: String,
}

type CounterU64 = Counter<u64, AtomicU64>;
type SetupHistogramFamily = Family<ModeLabels, Histogram, fn() -> Histogram>;

fn new_setup_histogram() -> Histogram {
    Histogram::new(SETUP_SECONDS_BUCKETS)
}

/// One peer's `pool_events_total` and `pool_level` series (handles into the
/// registry): an update is one atomic operation, no label lookup or lock.
#[derive(Clone, Debug)]
pub struct PoolMetrics {
    events: [CounterU64; PoolEvent::COUNT],
    level: Gauge,
}

impl PoolMetrics {
    /// Counts `n` pool events.
    pub fn event(&self, event: PoolEvent, n: u64) {
        if n > 0 {
            self.events[event.index()].inc_by(n);
        }
    }

    /// This peer's `pool_events_total{event}` so far (the `/status` pool
    /// counts read it: one source of truth).
    pub fn count(&self, event: PoolEvent) -> u64 {
        self.events[event.index()].get()
    }

    /// Sets the pool level gauge.
    pub fn level(&self, level: usize) {
        self.level.set(level as i64);
    }
}

/// The `early_syn_total` series (handles into the registry), held by the
/// early-SYN table that counts them; `/status` reads them back.
#[derive(Clone, Debug)]
pub struct EarlySynMetrics {
    outcomes: [CounterU64; EarlySynOutcome::COUNT],
}

impl EarlySynMetrics {
    /// Counts `n` early-SYN outcomes.
    pub fn count(&self, outcome: EarlySynOutcome, n: u64) {
        if n > 0 {
            self.outcomes[outcome.index()].inc_by(n);
        }
    }

    /// `early_syn_total{outcome}` so far.
    pub fn get(&self, outcome: EarlySynOutcome) -> u64 {
        self.outcomes[outcome.index()].get()
    }
}

/// The relay's metrics registry. Create once, share as `Arc<Metrics>`.
///
/// Exported families (all prefixed `splitway_`):
///
/// | name | type | labels |
/// | --- | --- | --- |
/// | `connections_accepted_total` | counter | `mode` |
/// | `connections_active` | gauge | `mode` |
/// | `connections_closed_total` | counter | `mode`, `reason` |
/// | `denied_total` | counter | `reason` |
/// | `accept_errors_total` | counter | `mode` |
/// | `peer_auth_failures_total` | counter | `reason` |
/// | `forwarded_bytes_total` | counter | `direction`, `path` |
/// | `data_path_chosen_total` | counter | `path` |
/// | `setup_seconds` | histogram | `mode` |
/// | `peer_connect_failures_total` | counter | `peer` (config names) |
/// | `early_syn_total` | counter | `outcome` |
/// | `zero_rtt_total` | counter | `outcome` |
/// | `peer_handshakes_total` | counter | `side`, `handshake` |
/// | `accel_state` | gauge (1 for the current state, else 0) | `accel`, `state` |
/// | `strict_syn_total` | counter | `outcome` |
/// | `proxy_protocol_refused_total` | counter | `reason` |
/// | `pool_events_total` | counter | `peer`, `event` |
/// | `pool_level` | gauge | `peer` |
/// | `leg_sent_bytes_total` | counter | `leg`, `direction` |
/// | `path_*` | see [`PathMetrics`] | `route`, `candidate`, `peer` |
pub struct Metrics {
    registry: Registry,
    paths: PathMetrics,
    accepted: [CounterU64; Mode::COUNT],
    active: [Gauge; Mode::COUNT],
    closed: [[CounterU64; CloseReason::COUNT]; Mode::COUNT],
    denied: [CounterU64; DenyReason::COUNT],
    accept_errors: [CounterU64; Mode::COUNT],
    auth_failures: [CounterU64; AuthFailureReason::COUNT],
    forwarded_bytes: [[CounterU64; Path::COUNT]; Direction::COUNT],
    leg_sent_bytes: [[CounterU64; Direction::COUNT]; Leg::COUNT],
    path_chosen: [CounterU64; Path::COUNT],
    setup_seconds: [Histogram; Mode::COUNT],
    peer_connect_failures: Family<PeerLabels, CounterU64>,
    early_syn: [CounterU64; EarlySynOutcome::COUNT],
    zero_rtt: [CounterU64; ZeroRttOutcome::COUNT],
    handshakes: [[CounterU64; PeerHandshake::COUNT]; LegSide::COUNT],
    accel_state: [[Gauge; AccelState::COUNT]; AccelName::COUNT],
    strict_syn: [CounterU64; StrictOutcome::COUNT],
    proxy_refused: [CounterU64; ProxyRefusal::COUNT],
    pool_events: Family<PoolEventLabels, CounterU64>,
    pool_level: Family<PeerLabels, Gauge>,
}

/// One series per label value, created now (so exported at zero) and kept
/// as a handle: `labels` makes each value's label set.
fn series<S, M, C, V, const N: usize>(
    family: &Family<S, M, C>,
    values: [V; N],
    labels: impl Fn(V) -> S,
) -> [M; N]
where
    S: Clone + std::hash::Hash + Eq,
    M: Clone,
    C: MetricConstructor<M>,
{
    values.map(|v| family.get_or_create(&labels(v)).clone())
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

impl Metrics {
    /// Creates the registry with every family registered and every
    /// enum-labelled series present at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(METRIC_PREFIX);

        // prometheus-client appends `_total` to counter names itself.
        let accepted_family = Family::<ModeLabels, CounterU64>::default();
        registry.register(
            "connections_accepted",
            "Connections accepted, by how they arrived",
            accepted_family.clone(),
        );
        let active_family = Family::<ModeLabels, Gauge>::default();
        registry.register(
            "connections_active",
            "Connections currently being relayed",
            active_family.clone(),
        );
        let closed_family = Family::<ClosedLabels, CounterU64>::default();
        registry.register(
            "connections_closed",
            "Connections closed, by mode and reason",
            closed_family.clone(),
        );
        let denied_family = Family::<DeniedLabels, CounterU64>::default();
        registry.register(
            "denied",
            "Connections refused by access policy or connection limits, by reason",
            denied_family.clone(),
        );
        let accept_errors_family = Family::<ModeLabels, CounterU64>::default();
        registry.register(
            "accept_errors",
            "Failed accept() calls (e.g. out of file descriptors), by listener mode",
            accept_errors_family.clone(),
        );
        let auth_family = Family::<AuthFailureLabels, CounterU64>::default();
        registry.register(
            "peer_auth_failures",
            "Peer relay authentication failures, by reason",
            auth_family.clone(),
        );
        let bytes_family = Family::<BytesLabels, CounterU64>::default();
        registry.register(
            "forwarded_bytes",
            "Bytes forwarded, by direction and data path",
            bytes_family.clone(),
        );
        let leg_bytes_family = Family::<LegBytesLabels, CounterU64>::default();
        registry.register_with_unit(
            "leg_sent",
            "Bytes the relay wrote to its legs, by leg kind and direction",
            Unit::Bytes,
            leg_bytes_family.clone(),
        );
        let path_family = Family::<PathLabels, CounterU64>::default();
        registry.register(
            "data_path_chosen",
            "Connection directions that moved data, by data path",
            path_family.clone(),
        );
        let setup_family: SetupHistogramFamily =
            Family::new_with_constructor(new_setup_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "setup",
            "Time from accept until the next leg is connected",
            Unit::Seconds,
            setup_family.clone(),
        );
        let peer_connect_failures = Family::<PeerLabels, CounterU64>::default();
        registry.register(
            "peer_connect_failures",
            "Failed connects to a configured peer relay, by peer name",
            peer_connect_failures.clone(),
        );

        let early_family = Family::<EarlySynLabels, CounterU64>::default();
        registry.register(
            "early_syn",
            "Client SYNs seen by the early-SYN detector, by outcome",
            early_family.clone(),
        );
        let zero_rtt_family = Family::<ZeroRttLabels, CounterU64>::default();
        registry.register(
            "zero_rtt",
            "0-RTT peer Hellos, by outcome (dialer and acceptor side)",
            zero_rtt_family.clone(),
        );
        let handshake_family = Family::<HandshakeLabels, CounterU64>::default();
        registry.register(
            "peer_handshakes",
            "Peer legs by how they were authenticated, on the dialing and the accepting end",
            handshake_family.clone(),
        );
        let accel_family = Family::<AccelLabels, Gauge>::default();
        registry.register(
            "accel_state",
            "Effective state of each acceleration: 1 on the state it is in, 0 on the others",
            accel_family.clone(),
        );
        let strict_family = Family::<StrictLabels, CounterU64>::default();
        registry.register(
            "strict_syn",
            "Client SYNs held by strict mode, by verdict",
            strict_family.clone(),
        );
        let proxy_refused_family = Family::<ProxyRefusalLabels, CounterU64>::default();
        registry.register(
            "proxy_protocol_refused",
            "Connections refused by a listener with accept_proxy_protocol, by reason",
            proxy_refused_family.clone(),
        );
        let pool_events = Family::<PoolEventLabels, CounterU64>::default();
        registry.register(
            "pool_events",
            "Connection pool events, by peer name and event",
            pool_events.clone(),
        );
        let pool_level = Family::<PeerLabels, Gauge>::default();
        registry.register(
            "pool_level",
            "Idle authenticated connections in each peer's pool",
            pool_level.clone(),
        );

        // Handles are Arc-backed: a clone updates the series in the registry.
        Self {
            early_syn: series(&early_family, EarlySynOutcome::ALL, |outcome| {
                EarlySynLabels { outcome }
            }),
            zero_rtt: series(&zero_rtt_family, ZeroRttOutcome::ALL, |outcome| {
                ZeroRttLabels { outcome }
            }),
            handshakes: LegSide::ALL.map(|side| {
                series(&handshake_family, PeerHandshake::ALL, |handshake| {
                    HandshakeLabels { side, handshake }
                })
            }),
            accel_state: AccelName::ALL.map(|accel| {
                let gauges = series(&accel_family, AccelState::ALL, |state| AccelLabels {
                    accel,
                    state,
                });
                // Until the relay says otherwise, everything is off.
                gauges[AccelState::Off.index()].set(1);
                gauges
            }),
            strict_syn: series(&strict_family, StrictOutcome::ALL, |outcome| StrictLabels {
                outcome,
            }),
            proxy_refused: series(&proxy_refused_family, ProxyRefusal::ALL, |reason| {
                ProxyRefusalLabels { reason }
            }),
            pool_events,
            pool_level,
            accepted: series(&accepted_family, Mode::ALL, |mode| ModeLabels { mode }),
            active: series(&active_family, Mode::ALL, |mode| ModeLabels { mode }),
            closed: Mode::ALL.map(|mode| {
                series(&closed_family, CloseReason::ALL, |reason| ClosedLabels {
                    mode,
                    reason,
                })
            }),
            denied: series(&denied_family, DenyReason::ALL, |reason| DeniedLabels {
                reason,
            }),
            accept_errors: series(&accept_errors_family, Mode::ALL, |mode| ModeLabels { mode }),
            auth_failures: series(&auth_family, AuthFailureReason::ALL, |reason| {
                AuthFailureLabels { reason }
            }),
            forwarded_bytes: Direction::ALL.map(|direction| {
                series(&bytes_family, Path::ALL, |path| BytesLabels {
                    direction,
                    path,
                })
            }),
            leg_sent_bytes: Leg::ALL.map(|leg| {
                series(&leg_bytes_family, Direction::ALL, |direction| {
                    LegBytesLabels { leg, direction }
                })
            }),
            path_chosen: series(&path_family, Path::ALL, |path| PathLabels { path }),
            setup_seconds: series(&setup_family, Mode::ALL, |mode| ModeLabels { mode }),
            peer_connect_failures,
            paths: PathMetrics::register(&mut registry),
            registry,
        }
    }

    /// The path-choice series.
    pub fn paths(&self) -> &PathMetrics {
        &self.paths
    }

    /// Counts a connection accepted in `mode`.
    pub fn accepted(&self, mode: Mode) {
        self.accepted[mode.index()].inc();
    }

    /// Counts a connection as active in `mode` until the guard is dropped.
    pub fn active(&self, mode: Mode) -> ActiveGuard {
        let gauge = self.active[mode.index()].clone();
        gauge.inc();
        ActiveGuard { gauge }
    }

    /// Counts a connection in `mode` closed for `reason`.
    pub fn closed(&self, mode: Mode, reason: CloseReason) {
        self.closed[mode.index()][reason.index()].inc();
    }

    /// Counts a connection refused by policy or limits. The caller also
    /// counts it closed with [`CloseReason::NotAllowed`].
    pub fn denied(&self, reason: DenyReason) {
        self.denied[reason.index()].inc();
    }

    /// Counts a failed `accept()` on a listener of `mode`.
    pub fn accept_error(&self, mode: Mode) {
        self.accept_errors[mode.index()].inc();
    }

    /// Counts a failed peer authentication.
    pub fn auth_failure(&self, reason: AuthFailureReason) {
        self.auth_failures[reason.index()].inc();
    }

    /// Adds `n` bytes forwarded in `direction` over `path`.
    pub fn bytes(&self, direction: Direction, path: Path, n: u64) {
        self.forwarded_bytes[direction.index()][path.index()].inc_by(n);
    }

    /// Adds `n` bytes written to a leg of kind `leg` in `direction`.
    ///
    /// Counted where the relay writes, so every forwarded byte is counted
    /// once per leg it leaves on: on a client relay, `{leg="peer",
    /// direction="to_server"}` is the upload carried over the long haul and
    /// `{leg="client", direction="to_client"}` the download delivered.
    pub fn leg_bytes(&self, leg: Leg, direction: Direction, n: u64) {
        self.leg_sent_bytes[leg.index()][direction.index()].inc_by(n);
    }

    /// Counts one connection direction that moved data over `path`.
    pub fn data_path_chosen(&self, path: Path) {
        self.path_chosen[path.index()].inc();
    }

    /// Records the time from accept until the next leg was connected.
    pub fn observe_setup(&self, mode: Mode, elapsed: Duration) {
        self.setup_seconds[mode.index()].observe(elapsed.as_secs_f64());
    }

    /// Creates the `peer_connect_failures_total` series for a configured peer
    /// at zero, so it is exported before the first failure.
    ///
    /// `peer` must be a peer name from the configuration (see [`PeerLabels`]).
    pub fn register_peer(&self, peer: &str) {
        // The guard only reads; creating the series is the point.
        let _series = self.peer_connect_failures.get_or_create(&PeerLabels {
            peer: peer.to_owned(),
        });
        let _pool = self.pool_metrics(peer);
    }

    /// Counts a failed connect to the configured peer named `peer`.
    ///
    /// `peer` must be a peer name from the configuration (see [`PeerLabels`]).
    /// Allocates a label set: failures are off the hot path.
    pub fn peer_connect_failure(&self, peer: &str) {
        self.peer_connect_failures
            .get_or_create(&PeerLabels {
                peer: peer.to_owned(),
            })
            .inc();
    }

    /// The early-SYN series, for the table that counts them.
    pub fn early_syn_metrics(&self) -> EarlySynMetrics {
        EarlySynMetrics {
            outcomes: self.early_syn.clone(),
        }
    }

    /// Counts a 0-RTT Hello outcome.
    pub fn zero_rtt(&self, outcome: ZeroRttOutcome) {
        self.zero_rtt[outcome.index()].inc();
    }

    /// Counts how a peer leg was authenticated.
    pub fn peer_handshake(&self, side: LegSide, handshake: PeerHandshake) {
        self.handshakes[side.index()][handshake.index()].inc();
    }

    /// Records the state `accel` is in now.
    pub fn set_accel_state(&self, accel: AccelName, state: AccelState) {
        for (s, g) in AccelState::ALL.iter().zip(&self.accel_state[accel.index()]) {
            g.set(i64::from(*s == state));
        }
    }

    /// The state last recorded for `accel`.
    pub fn accel_state(&self, accel: AccelName) -> AccelState {
        AccelState::ALL
            .into_iter()
            .zip(&self.accel_state[accel.index()])
            .find(|(_, g)| g.get() == 1)
            .map_or(AccelState::Off, |(s, _)| s)
    }

    /// Counts a strict-mode verdict.
    pub fn strict_syn(&self, outcome: StrictOutcome) {
        self.strict_syn[outcome.index()].inc();
    }

    /// Counts a connection refused for its PROXY protocol header.
    pub fn proxy_refused(&self, reason: ProxyRefusal) {
        self.proxy_refused[reason.index()].inc();
    }

    /// Counts `n` pool events for the configured peer `peer`.
    pub fn pool_event(&self, peer: &str, event: PoolEvent, n: u64) {
        if n > 0 {
            self.pool_events
                .get_or_create(&PoolEventLabels {
                    peer: peer.to_owned(),
                    event,
                })
                .inc_by(n);
        }
    }

    /// The pool series of the configured peer `peer`, resolved once for
    /// a pool that updates them on every connection it hands out.
    pub fn pool_metrics(&self, peer: &str) -> PoolMetrics {
        PoolMetrics {
            events: series(&self.pool_events, PoolEvent::ALL, |event| PoolEventLabels {
                peer: peer.to_owned(),
                event,
            }),
            level: self
                .pool_level
                .get_or_create(&PeerLabels {
                    peer: peer.to_owned(),
                })
                .clone(),
        }
    }

    /// Sets the pool level gauge of the configured peer `peer`.
    pub fn pool_level(&self, peer: &str, level: usize) {
        self.pool_level
            .get_or_create(&PeerLabels {
                peer: peer.to_owned(),
            })
            .set(level as i64);
    }

    /// Current `connections_active{mode}` value.
    pub fn active_count(&self, mode: Mode) -> i64 {
        self.active[mode.index()].get()
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

/// Keeps `connections_active{mode}` incremented while alive; decrements on
/// drop, so every exit path of a connection task is counted.
#[must_use = "the connection stops counting as active as soon as the guard is dropped"]
#[derive(Debug)]
pub struct ActiveGuard {
    gauge: Gauge,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.gauge.dec();
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
            "splitway_early_syn_total{outcome=\"hit\"} 0",
            "splitway_pool_events_total{peer=\"tokyo\",event=\"miss\"} 0",
            "splitway_pool_level{peer=\"tokyo\"} 0",
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
