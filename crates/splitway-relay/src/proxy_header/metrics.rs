//! The room's metrics: `splitway_proxy_protocol_refused_total{reason}`,
//! counted when a listener with `accept_proxy_protocol` refuses a
//! connection for its PROXY header; declared in the relay's registry at
//! bind.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::{CounterU64, declare, series};

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
    pub fn register(registry: &mut Registry) -> Self {
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

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;

    use super::*;

    /// Name, type and help byte for byte, every reason exported at zero.
    #[test]
    fn declared_in_the_relays_registry_under_its_name() {
        let mut builder = Metrics::builder();
        let refused = ProxyProtocolMetrics::register(builder.registry());
        refused.refused(ProxyRefusal::Untrusted);
        let text = builder.build().encode();
        for line in [
            "# HELP splitway_proxy_protocol_refused Connections refused by a listener with accept_proxy_protocol, by reason.\n",
            "# TYPE splitway_proxy_protocol_refused counter\n",
            "splitway_proxy_protocol_refused_total{reason=\"untrusted\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        for reason in ProxyRefusal::ALL {
            let series = format!("splitway_proxy_protocol_refused_total{{reason=\"{reason}\"}} ");
            assert!(text.contains(&series), "{series}");
        }
    }
}
