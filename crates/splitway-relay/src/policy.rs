//! Destination access control (`[policy]`): which addresses and ports the
//! relay connects to on its clients' behalf.
//!
//! Checked in [`crate::session::connect_next`], where every leg is dialed:
//! the port before a domain is resolved (no lookup for a forbidden port),
//! the address after (the one actually dialed). So the first relay refuses
//! before any relay leg is used, and a downstream relay applies its own
//! policy to the headers it receives.
//!
//! Order: port, `deny_destinations` (wins over allow), host-local guard,
//! `allow_destinations`.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use splitway_control::metrics::DenyReason;

/// A validated `[policy]` section. The default allows every destination
/// except host-local ones asked for by clients on other hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Destination prefixes allowed; empty = any.
    pub allow_destinations: Vec<IpNet>,
    /// Destination prefixes refused even when allowed above.
    pub deny_destinations: Vec<IpNet>,
    /// Destination ports allowed; empty = any.
    pub allow_ports: Vec<RangeInclusive<u16>>,
    /// Let clients from other hosts reach this host's loopback and
    /// unspecified addresses. Off by default: through an explicit proxy
    /// opened with `allow_clients`, or a peer listener, a remote party
    /// would otherwise reach services bound to loopback only, the relay's
    /// own admin API first (`POST /drain`, `PUT /params`). A loopback
    /// client can reach them without the relay, so it is never refused.
    pub allow_local_destinations: bool,
}

/// Why a destination was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error("port {0} is not in policy.allow_ports")]
    Port(u16),
    #[error("{0} is not in policy.allow_destinations")]
    NotAllowed(IpAddr),
    #[error("{0} is in policy.deny_destinations")]
    Denied(IpAddr),
    #[error(
        "{0} is a host-local address, refused to a client from another host (policy.allow_local_destinations)"
    )]
    Local(IpAddr),
    #[error("{0} is one of this relay's own listeners: refused, the relay would dial itself")]
    SelfDial(SocketAddr),
    #[error(
        "IP hop limit exhausted (arrived with {0}): a routing loop through relays, or a client sending with a TTL of 1"
    )]
    HopLimit(u8),
}

impl Denial {
    /// The bounded metrics label.
    pub fn reason(self) -> DenyReason {
        match self {
            Denial::Port(_) => DenyReason::Port,
            Denial::NotAllowed(_) | Denial::Denied(_) => DenyReason::Destination,
            Denial::Local(_) => DenyReason::Local,
            Denial::SelfDial(_) => DenyReason::SelfDial,
            Denial::HopLimit(_) => DenyReason::Loop,
        }
    }
}

/// Loopback, and the unspecified addresses (Linux connects `0.0.0.0` and
/// `::` to the local host). `0.0.0.0/8` is "this network": not routable.
pub fn is_host_local(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(a) => a.is_loopback() || a.octets()[0] == 0,
        IpAddr::V6(a) => a.is_loopback() || a.is_unspecified(),
    }
}

impl Policy {
    /// Whether `port` may be dialed. Checked before a domain is resolved.
    pub fn check_port(&self, port: u16) -> Result<(), Denial> {
        if self.allow_ports.is_empty() || self.allow_ports.iter().any(|r| r.contains(&port)) {
            Ok(())
        } else {
            Err(Denial::Port(port))
        }
    }

    /// Whether `client` (the immediate peer: an end client, or the
    /// upstream relay on a peer listener) may have `dst` dialed for it.
    pub fn check_addr(&self, client: IpAddr, dst: IpAddr) -> Result<(), Denial> {
        let dst = dst.to_canonical();
        if self.deny_destinations.iter().any(|n| n.contains(&dst)) {
            return Err(Denial::Denied(dst));
        }
        if !self.allow_local_destinations
            && is_host_local(dst)
            && !client.to_canonical().is_loopback()
        {
            return Err(Denial::Local(dst));
        }
        if !self.allow_destinations.is_empty()
            && !self.allow_destinations.iter().any(|n| n.contains(&dst))
        {
            return Err(Denial::NotAllowed(dst));
        }
        Ok(())
    }

    /// Port and address together, for an already resolved destination.
    pub fn check(&self, client: IpAddr, dst: SocketAddr) -> Result<(), Denial> {
        self.check_port(dst.port())?;
        self.check_addr(client, dst.ip())
    }
}

/// Lets one denial log line per second through at `info`; the others go to
/// `debug` and are counted, so a scan cannot flood the log while the
/// operator still sees that denials happen (and how many).
pub struct LogThrottle {
    last_second: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    pub const fn new() -> LogThrottle {
        LogThrottle {
            last_second: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)`: log this one at info, `n` were suppressed since the last
    /// such line. `None`: log at debug.
    pub fn admit(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.admit_at(now)
    }

    fn admit_at(&self, now: u64) -> Option<u64> {
        let last = self.last_second.load(Ordering::Relaxed);
        if now != last
            && self
                .last_second
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new()
    }
}

/// The throttle shared by every denial log line of the process.
pub static DENIALS: LogThrottle = LogThrottle::new();

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    const REMOTE: &str = "192.0.2.50";

    #[test]
    fn default_allows_everything_but_local_to_remote_clients() {
        let p = Policy::default();
        assert_eq!(
            p.check(ip(REMOTE), "203.0.113.9:443".parse().unwrap()),
            Ok(())
        );
        for local in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "::1",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(
                p.check_addr(ip(REMOTE), ip(local)).map_err(Denial::reason),
                Err(DenyReason::Local),
                "{local}"
            );
            // A loopback client could reach it without us.
            assert_eq!(p.check_addr(ip("127.0.0.1"), ip(local)), Ok(()), "{local}");
            assert_eq!(p.check_addr(ip("::ffff:127.0.0.1"), ip(local)), Ok(()));
        }
        let open = Policy {
            allow_local_destinations: true,
            ..Policy::default()
        };
        assert_eq!(open.check_addr(ip(REMOTE), ip("127.0.0.1")), Ok(()));
    }

    #[test]
    fn deny_wins_over_allow_and_allow_restricts() {
        let p = Policy {
            allow_destinations: nets(&["10.0.0.0/8", "192.0.2.7/32", "::1/128"]),
            deny_destinations: nets(&["10.9.0.0/16"]),
            ..Policy::default()
        };
        assert_eq!(p.check_addr(ip(REMOTE), ip("10.1.2.3")), Ok(()));
        assert_eq!(p.check_addr(ip(REMOTE), ip("::ffff:10.1.2.3")), Ok(()));
        assert_eq!(p.check_addr(ip(REMOTE), ip("192.0.2.7")), Ok(()));
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("10.9.0.1")),
            Err(Denial::Denied(ip("10.9.0.1")))
        );
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("192.0.2.8")),
            Err(Denial::NotAllowed(ip("192.0.2.8")))
        );
        // Listed, but still host-local for a remote client.
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("::1")),
            Err(Denial::Local(ip("::1")))
        );
        assert_eq!(p.check_addr(ip("::1"), ip("::1")), Ok(()));
    }

    #[test]
    fn ports_and_ranges() {
        let p = Policy {
            allow_ports: vec![80..=80, 443..=443, 8000..=8100],
            ..Policy::default()
        };
        for ok in [80, 443, 8000, 8050, 8100] {
            assert_eq!(p.check_port(ok), Ok(()), "{ok}");
        }
        for bad in [1, 79, 81, 7999, 8101, 65535] {
            assert_eq!(p.check_port(bad), Err(Denial::Port(bad)), "{bad}");
        }
        assert_eq!(
            p.check(ip(REMOTE), "203.0.113.1:22".parse().unwrap()),
            Err(Denial::Port(22))
        );
    }

    #[test]
    fn throttle_admits_one_per_second_and_counts_the_rest() {
        let t = LogThrottle::new();
        assert_eq!(t.admit_at(100), Some(0));
        assert_eq!(t.admit_at(100), None);
        assert_eq!(t.admit_at(100), None);
        assert_eq!(t.admit_at(101), Some(2));
        assert_eq!(t.admit_at(101), None);
        assert_eq!(t.admit_at(105), Some(1));
    }
}
