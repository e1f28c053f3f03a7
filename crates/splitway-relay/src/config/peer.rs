//! `[[peer]]`: the next relays this one dials, their legs' tuning, pools
//! and TLS.

use std::collections::HashSet;

use super::check::{Checker, valid_name};
use super::raw::{RawPeer, RawPool};
use super::tls::TlsSection;
use super::tuning::tuning;
use super::types::{Peer, PoolSize};
use crate::tls::{self, PeerTls};

/// The peers with a usable address, and every name defined (an element
/// with its own error still defines its name, for the routes' checks).
pub(super) fn peers(
    c: &mut Checker,
    table: &toml::Table,
    tls: &TlsSection,
) -> (Vec<Peer>, HashSet<String>) {
    let mut peers: Vec<Peer> = Vec::new();
    let mut names = HashSet::new();
    for (key, raw) in c.elements::<RawPeer>(table, "peer") {
        let Some(raw) = raw else { continue };
        if !valid_name(&raw.name) {
            c.err(
                format!("{key}.name"),
                format!("`{}` must be 1-32 of [a-z0-9_-]", raw.name),
            );
        } else if raw.name == "direct" {
            c.err(format!("{key}.name"), "`direct` is reserved for routes");
        } else if !names.insert(raw.name.clone()) {
            c.err(
                format!("{key}.name"),
                format!("peer `{}` is defined twice", raw.name),
            );
        }
        let addr = c.socket_addr(&format!("{key}.addr"), &raw.addr);
        let tuning = tuning(c, &key, raw.tuning());
        let pool = raw
            .pool
            .as_ref()
            .map(|p| pool(c, &key, p))
            .unwrap_or_default();
        let peer_tls = peer_tls(c, &key, &raw, tls);
        if let Some(addr) = addr {
            peers.push(Peer {
                name: raw.name,
                addr,
                tuning,
                pool,
                tls: peer_tls,
            });
        }
    }
    (peers, names)
}

fn pool(c: &mut Checker, key: &str, p: &RawPool) -> PoolSize {
    let mut pool = PoolSize::default();
    pool.low = p.low.unwrap_or(pool.low);
    pool.high = p.high.unwrap_or(pool.high.max(pool.low));
    if pool.high > 4096 {
        c.err(
            format!("{key}.pool.high"),
            "at most 4096 pooled connections per peer",
        );
    }
    if pool.low > pool.high {
        c.err(
            format!("{key}.pool.low"),
            format!("low ({}) is above high ({})", pool.low, pool.high),
        );
    }
    if let Some(t) = &p.idle
        && let Some(d) = c.duration(&format!("{key}.pool.idle"), t)
    {
        pool.idle = d;
    }
    pool
}

/// `tls` and `server_name` (default: the peer's name).
fn peer_tls(c: &mut Checker, key: &str, raw: &RawPeer, tls: &TlsSection) -> Option<PeerTls> {
    let want_tls = raw.tls == Some(true);
    if want_tls {
        tls.require(c, key);
    } else if raw.server_name.is_some() {
        c.err(format!("{key}.server_name"), "only used with tls = true");
    }
    let name_text = raw.server_name.as_deref().unwrap_or(&raw.name);
    let server_name = tls::server_name(name_text);
    if want_tls && server_name.is_none() {
        c.err(
            format!("{key}.server_name"),
            format!("`{name_text}` is not a DNS name or IP address"),
        );
    }
    match (&tls.context, server_name) {
        (Some(t), Some(server_name)) if want_tls => Some(PeerTls {
            server_name,
            config: t.client.clone(),
        }),
        _ => None,
    }
}
