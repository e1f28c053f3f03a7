//! Peer-leg families: authentication failures and handshakes on either end
//! (`splitway-relay`'s `peer` and `dial`), connect failures to configured
//! peers. 0-RTT Hello outcomes are counted in the relay's `zero_rtt` room.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::{CounterU64, declare, series};
use splitway_proto::auth::AuthError;

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

/// The reason an authentication error is counted under: here, not in
/// `peer/`, because the accepting end's handshake (`peer/downstream.rs`)
/// and an accepted Hello's Confirm (`zero_rtt/`) both count with it.
pub(crate) fn auth_reason(e: &AuthError) -> AuthFailureReason {
    match e.reason_label() {
        "bad_magic" => AuthFailureReason::BadMagic,
        "bad_version" => AuthFailureReason::BadVersion,
        "bad_mac" => AuthFailureReason::BadMac,
        "rejected" => AuthFailureReason::Rejected,
        _ => AuthFailureReason::Malformed,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthFailureLabels {
    reason: AuthFailureReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    side: LegSide,
    handshake: PeerHandshake,
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

/// `peer_auth_failures_total`, `peer_connect_failures_total` and
/// `peer_handshakes_total`.
#[derive(Clone, Debug)]
pub struct PeerMetrics {
    auth_failures: [CounterU64; AuthFailureReason::COUNT],
    connect_failures: Family<PeerLabels, CounterU64>,
    handshakes: [[CounterU64; PeerHandshake::COUNT]; LegSide::COUNT],
}

impl PeerMetrics {
    /// Declares the three families in `registry`, every enum-labelled
    /// series at zero (`peer`-labelled ones appear per configured peer).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let auth_family: Family<AuthFailureLabels, CounterU64> = declare(
            registry,
            "peer_auth_failures",
            "Peer relay authentication failures, by reason",
        );
        let connect_failures: Family<PeerLabels, CounterU64> = declare(
            registry,
            "peer_connect_failures",
            "Failed connects to a configured peer relay, by peer name",
        );
        let handshake_family: Family<HandshakeLabels, CounterU64> = declare(
            registry,
            "peer_handshakes",
            "Peer legs by how they were authenticated, on the dialing and the accepting end",
        );
        PeerMetrics {
            auth_failures: series(&auth_family, AuthFailureReason::ALL, |reason| {
                AuthFailureLabels { reason }
            }),
            connect_failures,
            handshakes: LegSide::ALL.map(|side| {
                series(&handshake_family, PeerHandshake::ALL, |handshake| {
                    HandshakeLabels { side, handshake }
                })
            }),
        }
    }

    /// Counts a failed peer authentication.
    pub fn auth_failure(&self, reason: AuthFailureReason) {
        self.auth_failures[reason.index()].inc();
    }

    /// Creates the configured peer's connect-failure series at zero.
    pub fn register_peer(&self, peer: &str) {
        // The guard only reads; creating the series is the point.
        let _series = self.connect_failures.get_or_create(&PeerLabels {
            peer: peer.to_owned(),
        });
    }

    /// Counts a failed connect to the configured peer named `peer`
    /// (allocates a label set: failures are off the hot path).
    pub fn connect_failure(&self, peer: &str) {
        self.connect_failures
            .get_or_create(&PeerLabels {
                peer: peer.to_owned(),
            })
            .inc();
    }

    /// Counts how a peer leg was authenticated.
    pub fn handshake(&self, side: LegSide, handshake: PeerHandshake) {
        self.handshakes[side.index()][handshake.index()].inc();
    }
}
