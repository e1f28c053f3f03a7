//! The relay's admin handler (served by splitway-control): status,
//! live-tunable parameters, drain, reload, and the registry of open
//! connections.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use splitway_api as api;
use splitway_control::params::ParamValues;
use splitway_control::{
    AdminError, AdminHandler, ParamChange, ParamError, ParamInfo, ParamRegistry, ParamSpec,
    ParamUpdate, ParamValue,
};
use splitway_proto::Destination;
use tokio::sync::watch;

use crate::config::{Config, ListenMode};
use crate::relay::{Current, Shared};
use crate::reload::{ReloadError, Reloader};

/// Values that `PUT /params` may change while connections run. A reload
/// sets them to the config file's values: the file wins over earlier
/// `PUT /params` changes.
pub struct Live {
    idle_ms: AtomicU64,
    early_syn: AtomicBool,
}

/// The process's log filter, owned by the binary (which owns the tracing
/// subscriber) and changed through `log.level` in `PUT /params`.
pub trait LogControl: Send + Sync + 'static {
    /// The filter in effect, as it was given (e.g. `info`,
    /// `splitway_relay=debug,info`).
    fn current(&self) -> String;
    /// Checks a filter without applying it. `Err` says what is wrong.
    fn check(&self, filter: &str) -> Result<(), String>;
    /// Applies a filter.
    fn set(&self, filter: &str) -> Result<(), String>;
}

impl Live {
    pub fn new(cfg: &Config) -> Live {
        Live {
            idle_ms: AtomicU64::new(cfg.timeouts.idle.as_millis() as u64),
            early_syn: AtomicBool::new(cfg.accel.early_syn),
        }
    }

    /// Idle timeout for connections starting now.
    pub fn idle(&self) -> Duration {
        Duration::from_millis(self.idle_ms.load(Relaxed))
    }

    pub fn early_syn_enabled(&self) -> bool {
        self.early_syn.load(Relaxed)
    }

    pub(crate) fn set_idle(&self, idle: Duration) {
        self.idle_ms.store(idle.as_millis() as u64, Relaxed);
    }

    pub(crate) fn set_early_syn(&self, on: bool) {
        self.early_syn.store(on, Relaxed);
    }
}

const SHARDS: usize = 16;

/// One entry per open connection, so kept small: 96 bytes with its key
/// (112 with the mode as a `&str` and the start as an `Instant`).
struct ConnInfo {
    mode: ListenMode,
    /// Milliseconds since the registry was created.
    started_ms: u64,
    client: SocketAddr,
    /// Kept as is and formatted only for `GET /connections`: a string per
    /// connection would cost every idle connection an allocation.
    dst: Destination,
}

/// Open connections by id, sharded so registration is not a global lock.
pub struct ConnRegistry {
    epoch: Instant,
    shards: [Mutex<HashMap<u64, ConnInfo>>; SHARDS],
}

impl Default for ConnRegistry {
    fn default() -> Self {
        ConnRegistry {
            epoch: Instant::now(),
            shards: Default::default(),
        }
    }
}

/// Removes its connection from the registry when dropped.
pub struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl ConnRegistry {
    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, ConnInfo>> {
        &self.shards[(id as usize) % SHARDS]
    }

    pub fn register(
        &self,
        id: u64,
        mode: ListenMode,
        client: SocketAddr,
        dst: Destination,
        shared: Arc<Shared>,
    ) -> Registered {
        let started_ms = self.epoch.elapsed().as_millis() as u64;
        self.shard(id).lock().expect("registry lock").insert(
            id,
            ConnInfo {
                mode,
                started_ms,
                client,
                dst,
            },
        );
        Registered { shared, id }
    }

    /// Counts by mode and up to `sample` connections, oldest first.
    pub fn snapshot(&self, sample: usize) -> api::Connections {
        let mut by_mode: BTreeMap<String, u64> = BTreeMap::new();
        let mut all = Vec::new();
        for shard in &self.shards {
            for (id, c) in shard.lock().expect("registry lock").iter() {
                *by_mode.entry(c.mode.as_str().to_owned()).or_default() += 1;
                all.push((c.started_ms, *id, c.mode, c.client, c.dst.to_string()));
            }
        }
        let total = all.len();
        all.sort_by_key(|c| c.0);
        let now_ms = self.epoch.elapsed().as_secs_f64() * 1e3;
        let sample = all
            .into_iter()
            .take(sample)
            .map(|(started_ms, id, mode, client, dst)| api::Connection {
                id: format!("{id:016x}"),
                mode: mode.as_str().to_owned(),
                state: "open".to_owned(),
                client: client.to_string(),
                dst,
                age_seconds: (now_ms - started_ms as f64).max(0.0) / 1e3,
                via: None,
                bytes_to_server: None,
                bytes_to_client: None,
            })
            .collect();
        api::Connections {
            total: total as u64,
            by_state: BTreeMap::from([("open".to_owned(), total as u64)]),
            by_mode,
            sample,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared
            .conns
            .shard(self.id)
            .lock()
            .expect("registry lock")
            .remove(&self.id);
    }
}

/// Serves the admin API for a running relay.
pub struct RelayAdmin {
    current: Arc<Current>,
    reloader: Arc<Reloader>,
    log: Option<Arc<dyn LogControl>>,
    /// The parameters of one snapshot (its generation): a reload, by SIGHUP
    /// or `POST /reload`, may add or remove peers and their watermarks.
    params: Mutex<(u64, ParamRegistry)>,
    drain: watch::Sender<bool>,
}

const LOG_LEVEL: &str = "log.level";

impl RelayAdmin {
    pub fn new(
        current: Arc<Current>,
        reloader: Arc<Reloader>,
        log: Option<Arc<dyn LogControl>>,
        drain: watch::Sender<bool>,
    ) -> RelayAdmin {
        let shared = current.load();
        let params = declare_params(&shared, log.as_deref());
        RelayAdmin {
            current,
            reloader,
            log,
            params: Mutex::new((shared.generation, params)),
            drain,
        }
    }

    /// The parameter registry, rebuilt from the running values if the
    /// snapshot changed since it was built.
    fn params_of(&self, shared: &Shared) -> std::sync::MutexGuard<'_, (u64, ParamRegistry)> {
        let mut params = self
            .params
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if params.0 != shared.generation {
            *params = (
                shared.generation,
                declare_params(shared, self.log.as_deref()),
            );
        }
        params
    }
}

fn declare_params(shared: &Shared, log: Option<&dyn LogControl>) -> ParamRegistry {
    let params = ParamRegistry::new();
    let declare = |spec: ParamSpec, v: ParamValue| {
        params
            .declare(spec, v)
            .expect("parameter declared once with a valid initial value");
    };
    declare(
        ParamSpec::idle_timeout(),
        ParamValue::Duration(shared.live.idle()),
    );
    if shared.early.is_some() {
        declare(
            ParamSpec::early_syn(),
            ParamValue::Bool(shared.live.early_syn_enabled()),
        );
    }
    for pool in shared.pools.iter().flatten() {
        let name = &pool.peer().name;
        declare(
            ParamSpec::pool_low(name),
            ParamValue::Int(pool.low() as i64),
        );
        declare(
            ParamSpec::pool_high(name),
            ParamValue::Int(pool.high() as i64),
        );
    }
    if let Some(log) = log {
        declare(ParamSpec::log_level(), ParamValue::Text(log.current()));
    }
    params
}

fn cross_check(shared: &Shared, log: Option<&dyn LogControl>, v: &ParamValues) -> Vec<ParamError> {
    let mut errors = Vec::new();
    for pool in shared.pools.iter().flatten() {
        let name = &pool.peer().name;
        let (lk, hk) = (format!("pool.{name}.low"), format!("pool.{name}.high"));
        if let (Some(low), Some(high)) = (v.int(&lk), v.int(&hk))
            && low > high
        {
            errors.push(ParamError::new(
                &lk,
                format!("low ({low}) would be above high ({high})"),
            ));
        }
    }
    if let (Some(log), Some(filter)) = (log, v.text(LOG_LEVEL))
        && let Err(e) = log.check(filter)
    {
        errors.push(ParamError::new(
            LOG_LEVEL,
            format!("`{filter}` is not a log filter: {e}"),
        ));
    }
    errors
}

impl AdminHandler for RelayAdmin {
    fn status(&self) -> api::Status {
        let mut status = self.current.load().status();
        status.log_level = self.log.as_ref().map(|log| log.current());
        status
    }

    fn connections(&self, sample: usize) -> Result<api::Connections, AdminError> {
        Ok(self.current.load().conns.snapshot(sample))
    }

    fn routes(&self) -> Result<api::RoutesView, AdminError> {
        let shared = self.current.load();
        Ok(shared.paths.snapshot(&shared))
    }

    fn params(&self) -> Vec<ParamInfo> {
        let shared = self.current.load();
        self.params_of(&shared).1.infos()
    }

    fn set_params(&self, updates: &[ParamUpdate]) -> Result<Vec<ParamChange>, Vec<ParamError>> {
        let shared = self.current.load();
        let params = self.params_of(&shared);
        let params = &params.1;
        let log = self.log.as_deref();
        let changes = params.update(updates, |v| cross_check(&shared, log, v))?;
        for c in &changes {
            if c.name == "timeouts.idle"
                && let Some(d) = c.new.as_duration()
            {
                shared.live.set_idle(d);
            } else if c.name == "early_syn"
                && let Some(b) = c.new.as_bool()
            {
                shared.live.set_early_syn(b);
            } else if c.name == LOG_LEVEL
                && let (Some(log), Some(filter)) = (log, c.new.as_text())
            {
                // Said before the switch, so a quieter filter does not hide it.
                tracing::warn!(old = %c.old, new = filter, "log filter changing");
                if let Err(e) = log.set(filter) {
                    tracing::error!(filter, error = %e, "log filter passed its check but was not applied");
                }
            }
        }
        // Watermarks move together: apply each pool's pair once.
        for pool in shared.pools.iter().flatten() {
            let name = &pool.peer().name;
            let low = params.get(&format!("pool.{name}.low"));
            let high = params.get(&format!("pool.{name}.high"));
            if let (Some(l), Some(h)) =
                (low.and_then(|v| v.as_int()), high.and_then(|v| v.as_int()))
                && (l as usize, h as usize) != (pool.low(), pool.high())
            {
                pool.set_watermarks(l as usize, h as usize);
            }
        }
        Ok(changes)
    }

    fn drain(&self) -> Result<api::Drain, AdminError> {
        // Stored even with no listener left to see it: nothing to report.
        self.drain.send_replace(true);
        Ok(api::Drain {
            draining: true,
            open_connections: self.current.load().limiter.open() as u64,
        })
    }

    fn reload(&self) -> Result<api::Reload, AdminError> {
        match self.reloader.reload() {
            Ok(report) => Ok(report.api()),
            Err(ReloadError::Invalid(errors)) => Err(AdminError::Invalid(
                errors.issues.iter().map(|i| i.to_string()).collect(),
            )),
            Err(e) => Err(AdminError::Refused(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every open connection holds one entry (plus the map's spare slots).
    #[test]
    fn registry_entry_stays_small() {
        let size = std::mem::size_of::<(u64, ConnInfo)>();
        assert!(size <= 96, "registry entry is {size} bytes");
    }

    #[test]
    fn snapshot_reports_mode_and_age() {
        let registry = ConnRegistry::default();
        let client: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let dst = Destination::Ip("198.51.100.2:443".parse().unwrap());
        registry.shards[0].lock().unwrap().insert(
            0,
            ConnInfo {
                mode: ListenMode::Socks5,
                started_ms: 0,
                client,
                dst,
            },
        );
        let snap = registry.snapshot(10);
        assert_eq!(snap.total, 1);
        assert_eq!(snap.by_mode["socks5"], 1);
        let entry = &snap.sample[0];
        assert_eq!(entry.mode, "socks5");
        assert_eq!(entry.client, "192.0.2.1:4000");
        assert_eq!(entry.dst, "198.51.100.2:443");
        assert!(entry.age_seconds >= 0.0);
    }
}
