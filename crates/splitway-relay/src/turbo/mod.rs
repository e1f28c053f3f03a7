//! Turbo-Start (`[accel.turbo]`), in a room of its own (issue #31): the
//! routes that give every relay leg to and from another relay the
//! configured initial windows (`initcwnd`, `initrwnd` route attributes).
//! Routes go to configured peers and to upstream relays' allowed prefixes
//! at start, to an upstream relay outside those prefixes when it
//! authenticates, follow the peers across a reload, and are removed when
//! the relay stops (dropping a `TurboRoute` deletes it). The relay legs'
//! buffers are `tuning.rs`'s; the status line is [`plan`]'s. It has no
//! live parameter: its windows change by a reload.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use splitway_sys::turbo::{self, TurboRoute, Windows};
use tracing::{info, warn};

use crate::config::{Config, Turbo};

pub mod plan;

/// The installed routes by destination, shared by a reload's successor.
#[derive(Debug, Default)]
pub struct TurboRoutes {
    routes: Mutex<HashMap<IpAddr, TurboRoute>>,
}

/// A route the host refused.
#[derive(Debug, thiserror::Error)]
#[error("turbo-start route to {addr}: {source}")]
pub struct RouteRefused {
    pub addr: IpAddr,
    #[source]
    pub source: splitway_sys::SysError,
}

impl TurboRoutes {
    /// Routes to every relay `cfg` names: its peers and the prefixes its
    /// peer listeners allow (other upstream relays are learned when they
    /// authenticate). Nothing without `[accel.turbo]`.
    pub fn install_at_start(&self, cfg: &Config) -> Result<(), RouteRefused> {
        let Some(t) = cfg.accel.turbo else {
            return Ok(());
        };
        let mut routes = self.lock();
        for (addr, len) in cfg
            .peers
            .iter()
            .map(|p| (p.addr.ip().to_canonical(), None))
            .chain(upstream_prefixes(cfg).map(|n| (n.addr(), Some(n.prefix_len()))))
        {
            let r = install(addr, len, t).map_err(|source| RouteRefused { addr, source })?;
            info!(
                route = r.destination(),
                initcwnd = t.initcwnd,
                initrwnd = t.initrwnd,
                "turbo-start route installed"
            );
            routes.insert(addr, r);
        }
        Ok(())
    }

    /// An upstream relay at `addr` authenticated: the return direction gets
    /// turbo-start too. Its connections established before the route keep
    /// the default window.
    pub fn learn_upstream(&self, cfg: &Config, addr: IpAddr) {
        let Some(turbo) = cfg.accel.turbo else {
            return;
        };
        let addr = addr.to_canonical();
        // Upstreams inside a configured prefix (routes installed at start)
        // are settled without the lock every relay connection would take.
        if upstream_prefixes(cfg).any(|n| n.contains(&addr)) {
            return;
        }
        let mut routes = self.lock();
        if routes.contains_key(&addr) {
            return;
        }
        match install(addr, None, turbo) {
            Ok(r) => {
                info!(upstream = %addr, route = r.destination(), "turbo-start route installed for upstream relay");
                routes.insert(addr, r);
            }
            Err(e) => warn!(upstream = %addr, error = %e, "cannot install turbo-start route"),
        }
    }

    /// After a reload from `old` to `new`: routes to peers the new file no
    /// longer has go now, not at exit (an upstream relay at the same
    /// address learns its route again when it next authenticates); new
    /// peers get one.
    pub fn follow_reload(&self, old: &Config, new: &Config) {
        let mut routes = self.lock();
        for p in &old.peers {
            let addr = p.addr.ip().to_canonical();
            let kept = new.peers.iter().any(|n| n.addr.ip().to_canonical() == addr);
            if !kept && routes.remove(&addr).is_some() {
                info!(peer = %p.name, %addr, "reload: turbo-start route to a removed peer removed");
            }
        }
        let Some(t) = new.accel.turbo else {
            return;
        };
        for p in &new.peers {
            let addr = p.addr.ip().to_canonical();
            if routes.contains_key(&addr) {
                continue;
            }
            match install(addr, None, t) {
                Ok(r) => {
                    info!(peer = %p.name, route = r.destination(), "turbo-start route installed");
                    routes.insert(addr, r);
                }
                Err(e) => warn!(peer = %p.name, error = %e, "cannot install turbo-start route"),
            }
        }
    }

    /// The installed routes' destinations, for `/status`.
    pub fn destinations(&self) -> Vec<String> {
        self.lock()
            .values()
            .map(|r| r.destination().to_owned())
            .collect()
    }

    /// Removes every route (the relay stops).
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, TurboRoute>> {
        // A panic while holding the lock left the map itself consistent.
        self.routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The prefixes peer listeners allow upstream relays from: their routes
/// are installed at start.
fn upstream_prefixes(cfg: &Config) -> impl Iterator<Item = &ipnet::IpNet> {
    cfg.listeners
        .iter()
        .filter(|l| l.mode.accepts_relays())
        .flat_map(|l| l.allow_clients.iter())
}

/// One route to `addr`/`prefix` (the host's own length without one).
fn install(
    addr: IpAddr,
    prefix: Option<u8>,
    t: Turbo,
) -> Result<TurboRoute, splitway_sys::SysError> {
    let len = prefix.unwrap_or(if addr.is_ipv4() { 32 } else { 128 });
    turbo::install(
        addr,
        len,
        Windows {
            initcwnd: t.initcwnd,
            initrwnd: t.initrwnd,
        },
    )
}
