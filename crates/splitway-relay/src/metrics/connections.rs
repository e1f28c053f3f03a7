//! Connection lifecycle families, counted where connections are accepted,
//! refused, timed to their next leg and closed (`splitway-relay`'s
//! `ingress`, `session`, `limits` and `policy`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use splitway_control::label_enum;
use splitway_control::metrics::kit::{CounterU64, declare, series};

/// Upper bounds (seconds) of the `setup_seconds` histogram buckets: a
/// 1-2.5-5 ladder (exponential per decade) from 50 µs to 10 s. Chosen over
/// `exponential_buckets` so the `le` labels stay human-readable.
pub const SETUP_SECONDS_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

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
        /// A link-local destination (169.254.0.0/16, fe80::/10, AWS's
        /// fd00:ec2::254): cloud metadata (`policy.allow_link_local`).
        LinkLocal => "link_local",
        /// One of the relay host's own addresses, asked for by a client
        /// from another host (`policy.allow_host_addresses`).
        HostAddress => "host_address",
        /// A multicast or broadcast destination.
        Multicast => "multicast",
        /// A SOCKS5 or HTTP proxy client gave no user name and password
        /// from the listener's `auth_file`, or a wrong one.
        Credentials => "credentials",
        /// The source gave wrong proxy credentials
        /// `limits.credential_failures` times lately: reset at accept.
        Guessing => "guessing",
        /// A SOCKS5 or CONNECT client that is a relay: a chain nested
        /// through relays (`policy.allow_relay_clients`).
        Nesting => "nesting",
        /// The client's address already has `limits.handshaking_per_client`
        /// connections still in their handshake.
        Handshaking => "handshaking",
    }
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

type SetupHistogramFamily = Family<ModeLabels, Histogram, fn() -> Histogram>;

fn new_setup_histogram() -> Histogram {
    Histogram::new(SETUP_SECONDS_BUCKETS)
}

/// `connections_accepted_total`, `connections_active`,
/// `connections_closed_total`, `denied_total`, `accept_errors_total` and
/// `setup_seconds`.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    accepted: [CounterU64; Mode::COUNT],
    active: [Gauge; Mode::COUNT],
    closed: [[CounterU64; CloseReason::COUNT]; Mode::COUNT],
    denied: [CounterU64; DenyReason::COUNT],
    accept_errors: [CounterU64; Mode::COUNT],
    setup_seconds: [Histogram; Mode::COUNT],
}

impl ConnectionMetrics {
    /// Declares the six families in `registry`, every series at zero.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        // prometheus-client appends `_total` to counter names itself.
        let accepted_family: Family<ModeLabels, CounterU64> = declare(
            registry,
            "connections_accepted",
            "Connections accepted, by how they arrived",
        );
        let active_family: Family<ModeLabels, Gauge> = declare(
            registry,
            "connections_active",
            "Connections currently being relayed",
        );
        let closed_family: Family<ClosedLabels, CounterU64> = declare(
            registry,
            "connections_closed",
            "Connections closed, by mode and reason",
        );
        let denied_family: Family<DeniedLabels, CounterU64> = declare(
            registry,
            "denied",
            "Connections refused by access policy or connection limits, by reason",
        );
        let accept_errors_family: Family<ModeLabels, CounterU64> = declare(
            registry,
            "accept_errors",
            "Failed accept() calls (e.g. out of file descriptors), by listener mode",
        );
        let setup_family: SetupHistogramFamily =
            Family::new_with_constructor(new_setup_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "setup",
            "Time from accept until the next leg is connected",
            Unit::Seconds,
            setup_family.clone(),
        );
        ConnectionMetrics {
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
            setup_seconds: series(&setup_family, Mode::ALL, |mode| ModeLabels { mode }),
        }
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

    /// Current `connections_active{mode}` value.
    pub fn active_count(&self, mode: Mode) -> i64 {
        self.active[mode.index()].get()
    }

    /// Counts a connection in `mode` closed for `reason`.
    pub fn closed(&self, mode: Mode, reason: CloseReason) {
        self.closed[mode.index()][reason.index()].inc();
    }

    /// Counts a connection refused by policy or limits.
    pub fn denied(&self, reason: DenyReason) {
        self.denied[reason.index()].inc();
    }

    /// Counts a failed `accept()` on a listener of `mode`.
    pub fn accept_error(&self, mode: Mode) {
        self.accept_errors[mode.index()].inc();
    }

    /// Records the time from accept until the next leg was connected.
    pub fn observe_setup(&self, mode: Mode, elapsed: Duration) {
        self.setup_seconds[mode.index()].observe(elapsed.as_secs_f64());
    }
}

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
