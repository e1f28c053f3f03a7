//! `proxy_protocol_refused_total`: counted by the PROXY header reader
//! (`splitway-relay`'s `proxy_header`) of listeners with
//! `accept_proxy_protocol`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::family::{CounterU64, declare, series};

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProxyRefusalLabels {
    reason: ProxyRefusal,
}

/// The `proxy_protocol_refused_total` series.
#[derive(Clone, Debug)]
pub struct ProxyProtocolMetrics {
    refused: [CounterU64; ProxyRefusal::COUNT],
}

impl ProxyProtocolMetrics {
    /// Declares the family in `registry`, every reason at zero.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let family: Family<ProxyRefusalLabels, CounterU64> = declare(
            registry,
            "proxy_protocol_refused",
            "Connections refused by a listener with accept_proxy_protocol, by reason",
        );
        ProxyProtocolMetrics {
            refused: series(&family, ProxyRefusal::ALL, |reason| ProxyRefusalLabels {
                reason,
            }),
        }
    }

    /// Counts a connection refused for its PROXY protocol header.
    pub fn refused(&self, reason: ProxyRefusal) {
        self.refused[reason.index()].inc();
    }
}
