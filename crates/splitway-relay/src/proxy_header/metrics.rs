//! The room's metrics: `splitway_proxy_protocol_refused_total{reason}`,
//! counted when a listener with `accept_proxy_protocol` refuses a
//! connection for its PROXY header; declared in the relay's registry at
//! bind.

use prometheus_client::registry::Registry;

use splitway_control::label_enum;
use splitway_control::metrics::kit::EnumCounter;

label_enum! {
    label "reason";
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

/// The `proxy_protocol_refused_total` series. `Default` counts into
/// series no registry exports (tests).
#[derive(Clone, Debug, Default)]
pub struct ProxyProtocolMetrics(EnumCounter<ProxyRefusal>);

impl ProxyProtocolMetrics {
    /// Declares the family in `registry` (the relay's, under `splitway_`),
    /// every value at zero.
    pub fn register(registry: &mut Registry) -> Self {
        ProxyProtocolMetrics(EnumCounter::register(
            registry,
            "proxy_protocol_refused",
            "Connections refused by a listener with accept_proxy_protocol, by reason",
        ))
    }

    /// Counts a connection refused for its PROXY header.
    pub fn refused(&self, reason: ProxyRefusal) {
        self.0.inc(reason);
    }
}

#[cfg(test)]
mod tests {
    use splitway_control::Metrics;
    use splitway_control::metrics::kit::missing_lines;

    use super::*;

    /// Name, type and help byte for byte, every value exported at zero,
    /// and a count.
    #[test]
    fn declared_in_the_relays_registry_under_its_name() {
        let mut builder = Metrics::builder();
        let room = ProxyProtocolMetrics::register(builder.registry());
        room.refused(ProxyRefusal::Untrusted);
        assert_eq!(room.0.get(ProxyRefusal::Untrusted), 1);
        let text = builder.build().encode();
        assert_eq!(
            missing_lines::<ProxyRefusal>(
                &text,
                "proxy_protocol_refused",
                "Connections refused by a listener with accept_proxy_protocol, by reason"
            ),
            Vec::<String>::new()
        );
        assert!(
            text.contains("splitway_proxy_protocol_refused_total{reason=\"untrusted\"} 1\n"),
            "{text}"
        );
    }
}
