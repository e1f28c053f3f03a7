//! Next legs started at a client's SYN, before accept: early SYN's
//! detector events (the leg waits in `early_syn`'s table) and the checks
//! strict mode shares (a SYN accept would refuse starts nothing).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::metrics::DenyReason;
use rand::RngCore;
use splitway_proto::Destination;
use splitway_proto::header::DEFAULT_TTL;
use tokio::sync::oneshot;

use crate::config::Listener;
use crate::dial::connect_next;
use crate::early_syn::EarlyStarts;
use crate::limits::Refused;
use crate::next_leg::{LegRequest, Started, Unclaimed};
use crate::route::allowed;
use crate::state::Shared;
use crate::syn_dst::from_options;

/// The early-SYN table as the relay uses it: legs being dialed.
pub type EarlyLegs = EarlyStarts<Started>;

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// A client's SYN was seen: start its next leg unless already started,
/// over budget, or for a client that accept would refuse. `ttl` is the
/// SYN's IP TTL (the loop guard's hop count).
pub fn on_syn(
    early: &EarlyLegs,
    shared: &Arc<Shared>,
    client: SocketAddr,
    dst: SocketAddr,
    ttl: u8,
) {
    if !shared.live.early_syn_enabled() {
        return;
    }
    if admissible(shared, client).is_err() {
        early.denied();
        return;
    }
    start(early, shared, client, dst, ttl);
}

/// A SYN to a syn-option listener (`to`) that carries our option
/// (`options`: its raw TCP options). The listener's `allow_clients` and
/// `[limits]` are checked before anything else, the option is decoded
/// exactly as accept will decode the saved SYN, and the leg starts for
/// the destination it names; the accepted socket pairs with it by
/// (client, destination). A refused client or an unusable option starts
/// nothing (`denied`); accept then refuses the connection itself.
pub fn on_option_syn(
    early: &EarlyLegs,
    shared: &Arc<Shared>,
    client: SocketAddr,
    to: SocketAddr,
    options: &[u8],
    ttl: u8,
) {
    if !shared.live.early_syn_enabled() {
        return;
    }
    let Some(listener) = syn_option_listener(shared, to) else {
        // Not ours (another listener moved away on reload): nothing.
        early.denied();
        return;
    };
    if admissible_at(shared, client, &listener.allow_clients, true).is_err() {
        early.denied();
        return;
    }
    match from_options(options, &listener.syn_option_prefixes) {
        Ok(dst) => start(early, shared, client, dst, ttl),
        Err(e) => {
            tracing::debug!(%client, listener = %to, error = %e, "early SYN: no usable destination option");
            early.denied();
        }
    }
}

fn start(early: &EarlyLegs, shared: &Arc<Shared>, client: SocketAddr, dst: SocketAddr, ttl: u8) {
    let (tx, rx) = oneshot::channel();
    let Some((origin, dst)) = early.start(client, dst, rx) else {
        return;
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut req = LegRequest {
            dst: Destination::Ip(dst),
            // The thread's CSPRNG, like accepted connections' ids: no
            // getrandom syscall per SYN.
            conn_id: rand::thread_rng().next_u64(),
            next_ttl: DEFAULT_TTL,
            arrived_hops: Some(ttl),
            origin,
            client: origin.ip(),
            early_data: Vec::new(),
            speculative: true,
            // Early SYN serves transparent and syn-option clients only.
            optimistic: true,
        };
        let r = connect_next(&shared, &mut req).await;
        // Nobody waiting (expired, or the session ended first): the leg
        // comes back and is reset as it drops.
        let _ = tx.send(r.map(Unclaimed::new));
    });
}

/// Whether accept would admit `client` on an intercepting listener: its
/// `allow_clients` and the connection limits. Checked before any leg is
/// started for a SYN (early SYN, strict mode), so a refused client's SYN
/// dials nothing and holds no budget.
pub fn admissible(shared: &Shared, client: SocketAddr) -> Result<(), DenyReason> {
    let ip = client.ip().to_canonical();
    let allowed_somewhere = shared
        .cfg
        .listeners
        .iter()
        .filter(|l| l.mode.intercepts() && l.intercept.is_some())
        .any(|l| allowed(&l.allow_clients, ip, false));
    if !allowed_somewhere {
        return Err(DenyReason::Client);
    }
    within_limits(shared, ip)
}

/// [`admissible`] for one listener's `allow_clients` (`explicit`: empty
/// means loopback only, as at accept).
fn admissible_at(
    shared: &Shared,
    client: SocketAddr,
    allow_clients: &[ipnet::IpNet],
    explicit: bool,
) -> Result<(), DenyReason> {
    let ip = client.ip().to_canonical();
    if !allowed(allow_clients, ip, explicit) {
        return Err(DenyReason::Client);
    }
    within_limits(shared, ip)
}

/// Whether `[limits]` and the descriptor cap would admit one more
/// connection from `ip` now.
fn within_limits(shared: &Shared, ip: std::net::IpAddr) -> Result<(), DenyReason> {
    shared
        .limiter
        .would_admit(Some(ip))
        .map_err(Refused::reason)
}

/// The syn-option listener a SYN to `to` reaches: same port, and the same
/// address unless the listener's is unspecified.
fn syn_option_listener(shared: &Shared, to: SocketAddr) -> Option<&Listener> {
    let to = canonical(to);
    shared.cfg.listeners.iter().find(|l| {
        l.mode.syn_carries_dst()
            && l.addr.port() == to.port()
            && (l.addr.ip().is_unspecified() || l.addr.ip().to_canonical() == to.ip())
    })
}

/// Whether any syn-option listener has its SYNs watched (else its accepts
/// have no early legs to look for, and are not misses).
pub fn watches_syn_option(shared: &Shared) -> bool {
    shared
        .cfg
        .listeners
        .iter()
        .any(|l| l.mode.syn_carries_dst() && !l.watch.is_empty())
}

/// Whether a plain (option-less) SYN event is for a syn-option listener:
/// reported only because an intercepted port range covers it; it must
/// start nothing.
pub fn is_for_syn_option_listener(shared: &Shared, to: SocketAddr) -> bool {
    syn_option_listener(shared, to).is_some()
}
