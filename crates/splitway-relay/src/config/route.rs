//! `[[route]]`: destination prefixes, their candidate hops, and what a
//! direct route reveals to the server.

use std::collections::HashSet;

use super::check::Checker;
use super::raw::RawRoute;
use super::types::{Listener, MAX_CANDIDATES, Peer, Reveal, Route, Via};

/// `peer_names`: every name `[[peer]]` defines, usable or not;
/// `listeners`: whose clients the routes carry.
pub(super) fn routes(
    c: &mut Checker,
    table: &toml::Table,
    peers: &[Peer],
    peer_names: &HashSet<String>,
    listeners: &[Listener],
) -> Vec<Route> {
    let mut routes = Vec::new();
    let mut seen_dst = HashSet::new();
    for (key, raw) in c.elements::<RawRoute>(table, "route") {
        let Some(raw) = raw else { continue };
        let dst = c
            .prefix(&format!("{key}.dst"), &raw.dst, "10.0.3.0/24 or ::/0")
            .filter(|n| {
                let fresh = seen_dst.insert(*n);
                if !fresh {
                    c.err(format!("{key}.dst"), format!("{n} is routed twice"));
                }
                fresh
            });
        let (candidates, resolved_all) = candidates(c, &key, &raw, peers, peer_names);
        let peers_only = !raw.via.names().contains(&"direct");
        let reveal = reveal(c, &key, &raw, peers_only);
        if let Some(dst) = dst.filter(|_| reveal.client_source) {
            client_source_family(c, &key, dst, listeners);
        }
        if let (Some(dst), true, Some(via)) = (dst, resolved_all, candidates.first().cloned()) {
            routes.push(Route {
                dst,
                via,
                candidates,
                reveal,
            });
        }
    }
    routes
}

/// The client families `listeners` accept: (IPv4, IPv6). A peer listener
/// carries clients of either family (the upstream relay names the origin),
/// and so does one that takes PROXY headers (the balancer names it); a
/// dual-stack `[::]` listener accepts both.
pub(super) fn client_families(listeners: &[Listener]) -> (bool, bool) {
    listeners.iter().fold((false, false), |(v4, v6), l| {
        let (l4, l6) = match l.addr.ip() {
            _ if l.mode.accepts_relays() => (true, true),
            _ if !l.accept_proxy_protocol.is_empty() => (true, true),
            std::net::IpAddr::V4(_) => (true, false),
            std::net::IpAddr::V6(ip) => (ip.is_unspecified() && !l.v6_only, true),
        };
        (v4 || l4, v6 || l6)
    })
}

/// `source = "client"` on a route no client of its family can reach: a
/// socket cannot leave from an address of the other family, so every
/// connection on it would be refused.
fn client_source_family(c: &mut Checker, key: &str, dst: ipnet::IpNet, listeners: &[Listener]) {
    let (v4, v6) = client_families(listeners);
    let (family, reachable) = match dst {
        ipnet::IpNet::V4(_) => ("IPv4", v4),
        ipnet::IpNet::V6(_) => ("IPv6", v6),
    };
    if !reachable && !listeners.is_empty() {
        let other = if family == "IPv4" { "IPv6" } else { "IPv4" };
        c.err(
            format!("{key}.source"),
            format!(
                "\"client\" on an {family} route ({dst}), but every listener takes {other} clients only: a leg cannot leave from a client address of the other family (use source = \"relay\" with proxy_protocol, or listen on {family})"
            ),
        );
    }
}

/// The route's hops in order, and whether every name resolved.
fn candidates(
    c: &mut Checker,
    key: &str,
    raw: &RawRoute,
    peers: &[Peer],
    peer_names: &HashSet<String>,
) -> (Vec<Via>, bool) {
    let names = raw.via.names();
    if names.is_empty() {
        c.err(format!("{key}.via"), "lists no candidate");
    } else if names.len() > MAX_CANDIDATES {
        c.err(
            format!("{key}.via"),
            format!("at most {MAX_CANDIDATES} candidates"),
        );
    }
    let mut candidates = Vec::new();
    let mut resolved_all = true;
    for (j, name) in names.iter().enumerate() {
        if names[..j].contains(name) {
            c.err(format!("{key}.via"), format!("`{name}` is listed twice"));
            resolved_all = false;
        } else if *name == "direct" {
            candidates.push(Via::Direct);
        } else if let Some(i) = peers.iter().position(|p| p.name == *name) {
            candidates.push(Via::Peer(i));
        } else if peer_names.contains(*name) {
            resolved_all = false; // the peer exists but had its own error
        } else {
            c.err(
                format!("{key}.via"),
                format!("`{name}` is neither \"direct\" nor a [[peer]] name"),
            );
            resolved_all = false;
        }
    }
    (candidates, resolved_all)
}

/// A route's `proxy_protocol` and `source`: only a direct route talks
/// to the server; a peer route's last relay decides for itself.
/// `peers_only`: the route has no `direct` candidate (an unresolved one
/// does not count, it has its own error).
fn reveal(c: &mut Checker, key: &str, raw: &RawRoute, peers_only: bool) -> Reveal {
    use splitway_proto::proxy_protocol::Version;
    let direct_only = |c: &mut Checker, name: &str| {
        if peers_only {
            c.err(
                format!("{key}.{name}"),
                format!(
                    "only on a route with a \"direct\" candidate (set it on the last relay's route; `{}` lists peers only)",
                    raw.via.names().join(", ")
                ),
            );
        }
    };
    let proxy_protocol = raw.proxy_protocol.as_deref().and_then(|v| {
        direct_only(c, "proxy_protocol");
        match v {
            "v1" => Some(Version::V1),
            "v2" => Some(Version::V2),
            other => {
                c.err(
                    format!("{key}.proxy_protocol"),
                    format!("`{other}` is not \"v1\" or \"v2\""),
                );
                None
            }
        }
    });
    let client_source = match raw.source.as_deref() {
        None | Some("relay") => false,
        Some("client") => {
            direct_only(c, "source");
            true
        }
        Some(other) => {
            c.err(
                format!("{key}.source"),
                format!("`{other}` is not \"relay\" or \"client\""),
            );
            false
        }
    };
    Reveal {
        proxy_protocol,
        client_source,
    }
}
