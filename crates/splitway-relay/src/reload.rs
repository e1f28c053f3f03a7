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

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::accel::{AccelName, AccelState};
use splitway_api as api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::diff::{self, Running, same_dialing};
use crate::config::{Config, ConfigErrors};
use crate::pool::PeerPool;
use crate::pool::new_pool;
use crate::state::{Current, Shared};

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

pub use crate::config::diff::Change;

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
                    warn!(keys = %report.needs_restart.join(", "), "reload: these changes need a restart and were not applied");
                }
                info!(
                    generation = report.generation,
                    changed = report.changed.len(),
                    "config reloaded"
                );
            }
            Err(ReloadError::Invalid(errors)) => {
                for line in errors.lines() {
                    warn!("reload refused: config invalid: {line}");
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
        let mut new = Config::load(path).map_err(ReloadError::Invalid)?;
        let old = self.current.load();
        // Relay legs keep the learned window the relay started with (a
        // change of `accel.learned_window` needs a restart).
        if old.accel.state(AccelName::LearnedWindow) == AccelState::Active {
            crate::learned_window::fill_learned_window(&mut new);
        }
        // Load on demand: new connections may only switch to an algorithm
        // that is registered.
        crate::congestion::register_for(&new.congestion_keys())?;
        for w in new.warnings() {
            warn!("reload: {w}");
        }
        let running_now = running_values(&old);
        let (cfg, plan) = diff::reload(&old.cfg, &running_now, new, self.syn_watch);

        let pools = reuse_or_start_pools(&old, &cfg, &mut running);
        // Run-time state shared by every snapshot.
        old.accel.replan(
            AccelName::Pool,
            &crate::accel::plan(&cfg, &crate::accel::HostFacts::read()),
        );
        old.limiter.set_limits(cfg.limits);
        if let Err(e) = old.host.refresh() {
            warn!(error = %e, "reload: cannot read this host's addresses; keeping the previous list");
        }
        old.live.set_idle(cfg.timeouts.idle);
        if self.syn_watch {
            old.live.set_early_syn(cfg.accel.early_syn);
        }
        old.rooms.turbo.follow_reload(&old.cfg, &cfg);
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

/// The new snapshot's pools: those whose peer, key and dial settings are
/// unchanged stay (only their watermarks follow the file), the others are
/// replaced; stopping a pool closes its idle connections, connections
/// already taken carry on.
fn reuse_or_start_pools(
    old: &Shared,
    cfg: &Config,
    running: &mut Vec<RunningPool>,
) -> Vec<Option<Arc<PeerPool>>> {
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
                old.rooms.pools.register_peer(&peer.name);
                let pool = new_pool(cfg, peer, &old.rooms.pools);
                if let Some(p) = &pool {
                    running.push(start(p.clone()));
                }
                pool
            }
        };
        pools.push(pool);
    }
    running.retain(|r| {
        let stays = pools.iter().flatten().any(|p| Arc::ptr_eq(p, &r.pool));
        if !stays {
            let name = &r.pool.peer().name;
            info!(peer = %name, "reload: stopping the old pool");
            let _ = r.stop.send(true);
            if !pools.iter().flatten().any(|p| &p.peer().name == name) {
                // No pool reports for this peer any more.
                old.rooms.pools.for_peer(name).level(0);
            }
        }
        stays
    });
    pools
}

/// What runs now, where it may differ from the file (`PUT /params`).
fn running_values(old: &Shared) -> Running {
    Running {
        idle: old.live.idle(),
        early_syn: old.live.early_syn_enabled(),
        watermarks: old
            .pools
            .iter()
            .flatten()
            .map(|p| (p.peer().name.clone(), p.low(), p.high()))
            .collect(),
    }
}
