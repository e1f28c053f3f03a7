//! Address families of a lab run (issue #32): the family clients and
//! servers use (the ends) and the one relay-to-relay legs use. A scenario
//! or `--family` picks one or more; a mixed run carries IPv4 ends over an
//! IPv6-only long haul, as on an IPv6-only cloud backbone, or the reverse.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::topology::Host;

/// One address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Bytes an IPv6 header has beyond an IPv4 one (40 against 20).
const IPV6_HEADER_EXTRA: u32 = 20;

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// `host`'s address on its link toward the client.
    pub(crate) fn left(self, host: &Host) -> Option<IpAddr> {
        match self {
            Family::V4 => host.left_addr().map(IpAddr::V4),
            Family::V6 => host.left_addr6().map(IpAddr::V6),
        }
    }

    /// `host`'s address on its link toward the server.
    pub(crate) fn right(self, host: &Host) -> Option<IpAddr> {
        match self {
            Family::V4 => host.right_addr().map(IpAddr::V4),
            Family::V6 => host.right_addr6().map(IpAddr::V6),
        }
    }

    /// Every address of the family, for a listener.
    pub(crate) fn any(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        }
    }

    /// One host's prefix: /32 or /128.
    pub(crate) fn host_prefix(self, addr: IpAddr) -> String {
        match self {
            Family::V4 => format!("{addr}/32"),
            Family::V6 => format!("{addr}/128"),
        }
    }

    /// The segment size over this family where IPv4's is `mss_v4`: an
    /// IPv6 header is 20 bytes longer, so a 1500-byte packet carries 1428
    /// bytes of TCP payload against 1448.
    pub(crate) fn mss(self, mss_v4: u32) -> u32 {
        match self {
            Family::V4 => mss_v4,
            Family::V6 => mss_v4.saturating_sub(IPV6_HEADER_EXTRA),
        }
    }
}

/// The families of one chain run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    /// Client and server, and the relays' addresses toward them.
    pub ends: Family,
    /// Relay-to-relay legs (peer addresses, HAProxy's and ssh's hops).
    pub legs: Family,
}

impl Families {
    pub const V4: Families = Families::same(Family::V4);
    pub const V6: Families = Families::same(Family::V6);
    pub const V4_OVER_V6: Families = Families {
        ends: Family::V4,
        legs: Family::V6,
    };
    pub const V6_OVER_V4: Families = Families {
        ends: Family::V6,
        legs: Family::V4,
    };
    /// Every run a scenario may name, by [`Families::name`].
    pub const ALL: [Families; 4] = [
        Families::V4,
        Families::V6,
        Families::V4_OVER_V6,
        Families::V6_OVER_V4,
    ];

    const fn same(family: Family) -> Families {
        Families {
            ends: family,
            legs: family,
        }
    }

    /// `ipv4`, `ipv6`, `ipv4-over-ipv6` or `ipv6-over-ipv4`: the report's
    /// `family` field and a scenario's `families` entries.
    pub fn name(self) -> &'static str {
        match (self.ends, self.legs) {
            (Family::V4, Family::V4) => "ipv4",
            (Family::V6, Family::V6) => "ipv6",
            (Family::V4, Family::V6) => "ipv4-over-ipv6",
            (Family::V6, Family::V4) => "ipv6-over-ipv4",
        }
    }

    pub fn parse(name: &str) -> Option<Families> {
        Families::ALL.into_iter().find(|f| f.name() == name)
    }

    /// How the report names the run beside IPv4's: none for IPv4 itself,
    /// so the IPv4 rows keep the names of runs before issue #32.
    pub fn label(self) -> Option<&'static str> {
        match (self.ends, self.legs) {
            (Family::V4, Family::V4) => None,
            (Family::V6, Family::V6) => Some("IPv6"),
            (Family::V4, Family::V6) => Some("IPv4 over IPv6 legs"),
            (Family::V6, Family::V4) => Some("IPv6 over IPv4 legs"),
        }
    }

    /// What a chain's name gets in the report: ` (LABEL)`, or nothing.
    pub fn chain_suffix(self) -> String {
        self.label().map_or_else(String::new, |l| format!(" ({l})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ipv4_keeps_the_old_chain_names() {
        for f in Families::ALL {
            assert_eq!(Families::parse(f.name()), Some(f));
        }
        assert_eq!(Families::parse("v4"), None);
        assert_eq!(Families::V4.chain_suffix(), "");
        assert_eq!(Families::V4_OVER_V6.name(), "ipv4-over-ipv6");
    }

    #[test]
    fn host_prefixes_and_wildcards_per_family() {
        let v6: IpAddr = "fd77:2::2".parse().unwrap();
        let v4: IpAddr = "10.77.2.2".parse().unwrap();
        assert_eq!(Family::V6.host_prefix(v6), "fd77:2::2/128");
        assert_eq!(Family::V4.host_prefix(v4), "10.77.2.2/32");
        assert_eq!(
            std::net::SocketAddr::new(Family::V6.any(), 7100).to_string(),
            "[::]:7100"
        );
    }
}
