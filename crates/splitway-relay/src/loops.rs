//! Guards against the relay dialing itself, and against loops through
//! relays (`docs/reliability.md`, "Loops and exhaustion").
//!
//! - A destination that is one of this relay's listening sockets (its port,
//!   on one of this namespace's addresses) is refused in every mode: a
//!   direct connection to the TPROXY port has itself as its "original
//!   destination", and a SOCKS5/CONNECT request may name the relay's own
//!   listener. Dialing it would accept, dial again, and so on.
//! - Across relays, a transparent relay behaves like a router towards the
//!   IP TTL: the next leg leaves with the client SYN's TTL minus one (and
//!   relay legs carry that hop limit in the header), so relays whose routes
//!   point at each other see the TTL run out, as routers would.

use std::net::SocketAddr;

use crate::policy::Denial;

/// The ports this relay listens on (listeners and admin API).
#[derive(Debug, Clone, Default)]
pub struct OwnListeners {
    ports: Box<[u16]>,
}

impl OwnListeners {
    pub fn new(ports: impl IntoIterator<Item = u16>) -> OwnListeners {
        let mut ports: Vec<u16> = ports.into_iter().filter(|p| *p != 0).collect();
        ports.sort_unstable();
        ports.dedup();
        OwnListeners {
            ports: ports.into(),
        }
    }

    /// Refuses `dst` if it reaches one of this relay's own listeners. Only a
    /// destination on one of our ports costs a look at the interface
    /// addresses (read afresh: addresses come and go at run time).
    pub fn check(&self, dst: SocketAddr) -> Result<(), Denial> {
        if !self.ports.contains(&dst.port()) {
            return Ok(());
        }
        let ip = dst.ip().to_canonical();
        let local = ip.is_unspecified()
            || ip.is_loopback()
            // Unknown is treated as ours: refusing one odd destination is
            // better than a loop that takes every descriptor.
            || splitway_sys::hops::local_addrs()
                .map_or(true, |addrs| addrs.iter().any(|a| a.to_canonical() == ip));
        if local {
            Err(Denial::SelfDial(dst))
        } else {
            Ok(())
        }
    }

    pub fn ports(&self) -> &[u16] {
        &self.ports
    }
}

/// The hop limit this relay's next leg leaves with, given the one the
/// connection arrived with (the client SYN's TTL, or the header's
/// [`splitway_proto::header::EXT_HOP_LIMIT`]). Like a router: one less, and
/// nothing is forwarded with none left.
pub fn next_hop_limit(arrived: u8) -> Result<u8, Denial> {
    match arrived.checked_sub(1) {
        Some(h) if h > 0 => Ok(h),
        _ => Err(Denial::HopLimit(arrived)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ports_on_local_addresses_are_refused() {
        let own = OwnListeners::new([7000, 1080, 0, 7000]);
        assert_eq!(own.ports(), &[1080, 7000]);
        for dst in [
            "127.0.0.1:7000",
            "127.3.4.5:1080",
            "0.0.0.0:7000",
            "[::1]:7000",
            "[::]:1080",
            "[::ffff:127.0.0.1]:7000",
        ] {
            let dst: SocketAddr = dst.parse().unwrap();
            assert_eq!(own.check(dst), Err(Denial::SelfDial(dst)), "{dst}");
        }
        // Another port on a local address is a local service, not a loop.
        assert_eq!(own.check("127.0.0.1:80".parse().unwrap()), Ok(()));
        // Our port on an address no interface here has is someone else's.
        assert_eq!(own.check("192.0.2.1:7000".parse().unwrap()), Ok(()));
    }

    #[test]
    fn hop_limit_counts_down_like_a_router() {
        assert_eq!(next_hop_limit(64), Ok(63));
        assert_eq!(next_hop_limit(2), Ok(1));
        assert_eq!(next_hop_limit(1), Err(Denial::HopLimit(1)));
        assert_eq!(next_hop_limit(0), Err(Denial::HopLimit(0)));
    }
}
