//! `[accel]`: each switch resolved against what the rest of the file
//! allows, and the checks that tie it to listeners, peers and timeouts.

use std::time::Duration;

use super::check::Checker;
use super::raw::{RawAccel, RawTurbo};
use super::types::{Accel, LegTuning, Listener, Peer, Requested, Switch, Timeouts, Turbo};

pub(super) fn accel(
    c: &mut Checker,
    table: &toml::Table,
    listeners: &[Listener],
    peers: &[Peer],
) -> Accel {
    let mut accel = Accel::default();
    let intercepting = listeners
        .iter()
        .any(|l| l.mode.intercepts() && l.intercept.is_some());
    // Early SYN also serves syn-option listeners with `watch`.
    let watching = intercepting
        || listeners
            .iter()
            .any(|l| l.mode.syn_carries_dst() && !l.watch.is_empty());
    let raw = match table.get("accel") {
        Some(v) => c.section::<RawAccel>("accel", v),
        None => Some(RawAccel::default()),
    };
    let Some(raw) = raw else { return accel };
    accel.requested = Requested {
        early_syn: Switch::from_raw(raw.early_syn),
        pool: Switch::from_raw(raw.pool),
        tfo: Switch::from_raw(raw.tfo),
        zero_rtt: Switch::from_raw(raw.zero_rtt),
        learned_window: Switch::from_raw(raw.learned_window),
        loss_isolation: Switch::from_raw(raw.loss_isolation),
    };
    accel.strict = raw.strict.unwrap_or(false);
    // A tproxy listener that takes PROXY headers learns the client only
    // after accept: dialing at the SYN would be too early.
    let proxied_tproxy = listeners
        .iter()
        .any(|l| l.mode.intercepts() && !l.accept_proxy_protocol.is_empty());
    accel.early_syn = match accel.requested.early_syn {
        Switch::Auto => watching && !accel.strict && !proxied_tproxy,
        s => s == Switch::On,
    };
    accel.pool = match accel.requested.pool {
        Switch::Auto => !peers.is_empty(),
        s => s == Switch::On,
    };
    let tfo = crate::tfo::config::resolve(raw.tfo);
    accel.tfo = tfo.from_clients;
    accel.tfo_direct = tfo.to_servers;
    accel.zero_rtt = accel.requested.zero_rtt != Switch::Off;
    if let Some(t) = raw.zero_rtt_window
        && let Some(d) = c.duration("accel.zero_rtt_window", &t)
    {
        if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&d) {
            c.err(
                "accel.zero_rtt_window",
                format!("{d:?} is outside 1s..=300s"),
            );
        }
        accel.zero_rtt_window = d;
    }
    if let Some(b) = raw.early_syn_budget {
        if b == 0 {
            c.err(
                "accel.early_syn_budget",
                "must be at least 1 (use early_syn = false to disable)",
            );
        }
        accel.early_syn_budget = b;
        accel.early_syn_prefix_budget = (b / 8).max(1);
    }
    if let Some(b) = raw.early_syn_prefix_budget {
        if b == 0 || b > accel.early_syn_budget {
            c.err(
                "accel.early_syn_prefix_budget",
                format!(
                    "{b} is outside 1..={} (accel.early_syn_budget)",
                    accel.early_syn_budget
                ),
            );
        }
        accel.early_syn_prefix_budget = b;
    }
    accel.turbo = raw.turbo.map(|t| turbo(c, t));
    let relay_legs = !peers.is_empty() || listeners.iter().any(|l| l.mode.accepts_relays());
    accel.learned_window = match accel.requested.learned_window {
        Switch::Auto => relay_legs && accel.turbo.is_none(),
        s => s == Switch::On,
    };
    if accel.learned_window && accel.turbo.is_some() {
        c.err(
            "accel.learned_window",
            "cannot be combined with [accel.turbo], which sets the relay legs' initial window itself",
        );
    }
    if let Some(t) = raw.early_syn_expiry
        && let Some(d) = c.duration("accel.early_syn_expiry", &t)
    {
        accel.early_syn_expiry = d;
    }
    syn_time_checks(c, &accel, listeners, intercepting, watching);
    accel
}

/// `loss_isolation`: auto is on where client legs run the kernel's default
/// (no `[client] congestion`) and the relay has client-facing listeners.
pub(super) fn loss_isolation(
    c: &mut Checker,
    accel: &mut Accel,
    listeners: &[Listener],
    client: &LegTuning,
) {
    let client_legs = listeners.iter().any(|l| !l.mode.accepts_relays());
    let requested = match accel.requested.loss_isolation {
        Switch::Auto => None,
        s => Some(s == Switch::On),
    };
    match crate::loss_isolation::config::resolve(
        requested,
        client_legs,
        client.congestion.is_some(),
    ) {
        Ok(on) => accel.loss_isolation = on,
        Err(message) => c.err("accel.loss_isolation", message),
    }
}

fn turbo(c: &mut Checker, t: RawTurbo) -> Turbo {
    let turbo = Turbo {
        initcwnd: t.initcwnd.unwrap_or(64),
        initrwnd: t.initrwnd.unwrap_or(64),
        buffer: t.buffer.unwrap_or(8 << 20) as usize,
    };
    // A long haul's BDP exceeds 1024 segments (100 Mbit/s x 215 ms =
    // 1857); the kernel has no cap of its own.
    for (k, v) in [("initcwnd", turbo.initcwnd), ("initrwnd", turbo.initrwnd)] {
        if !(1..=65_535).contains(&v) {
            c.err(
                format!("accel.turbo.{k}"),
                format!("{v} is outside 1..=65535 segments"),
            );
        }
    }
    if !(64 << 10..=1 << 30).contains(&turbo.buffer) {
        c.err(
            "accel.turbo.buffer",
            format!("{} is outside 65536..=1073741824 bytes", turbo.buffer),
        );
    }
    turbo
}

/// Early SYN and strict mode need somewhere to see SYNs, and both dial
/// at the SYN, before a PROXY header can name the client.
fn syn_time_checks(
    c: &mut Checker,
    accel: &Accel,
    listeners: &[Listener],
    intercepting: bool,
    watching: bool,
) {
    if accel.early_syn && !watching {
        c.err(
            "accel.early_syn",
            "needs a tproxy listener with `intercept` or a syn-option listener with `watch` (where SYNs are watched)",
        );
    }
    if accel.strict && !intercepting {
        c.err(
            "accel.strict",
            "needs a tproxy listener with `intercept` (the relay holds the SYNs its rules intercept)",
        );
    }
    if accel.early_syn || accel.strict {
        for (i, l) in listeners.iter().enumerate() {
            // Any tproxy listener: SYNs the detector or the strict queue
            // see may reach it through hand-written rules too.
            if l.mode.intercepts() && !l.accept_proxy_protocol.is_empty() {
                c.err(
                    format!("listen[{i}].accept_proxy_protocol"),
                    "cannot be combined with accel.early_syn or accel.strict on a tproxy listener (they dial the server at the SYN, before the header names the client)",
                );
            }
        }
    }
}

/// What `[accel]` requires of the other sections once all are read.
pub(super) fn cross_checks(
    c: &mut Checker,
    accel: &Accel,
    listeners: &[Listener],
    peers: &[Peer],
    timeouts: &Timeouts,
) {
    if accel.turbo.is_some() {
        // Each peer listener's allow_clients prefix becomes a turbo-start
        // route: a broad one would give client and server legs inside it
        // turbo windows too. Upstream relays outside them get a host
        // route when they authenticate.
        for (i, l) in listeners.iter().enumerate() {
            if !l.mode.accepts_relays() {
                continue;
            }
            for (j, n) in l.allow_clients.iter().enumerate() {
                let narrowest_broad = if n.addr().is_ipv4() { 24 } else { 64 };
                if n.prefix_len() < narrowest_broad {
                    c.err(
                        format!("listen[{i}].allow_clients[{j}]"),
                        format!(
                            "{n} is broader than /{narrowest_broad}: with [accel.turbo] each prefix becomes a turbo-start route, so clients and servers inside it would get turbo windows too; list the upstream relays by /{narrowest_broad} or narrower (or turn turbo off)"
                        ),
                    );
                }
            }
        }
    }
    for p in peers {
        if accel.pool && p.pool.idle >= timeouts.pooled_header {
            c.err(
                format!("peer.{}.pool.idle", p.name),
                format!(
                    "{:?} must be below timeouts.pooled_header ({:?}), or the next relay closes pooled connections before they are retired",
                    p.pool.idle, timeouts.pooled_header
                ),
            );
        }
    }
}
