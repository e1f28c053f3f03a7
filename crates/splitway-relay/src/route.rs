//! The routing table: destination prefix → next relay or direct.
//!
//! Longest prefix wins. Routes are kept sorted by prefix length (longest
//! first) so the first match is the answer; relay tables hold a handful to a
//! few hundred routes, where a linear scan beats a trie's pointer chasing.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::{Route, Via};

#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    pub fn new(routes: &[Route]) -> Self {
        let mut routes = routes.to_vec();
        routes.sort_by_key(|r| std::cmp::Reverse(r.dst.prefix_len()));
        RouteTable { routes }
    }

    /// The hop for `dst`, or `None` when no route matches. IPv4-mapped IPv6
    /// addresses (from dual-stack listeners) are matched as IPv4.
    pub fn lookup(&self, dst: IpAddr) -> Option<&Via> {
        let dst = dst.to_canonical();
        self.routes
            .iter()
            .find(|r| r.dst.contains(&dst))
            .map(|r| &r.via)
    }

    /// The whole route for `dst` (its hop and options), like [`Self::lookup`].
    pub fn lookup_route(&self, dst: IpAddr) -> Option<&Route> {
        let dst = dst.to_canonical();
        self.routes.iter().find(|r| r.dst.contains(&dst))
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
}

/// Whether `addr` is inside any of `nets`; an empty list allows everything,
/// or only loopback when `empty_means_loopback` (explicit proxies).
pub fn allowed(nets: &[IpNet], addr: IpAddr, empty_means_loopback: bool) -> bool {
    let addr = addr.to_canonical();
    if nets.is_empty() {
        return !empty_means_loopback || addr.is_loopback();
    }
    nets.iter().any(|n| n.contains(&addr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn route(dst: &str, via: Via) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            candidates: vec![via.clone()],
            via,
            reveal: Default::default(),
        }
    }

    #[test]
    fn longest_prefix_wins_regardless_of_order() {
        let t = RouteTable::new(&[
            route("0.0.0.0/0", Via::Direct),
            route("10.0.0.0/8", Via::Peer(0)),
            route("10.0.3.0/24", Via::Peer(1)),
            route("::/0", Via::Peer(2)),
        ]);
        assert_eq!(t.lookup("10.0.3.7".parse().unwrap()), Some(&Via::Peer(1)));
        assert_eq!(t.lookup("10.9.9.9".parse().unwrap()), Some(&Via::Peer(0)));
        assert_eq!(t.lookup("192.0.2.1".parse().unwrap()), Some(&Via::Direct));
        assert_eq!(
            t.lookup("2001:db8::1".parse().unwrap()),
            Some(&Via::Peer(2))
        );
        assert_eq!(
            t.lookup("::ffff:10.0.3.7".parse().unwrap()),
            Some(&Via::Peer(1))
        );
    }

    #[test]
    fn no_match_is_none() {
        let t = RouteTable::new(&[route("10.0.3.0/24", Via::Direct)]);
        assert_eq!(t.lookup("10.0.4.1".parse().unwrap()), None);
        assert_eq!(t.lookup("fd00::1".parse().unwrap()), None);
    }

    proptest! {
        // The table agrees with a brute-force "longest containing prefix".
        #[test]
        fn matches_brute_force(prefixes in proptest::collection::vec((any::<u32>(), 0u8..=32), 1..20), probe in any::<u32>()) {
            let routes: Vec<Route> = prefixes.iter().enumerate().map(|(i, (a, l))| Route {
                dst: IpNet::new(IpAddr::V4((*a).into()), *l).unwrap().trunc(),
                via: Via::Peer(i),
                candidates: vec![Via::Peer(i)],
                reveal: Default::default(),
            }).collect();
            // Duplicated prefixes are refused by config validation; keep the first.
            let mut uniq: Vec<Route> = Vec::new();
            for r in routes { if !uniq.iter().any(|u| u.dst == r.dst) { uniq.push(r); } }
            let t = RouteTable::new(&uniq);
            let ip = IpAddr::V4(probe.into());
            let best = uniq.iter().filter(|r| r.dst.contains(&ip)).max_by_key(|r| r.dst.prefix_len());
            prop_assert_eq!(t.lookup(ip), best.map(|r| &r.via));
        }
    }
}
