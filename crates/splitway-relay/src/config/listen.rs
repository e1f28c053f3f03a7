//! `[[listen]]`: each listener's own keys, then dual-stack resolution
//! across them.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

use ipnet::IpNet;

use super::check::Checker;
use super::raw::RawListener;
use super::tls::TlsSection;
use super::types::{Intercept, ListenMode, Listener, MAX_ACCEPT_SOCKETS};

pub(super) fn listeners(c: &mut Checker, table: &toml::Table, tls: &TlsSection) -> Vec<Listener> {
    let mut listeners = Vec::new();
    let mut seen_addrs = HashSet::new();
    let raw_listeners = c.elements::<RawListener>(table, "listen");
    if raw_listeners.is_empty() && !c.has_issue("listen") {
        c.err(
            "listen",
            "no [[listen]] section: the relay would accept nothing",
        );
    }
    for (key, raw) in raw_listeners {
        let Some(raw) = raw else { continue };
        let addr = c.socket_addr(&format!("{key}.addr"), &raw.addr);
        if let Some(a) = addr
            && !seen_addrs.insert(a)
        {
            c.err(
                format!("{key}.addr"),
                format!("{a} is already used by another listener"),
            );
        }
        listeners.extend(listener(c, &key, raw, addr, tls));
    }
    // A `[::]` listener is dual stack unless a `0.0.0.0` one has its port.
    let v4_any_ports: HashSet<u16> = listeners
        .iter()
        .filter(|l| l.addr.is_ipv4() && l.addr.ip().is_unspecified())
        .map(|l| l.addr.port())
        .collect();
    for l in &mut listeners {
        l.v6_only = match l.addr {
            SocketAddr::V6(a) => !a.ip().is_unspecified() || v4_any_ports.contains(&a.port()),
            SocketAddr::V4(_) => false,
        };
    }
    listeners
}

/// One listener's keys but its address (`addr`, checked by the caller);
/// `None` without a usable address, every other key checked all the same.
fn listener(
    c: &mut Checker,
    key: &str,
    raw: RawListener,
    addr: Option<SocketAddr>,
    tls: &TlsSection,
) -> Option<Listener> {
    if let Some(i) = &raw.intercept {
        intercept(c, key, raw.mode, i);
    }
    let mut allow = Vec::new();
    for (j, p) in raw.allow_clients.iter().enumerate() {
        match p.parse::<IpNet>() {
            Ok(n) => allow.push(n.trunc()),
            Err(_) => c.err(
                format!("{key}.allow_clients[{j}]"),
                format!("`{p}` is not a prefix (e.g. 10.0.0.0/8)"),
            ),
        }
    }
    let syn_option_prefixes = syn_option_prefixes(c, key, &raw);
    syn_option_watch(c, key, &raw);
    let want_tls = raw.tls == Some(true);
    if want_tls {
        if !raw.mode.accepts_relays() {
            c.err(
                format!("{key}.tls"),
                "only a mode = \"peer\" listener can use TLS",
            );
        }
        tls.require(c, key);
    }
    let reuse_port = raw.reuse_port == Some(true);
    if reuse_port && raw.intercept.is_some() {
        // Each process would install and, on exit, remove the same
        // interception rules under the others' feet.
        c.err(
            format!("{key}.reuse_port"),
            "cannot be combined with intercept: install the TPROXY rules by hand when several processes share a port",
        );
    }
    if let Some(n) = raw.accept_sockets
        && !(1..=MAX_ACCEPT_SOCKETS).contains(&n)
    {
        c.err(
            format!("{key}.accept_sockets"),
            format!("must be 1 to {MAX_ACCEPT_SOCKETS} (absent: one per worker thread)"),
        );
    }
    let users = raw.auth_file.as_deref().and_then(|f| {
        let key = format!("{key}.auth_file");
        if !raw.mode.is_explicit_proxy() {
            c.err(
                &key,
                "only a mode = \"socks5\" or \"http-connect\" listener asks its clients for credentials",
            );
            return None;
        }
        let path = super::keys::absolute(c.base, f);
        users_file(c, &key, &path).map(std::sync::Arc::new)
    });
    let accept_proxy_protocol = c.prefixes(
        &format!("{key}.accept_proxy_protocol"),
        &raw.accept_proxy_protocol,
    );
    addr.map(|addr| Listener {
        mode: raw.mode,
        addr,
        v6_only: false,
        intercept: raw.intercept,
        allow_clients: allow,
        tls: tls
            .context
            .as_ref()
            .filter(|_| want_tls)
            .map(|t| t.server.clone()),
        reuse_port,
        accept_sockets: raw.accept_sockets,
        accept_proxy_protocol,
        syn_option_prefixes,
        watch: raw.watch,
        users,
    })
}

fn intercept(c: &mut Checker, key: &str, mode: ListenMode, i: &Intercept) {
    if !mode.intercepts() {
        c.err(
            format!("{key}.intercept"),
            "only a mode = \"tproxy\" listener can intercept",
        );
    }
    if i.interfaces.is_empty() {
        c.err(
            format!("{key}.intercept.interfaces"),
            "needs at least one interface",
        );
    }
    for (j, iface) in i.interfaces.iter().enumerate() {
        c.interface(format!("{key}.intercept.interfaces[{j}]"), iface);
    }
    if i.ports.is_empty() {
        c.err(format!("{key}.intercept.ports"), "needs at least one port");
    }
    if i.ports.contains(&0) {
        c.err(
            format!("{key}.intercept.ports"),
            "port 0 cannot be intercepted",
        );
    }
}

/// Validates a listener's syn-option keys: the option is unauthenticated,
/// so `allow_clients` is required; `syn_option_prefixes` are `INDEX=PREFIX`
/// (IPv6, /32 to /127, index 0..=127, each index once).
fn syn_option_prefixes(c: &mut Checker, key: &str, raw: &RawListener) -> Vec<(u8, IpNet)> {
    let mut out: Vec<(u8, IpNet)> = Vec::new();
    if !raw.mode.syn_carries_dst() {
        if !raw.syn_option_prefixes.is_empty() {
            c.err(
                format!("{key}.syn_option_prefixes"),
                "only a mode = \"syn-option\" listener reads the SYN's option",
            );
        }
        return out;
    }
    if raw.allow_clients.is_empty() {
        c.err(
            format!("{key}.allow_clients"),
            "required for mode = \"syn-option\": the destination option is unauthenticated, so the listener must name its clients",
        );
    }
    for (j, entry) in raw.syn_option_prefixes.iter().enumerate() {
        let k = format!("{key}.syn_option_prefixes[{j}]");
        let parsed = entry.split_once('=').and_then(|(i, p)| {
            Some((
                i.trim().parse::<u8>().ok()?,
                p.trim().parse::<IpNet>().ok()?,
            ))
        });
        match parsed {
            Some((index, IpNet::V6(net)))
                if index <= 127 && (32..=127).contains(&net.prefix_len()) =>
            {
                if out.iter().any(|(i, _)| *i == index) {
                    c.err(k, format!("index {index} is used twice"));
                } else {
                    out.push((index, IpNet::V6(net.trunc())));
                }
            }
            _ => c.err(
                k,
                format!("`{entry}`: expected INDEX=IPV6/LEN with INDEX 0..=127 and LEN 32..=127"),
            ),
        }
    }
    out
}

/// Validates `watch`: interface names on a syn-option listener whose SYNs
/// name their real client (no PROXY header: early SYN dials at the SYN).
fn syn_option_watch(c: &mut Checker, key: &str, raw: &RawListener) {
    if raw.watch.is_empty() {
        return;
    }
    if !raw.mode.syn_carries_dst() {
        c.err(
            format!("{key}.watch"),
            "only a mode = \"syn-option\" listener has its SYNs watched (a tproxy listener's are watched on intercept.interfaces)",
        );
    }
    if !raw.accept_proxy_protocol.is_empty() {
        c.err(
            format!("{key}.watch"),
            "cannot be combined with accept_proxy_protocol (early SYN dials at the SYN, before the header names the client)",
        );
    }
    for (j, iface) in raw.watch.iter().enumerate() {
        if c.interface(format!("{key}.watch[{j}]"), iface) && raw.watch[..j].contains(iface) {
            c.err(
                format!("{key}.watch[{j}]"),
                format!("`{iface}` is listed twice"),
            );
        }
    }
}

/// Reads `{key}` (a listener's `auth_file`), recording every problem.
fn users_file(c: &mut Checker, key: &str, path: &Path) -> Option<super::users::ProxyUsers> {
    let text = c
        .source
        .read(path, super::users::MAX_USERS_FILE, "a user list")
        .and_then(|bytes| {
            String::from_utf8(bytes)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
        });
    match text {
        Ok(text) => match super::users::ProxyUsers::parse(path.to_path_buf(), &text) {
            Ok(users) => Some(users),
            Err(errors) => {
                for e in errors {
                    c.err(key, format!("{}: {e}", path.display()));
                }
                None
            }
        },
        Err(e) => {
            c.err(key, format!("cannot read {}: {e}", path.display()));
            None
        }
    }
}
