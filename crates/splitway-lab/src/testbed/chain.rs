//! A chain of network namespaces, client — relay… — server, joined by veth
//! pairs, with one addressing plan: IPv4 /24 and IPv6 /64 per link, the
//! west end of each link `.1`/`::1`, the east end `.2`/`::2`.

use splitway_sys::SysError;
use splitway_sys::netns::{self, Netns};

/// Interface of every node towards the client side.
pub const WEST_IF: &str = "west";
/// Interface of every node towards the server side.
pub const EAST_IF: &str = "east";

/// A step of wiring a chain that failed, and in which namespace.
#[derive(Debug, thiserror::Error)]
#[error("testbed chain: {op} in {ns}: {source}")]
pub struct ChainError {
    pub op: String,
    pub ns: String,
    #[source]
    pub source: SysError,
}

/// The subnet tag of link `k` in a chain of `relays` relays. Link 0 is
/// client—first relay (`1`), link `relays` is last relay—server (`3`),
/// link `k` between relays `k` and `k+1` is `{k}{k+1}`.
fn link_tag(k: usize, relays: usize) -> String {
    if k == 0 {
        "1".into()
    } else if k == relays {
        "3".into()
    } else {
        format!("{}{}", k, k + 1)
    }
}

pub fn link_v4(k: usize, relays: usize, host: u8) -> String {
    format!("10.0.{}.{host}", link_tag(k, relays))
}

pub fn link_v6(k: usize, relays: usize, host: u8) -> String {
    format!("fd00:{}::{host}", link_tag(k, relays))
}

/// Wires `nodes` (client, relays…, server) into a chain: veth pairs and
/// addresses on every link, default routes on the client and server, and
/// on each relay forwarding on, rp_filter off and routes to the far ends'
/// subnets (`10.0.1.0/24`, `10.0.3.0/24` and their IPv6 twins).
pub fn wire(nodes: &[&Netns]) -> Result<(), ChainError> {
    assert!(
        nodes.len() >= 3,
        "a chain has a client, relays and a server"
    );
    let n = nodes.len() - 2;
    let run = |ns: &Netns, args: &[&str]| {
        ns.ip(args).map(drop).map_err(|source| ChainError {
            op: format!("ip {}", args.join(" ")),
            ns: ns.name().to_owned(),
            source,
        })
    };
    for k in 0..=n {
        let (west, east) = (nodes[k], nodes[k + 1]);
        netns::veth(west, EAST_IF, east, WEST_IF).map_err(|source| ChainError {
            op: format!("veth to {}", east.name()),
            ns: west.name().to_owned(),
            source,
        })?;
        for (ns, ifname, host) in [(west, EAST_IF, 1u8), (east, WEST_IF, 2u8)] {
            let v4 = format!("{}/24", link_v4(k, n, host));
            let v6 = format!("{}/64", link_v6(k, n, host));
            run(ns, &["addr", "add", &v4, "dev", ifname])?;
            run(ns, &["-6", "addr", "add", &v6, "dev", ifname, "nodad"])?;
        }
    }
    let (client, server) = (nodes[0], nodes[n + 1]);
    run(
        client,
        &["route", "add", "default", "via", &link_v4(0, n, 2)],
    )?;
    run(
        client,
        &["-6", "route", "add", "default", "via", &link_v6(0, n, 2)],
    )?;
    run(
        server,
        &["route", "add", "default", "via", &link_v4(n, n, 1)],
    )?;
    run(
        server,
        &["-6", "route", "add", "default", "via", &link_v6(n, n, 1)],
    )?;
    for r in 0..n {
        // Relay r sits between link r (west) and link r+1 (east).
        let ns = nodes[r + 1];
        for (key, value) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.west.rp_filter", "0"),
            ("net.ipv4.conf.east.rp_filter", "0"),
        ] {
            ns.sysctl(key, value).map_err(|source| ChainError {
                op: format!("sysctl {key}={value}"),
                ns: ns.name().to_owned(),
                source,
            })?;
        }
        // Towards the far ends: the server's subnets east, the client's west.
        let far = [
            (r + 1 < n, "10.0.3.0/24", "fd00:3::/64", r + 1, 2),
            (r > 0, "10.0.1.0/24", "fd00:1::/64", r, 1),
        ];
        for (_, v4, v6, link, host) in far.into_iter().filter(|f| f.0) {
            run(ns, &["route", "add", v4, "via", &link_v4(link, n, host)])?;
            run(
                ns,
                &["-6", "route", "add", v6, "via", &link_v6(link, n, host)],
            )?;
        }
    }
    Ok(())
}
