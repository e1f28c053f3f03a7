//! Reloading the config file while the relay runs (SIGHUP, `POST /reload`).
//!
//! The file is read and validated as a whole, like at start; an invalid
//! file changes nothing. A valid one becomes a new snapshot ([`Shared`]) that
//! connections accepted from then on use; open connections keep the snapshot
//! they started with. What the running process cannot change (its listening
//! sockets and interception, the admin address, the name, accelerations set
//! on sockets at bind) keeps its old value and is reported as
//! `needs_restart`.
//!
//! Values changed through `PUT /params` (pool watermarks, idle timeout,
//! early SYN) are reset to the file's: after a reload the file is the truth.
//! The log filter is not in the file and stays as it is.

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use splitway_api as api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::{Config, ConfigErrors, Listener, Peer, Via};
use crate::pool::PeerPool;
use crate::pool::new_pool;
use crate::state::{Current, Shared, install_turbo};

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the relay was started without a config file to re-read")]
    NoConfigFile,
    #[error("the relay is draining")]
    Draining,
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// The new config names a BPF congestion control that cannot be
    /// registered; the old config stays.
    #[error(transparent)]
    Congestion(#[from] crate::congestion::CongestionError),
}

/// One value a reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub old: String,
    pub new: String,
}

/// What a reload did.
#[derive(Debug, Clone, Default)]
pub struct ReloadReport {
    pub generation: u64,
    pub changed: Vec<Change>,
    /// Keys whose new value only a restart applies; their old value stays.
    pub needs_restart: Vec<String>,
}

impl ReloadReport {
    pub fn api(&self) -> api::Reload {
        api::Reload {
            reloaded: true,
            generation: self.generation,
            changed: self
                .changed
                .iter()
                .map(|c| api::ReloadChange {
                    key: c.key.clone(),
                    old: c.old.clone(),
                    new: c.new.clone(),
                })
                .collect(),
            needs_restart: self.needs_restart.clone(),
        }
    }
}

struct RunningPool {
    pool: Arc<PeerPool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Re-reads the config file and swaps the snapshot; owns the pools' refill
/// tasks, since a reload starts and stops pools.
pub struct Reloader {
    path: Option<PathBuf>,
    current: Arc<Current>,
    /// Whether the BPF SYN detector runs: only then can `early_syn` switch.
    syn_watch: bool,
    draining: AtomicBool,
    /// Held for a whole reload: reloads apply one after the other.
    pools: Mutex<Vec<RunningPool>>,
}

impl Reloader {
    pub(crate) fn new(path: Option<PathBuf>, current: Arc<Current>, syn_watch: bool) -> Reloader {
        Reloader {
            path,
            current,
            syn_watch,
            draining: AtomicBool::new(false),
            pools: Mutex::new(Vec::new()),
        }
    }

    /// The snapshot new connections start on.
    pub fn snapshot(&self) -> Arc<Shared> {
        self.current.load()
    }

    /// Pools whose refill task runs (stopped pools are gone from it).
    pub fn running_pools(&self) -> Vec<Arc<PeerPool>> {
        self.running().iter().map(|r| r.pool.clone()).collect()
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Vec<RunningPool>> {
        self.pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the refill tasks of the first snapshot's pools.
    pub(crate) fn start_pools(&self, pools: &[Option<Arc<PeerPool>>]) {
        let mut running = self.running();
        for pool in pools.iter().flatten() {
            running.push(start(pool.clone()));
        }
    }

    /// Stops every pool (the relay is shutting down) and refuses further
    /// reloads. Returns the refill tasks to wait for.
    pub(crate) fn stop(&self) -> Vec<JoinHandle<()>> {
        self.draining.store(true, Ordering::SeqCst);
        self.running()
            .drain(..)
            .map(|p| {
                let _ = p.stop.send(true);
                p.task
            })
            .collect()
    }

    /// Re-reads the config file and applies it. Logs what changed (old →
    /// new), what needs a restart, or every error of an invalid file.
    pub fn reload(&self) -> Result<ReloadReport, ReloadError> {
        let result = self.reload_inner();
        match &result {
            Ok(report) => {
                for c in &report.changed {
                    info!(key = %c.key, old = %c.old, new = %c.new, "reload: changed");
                }
                if !report.needs_restart.is_empty() {
                    warn!(keys = ?report.needs_restart, "reload: these changes need a restart and were not applied");
                }
                info!(
                    generation = report.generation,
                    changed = report.changed.len(),
                    "config reloaded"
                );
            }
            Err(ReloadError::Invalid(errors)) => {
                for issue in &errors.issues {
                    warn!(file = %errors.path, key = %issue.key, error = %issue.message, "reload refused: config invalid");
                }
            }
            Err(e) => warn!(error = %e, "reload refused"),
        }
        result
    }

    fn reload_inner(&self) -> Result<ReloadReport, ReloadError> {
        let path = self.path.as_ref().ok_or(ReloadError::NoConfigFile)?;
        let mut running = self.running();
        if self.draining.load(Ordering::SeqCst) {
            return Err(ReloadError::Draining);
        }
        let new = Config::load(path).map_err(ReloadError::Invalid)?;
        // Load on demand: new connections may only switch to an algorithm
        // that is registered.
        crate::congestion::register_for(&new)?;
        for w in new.warnings() {
            warn!("reload: {w}");
        }
        let old = self.current.load();
        let mut plan = Plan::default();
        let cfg = plan.effective(&old, new, self.syn_watch);
        plan.compare(&old, &cfg, self.syn_watch);

        // Pools: keep those whose peer, key and dial settings are unchanged
        // (only their watermarks follow the file); replace the others.
        let mut pools = Vec::with_capacity(cfg.peers.len());
        for peer in &cfg.peers {
            let reusable = old.pools.iter().flatten().find(|p| {
                same_dialing(p.peer(), peer)
                    && old.cfg.psk == cfg.psk
                    && old.cfg.timeouts == cfg.timeouts
                    && cfg.accel.pool
            });
            let pool = match reusable {
                Some(p) => {
                    p.set_watermarks(peer.pool.low, peer.pool.high);
                    Some(p.clone())
                }
                None => {
                    old.metrics.register_peer(&peer.name);
                    let pool = new_pool(&cfg, peer, &old.metrics);
                    if let Some(p) = &pool {
                        running.push(start(p.clone()));
                    }
                    pool
                }
            };
            pools.push(pool);
        }
        // Stopping a pool closes its idle connections; connections already
        // taken carry on.
        running.retain(|r| {
            let stays = pools.iter().flatten().any(|p| Arc::ptr_eq(p, &r.pool));
            if !stays {
                let name = &r.pool.peer().name;
                info!(peer = %name, "reload: stopping the old pool");
                let _ = r.stop.send(true);
                if !pools.iter().flatten().any(|p| &p.peer().name == name) {
                    // No pool reports for this peer any more.
                    old.metrics.pool_level(name, 0);
                }
            }
            stays
        });

        // Run-time state shared by every snapshot.
        old.accel.replan(
            splitway_control::metrics::AccelName::Pool,
            &crate::accel::plan(&cfg, &crate::accel::HostFacts::read()),
        );
        old.limiter.set_limits(cfg.limits);
        old.live.set_idle(cfg.timeouts.idle);
        if self.syn_watch {
            old.live.set_early_syn(cfg.accel.early_syn);
        }
        {
            // Routes to peers the new file no longer has go now, not at
            // exit (an upstream relay at the same address learns its route
            // again when it next authenticates).
            let mut routes = old.turbo_routes.lock().expect("turbo lock");
            for p in &old.cfg.peers {
                let addr = p.addr.ip().to_canonical();
                let kept = cfg.peers.iter().any(|n| n.addr.ip().to_canonical() == addr);
                if !kept && routes.remove(&addr).is_some() {
                    info!(peer = %p.name, %addr, "reload: turbo-start route to a removed peer removed");
                }
            }
        }
        if let Some(t) = cfg.accel.turbo {
            let mut routes = old.turbo_routes.lock().expect("turbo lock");
            for p in &cfg.peers {
                let addr = p.addr.ip().to_canonical();
                if routes.contains_key(&addr) {
                    continue;
                }
                match install_turbo(addr, None, t) {
                    Ok(r) => {
                        info!(peer = %p.name, route = r.destination(), "turbo-start route installed");
                        routes.insert(addr, r);
                    }
                    Err(e) => warn!(peer = %p.name, error = %e, "cannot install turbo-start route"),
                }
            }
        }
        let next = Arc::new(old.successor(cfg, pools));
        let generation = next.generation;
        self.current.store(next);
        Ok(ReloadReport {
            generation,
            changed: plan.changed,
            needs_restart: plan.needs_restart,
        })
    }
}

fn start(pool: Arc<PeerPool>) -> RunningPool {
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(pool.clone().maintain(stop_rx));
    RunningPool { pool, stop, task }
}

/// Whether a pool dialing `a` can serve `b`: everything but the watermarks.
/// Compared through `Debug` so that every field a pool dials with counts,
/// including ones added to `Peer` later (a changed field must never leave a
/// pool dialing with the old value).
fn same_dialing(a: &Peer, b: &Peer) -> bool {
    let without_watermarks = |p: &Peer| {
        let mut p = p.clone();
        (p.pool.low, p.pool.high) = (0, 0);
        format!("{p:?}")
    };
    a.name == b.name && without_watermarks(a) == without_watermarks(b)
}

/// A listener as far as the running process is concerned: its socket
/// (with SO_REUSEPORT or not) and interception (the client ACL can change).
fn socket_key(l: &Listener) -> String {
    format!(
        "{} {} {:?} reuse_port={} accept_sockets={:?} watch={:?}",
        l.mode.as_str(),
        l.addr,
        l.intercept.as_ref().map(|i| (&i.interfaces, &i.ports)),
        l.reuse_port,
        l.accept_sockets,
        // The SYN detector is attached at start, like interception.
        l.watch
    )
}

fn show<T: Debug>(v: &T) -> String {
    format!("{v:?}")
}

fn via_name(cfg: &Config, via: &Via) -> String {
    match via {
        Via::Direct => "direct".into(),
        Via::Peer(i) => cfg.peers[*i].name.clone(),
    }
}

#[derive(Default)]
struct Plan {
    changed: Vec<Change>,
    needs_restart: Vec<String>,
}

impl Plan {
    fn change(&mut self, key: impl Into<String>, old: impl Into<String>, new: impl Into<String>) {
        let (old, new) = (old.into(), new.into());
        if old != new {
            self.changed.push(Change {
                key: key.into(),
                old,
                new,
            });
        }
    }

    fn restart_if<T: PartialEq>(&mut self, key: &str, old: &T, new: &T) {
        if old != new {
            self.needs_restart.push(key.to_owned());
        }
    }

    /// The config the new snapshot runs: the file's, except for what only
    /// a restart can change, which keeps its running value.
    fn effective(&mut self, old: &Shared, mut new: Config, syn_watch: bool) -> Config {
        let o = &old.cfg;
        self.restart_if("name", &o.name, &new.name);
        self.restart_if("admin", &o.admin, &new.admin);
        // Each listener added, removed or changed (mode, interception).
        let mut sockets: Vec<String> = Vec::new();
        for (a, b) in [
            (&o.listeners, &new.listeners),
            (&new.listeners, &o.listeners),
        ] {
            for l in a {
                let key = format!("listen.{}", l.addr);
                if !b.iter().any(|x| socket_key(x) == socket_key(l)) && !sockets.contains(&key) {
                    sockets.push(key);
                }
            }
        }
        self.needs_restart.extend(sockets);
        // Listener TFO is set at start; direct legs' TFO goes with it.
        self.restart_if(
            "accel.tfo",
            &(o.accel.tfo, o.accel.tfo_direct),
            &(new.accel.tfo, new.accel.tfo_direct),
        );
        // Peer listeners' TFO and the replay window are set up at start.
        self.restart_if("accel.zero_rtt", &o.accel.zero_rtt, &new.accel.zero_rtt);
        self.restart_if(
            "accel.zero_rtt_window",
            &o.accel.zero_rtt_window,
            &new.accel.zero_rtt_window,
        );
        self.restart_if("accel.turbo", &o.accel.turbo, &new.accel.turbo);
        self.restart_if(
            "accel.early_syn_budget",
            &o.accel.early_syn_budget,
            &new.accel.early_syn_budget,
        );
        self.restart_if(
            "accel.early_syn_expiry",
            &o.accel.early_syn_expiry,
            &new.accel.early_syn_expiry,
        );
        // Strict mode owns an NFQUEUE and its rules from start to exit.
        self.restart_if("accel.strict", &o.accel.strict, &new.accel.strict);
        if !syn_watch {
            // No SYN detector attached: switching early SYN on needs one.
            self.restart_if("accel.early_syn", &o.accel.early_syn, &new.accel.early_syn);
            new.accel.early_syn = o.accel.early_syn;
        }
        // The running listeners stay. Where the file has a listener on the
        // same socket, its per-connection settings (the client ACL, ...)
        // apply; what belongs to the socket (interception, v6-only) stays.
        let listeners = o
            .listeners
            .iter()
            .map(|l| {
                match new
                    .listeners
                    .iter()
                    .find(|n| n.mode == l.mode && n.addr == l.addr)
                {
                    Some(n) => {
                        let mut n = n.clone();
                        n.intercept = l.intercept.clone();
                        n.watch = l.watch.clone();
                        n.v6_only = l.v6_only;
                        n
                    }
                    None => l.clone(),
                }
            })
            .collect();
        new.listeners = listeners;
        new.name = o.name.clone();
        new.admin = o.admin;
        new.accel.tfo = o.accel.tfo;
        new.accel.tfo_direct = o.accel.tfo_direct;
        new.accel.zero_rtt = o.accel.zero_rtt;
        new.accel.zero_rtt_window = o.accel.zero_rtt_window;
        new.accel.turbo = o.accel.turbo;
        new.accel.early_syn_budget = o.accel.early_syn_budget;
        new.accel.early_syn_expiry = o.accel.early_syn_expiry;
        new.accel.strict = o.accel.strict;
        new
    }

    /// Old → new of everything the snapshot changes, the old side being
    /// what runs (live parameters included).
    fn compare(&mut self, old: &Shared, new: &Config, syn_watch: bool) {
        let o = &old.cfg;
        for (l, n) in o.listeners.iter().zip(&new.listeners) {
            let key = format!("listen.{}.allow_clients", l.addr);
            self.change(key, show(&l.allow_clients), show(&n.allow_clients));
            let key = format!("listen.{}.accept_proxy_protocol", l.addr);
            self.change(
                key,
                show(&l.accept_proxy_protocol),
                show(&n.accept_proxy_protocol),
            );
        }
        for p in &o.peers {
            if !new.peers.iter().any(|n| n.name == p.name) {
                self.change(format!("peer.{}", p.name), p.addr.to_string(), "(removed)");
            }
        }
        for n in &new.peers {
            let Some(p) = o.peers.iter().find(|p| p.name == n.name) else {
                self.change(format!("peer.{}", n.name), "(none)", n.addr.to_string());
                continue;
            };
            let key = |k: &str| format!("peer.{}.{k}", n.name);
            self.change(key("addr"), p.addr.to_string(), n.addr.to_string());
            self.change(key("tuning"), show(&p.tuning), show(&n.tuning));
            self.change(key("pool.idle"), show(&p.pool.idle), show(&n.pool.idle));
            // The running watermarks, which `PUT /params` may have moved.
            let (low, high) = old
                .pools
                .iter()
                .flatten()
                .find(|pool| pool.peer().name == n.name)
                .map(|pool| (pool.low(), pool.high()))
                .unwrap_or((p.pool.low, p.pool.high));
            self.change(key("pool.low"), low.to_string(), n.pool.low.to_string());
            self.change(key("pool.high"), high.to_string(), n.pool.high.to_string());
        }
        for r in &o.routes {
            if !new.routes.iter().any(|n| n.dst == r.dst) {
                self.change(format!("route.{}", r.dst), via_name(o, &r.via), "(removed)");
            }
        }
        for r in &new.routes {
            let before = o
                .routes
                .iter()
                .find(|x| x.dst == r.dst)
                .map(|x| via_name(o, &x.via))
                .unwrap_or_else(|| "(none)".into());
            self.change(format!("route.{}", r.dst), before, via_name(new, &r.via));
            if let Some(x) = o.routes.iter().find(|x| x.dst == r.dst) {
                // proxy_protocol and source.
                self.change(
                    format!("route.{}.reveal", r.dst),
                    show(&x.reveal),
                    show(&r.reveal),
                );
            }
        }
        let (ot, nt) = (&o.timeouts, &new.timeouts);
        self.change("timeouts.connect", show(&ot.connect), show(&nt.connect));
        self.change(
            "timeouts.handshake",
            show(&ot.handshake),
            show(&nt.handshake),
        );
        self.change("timeouts.idle", show(&old.live.idle()), show(&nt.idle));
        self.change(
            "timeouts.pooled_header",
            show(&ot.pooled_header),
            show(&nt.pooled_header),
        );
        self.change(
            "limits.max_connections",
            o.limits.max_connections.to_string(),
            new.limits.max_connections.to_string(),
        );
        self.change(
            "limits.per_client",
            o.limits.per_client.to_string(),
            new.limits.per_client.to_string(),
        );
        self.change("direct", show(&o.direct), show(&new.direct));
        self.change("client", show(&o.client), show(&new.client));
        self.change("upstream", show(&o.upstream), show(&new.upstream));
        self.change(
            "forwarding.data_path",
            show(&o.forwarding.data_path),
            show(&new.forwarding.data_path),
        );
        self.change(
            "accel.pool",
            o.accel.pool.to_string(),
            new.accel.pool.to_string(),
        );
        if syn_watch {
            self.change(
                "accel.early_syn",
                old.live.early_syn_enabled().to_string(),
                new.accel.early_syn.to_string(),
            );
        }
        // Keys are never shown, only that they changed.
        let key_state = |file: &Option<PathBuf>, same: bool| match file {
            None => "(none)".to_owned(),
            Some(p) if same => p.display().to_string(),
            Some(p) => format!("{} (new key)", p.display()),
        };
        self.change(
            "psk_file",
            key_state(&o.psk_file, true),
            key_state(&new.psk_file, o.psk == new.psk),
        );
        let previous = |k: &Option<splitway_proto::auth::Psk>| match k {
            None => "(none)",
            Some(_) => "set",
        };
        if o.psk_previous != new.psk_previous {
            let new_state = if new.psk_previous.is_some() && o.psk_previous.is_some() {
                "set (new key)"
            } else {
                previous(&new.psk_previous)
            };
            self.change("psk_file_previous", previous(&o.psk_previous), new_state);
        }
    }
}
