//! The relay's side of the admin API: live-tunable parameters, drain, and
//! the registry of open connections.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use splitway_control::params::ParamValues;
use splitway_control::{
    AdminError, AdminHandler, ParamChange, ParamError, ParamInfo, ParamRegistry, ParamSpec,
    ParamUpdate, ParamValue,
};
use tokio::sync::watch;

use crate::config::Config;
use crate::relay::Shared;

/// Values that `PUT /params` may change while connections run.
pub struct Live {
    idle_ms: AtomicU64,
    early_syn: AtomicBool,
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
}

const SHARDS: usize = 16;

struct ConnInfo {
    mode: &'static str,
    client: SocketAddr,
    dst: String,
    started: Instant,
}

/// Open connections by id, sharded so registration is not a global lock.
#[derive(Default)]
pub struct ConnRegistry {
    shards: [Mutex<HashMap<u64, ConnInfo>>; SHARDS],
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
        mode: &'static str,
        client: SocketAddr,
        dst: String,
        shared: Arc<Shared>,
    ) -> Registered {
        self.shard(id).lock().expect("registry lock").insert(
            id,
            ConnInfo {
                mode,
                client,
                dst,
                started: Instant::now(),
            },
        );
        Registered { shared, id }
    }

    /// Counts by mode and up to `sample` connections, oldest first.
    pub fn snapshot(&self, sample: usize) -> Value {
        let mut by_mode: HashMap<&str, u64> = HashMap::new();
        let mut all = Vec::new();
        for shard in &self.shards {
            for (id, c) in shard.lock().expect("registry lock").iter() {
                *by_mode.entry(c.mode).or_default() += 1;
                all.push((c.started, *id, c.mode, c.client, c.dst.clone()));
            }
        }
        let total = all.len();
        all.sort_by_key(|c| c.0);
        let sample: Vec<Value> = all
            .into_iter()
            .take(sample)
            .map(|(started, id, mode, client, dst)| {
                json!({
                    "id": format!("{id:016x}"),
                    "mode": mode,
                    "state": "open",
                    "client": client.to_string(),
                    "dst": dst,
                    "age_seconds": started.elapsed().as_secs_f64(),
                })
            })
            .collect();
        json!({"total": total, "by_state": {"open": total}, "by_mode": by_mode, "sample": sample})
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
    shared: Arc<Shared>,
    params: ParamRegistry,
    drain: watch::Sender<bool>,
}

impl RelayAdmin {
    pub fn new(shared: Arc<Shared>, drain: watch::Sender<bool>) -> RelayAdmin {
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
        RelayAdmin {
            shared,
            params,
            drain,
        }
    }
}

fn pool_cross_check(shared: &Shared, v: &ParamValues) -> Vec<ParamError> {
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
    errors
}

impl AdminHandler for RelayAdmin {
    fn status(&self) -> Value {
        self.shared.status()
    }

    fn connections(&self, sample: usize) -> Result<Value, AdminError> {
        Ok(self.shared.conns.snapshot(sample))
    }

    fn params(&self) -> Vec<ParamInfo> {
        self.params.infos()
    }

    fn set_params(&self, updates: &[ParamUpdate]) -> Result<Vec<ParamChange>, Vec<ParamError>> {
        let changes = self
            .params
            .update(updates, |v| pool_cross_check(&self.shared, v))?;
        for c in &changes {
            if c.name == "timeouts.idle"
                && let Some(d) = c.new.as_duration()
            {
                self.shared
                    .live
                    .idle_ms
                    .store(d.as_millis() as u64, Relaxed);
            } else if c.name == "early_syn"
                && let Some(b) = c.new.as_bool()
            {
                self.shared.live.early_syn.store(b, Relaxed);
            }
        }
        // Watermarks move together: apply each pool's pair once.
        for pool in self.shared.pools.iter().flatten() {
            let name = &pool.peer().name;
            let low = self.params.get(&format!("pool.{name}.low"));
            let high = self.params.get(&format!("pool.{name}.high"));
            if let (Some(l), Some(h)) =
                (low.and_then(|v| v.as_int()), high.and_then(|v| v.as_int()))
                && (l as usize, h as usize) != (pool.low(), pool.high())
            {
                pool.set_watermarks(l as usize, h as usize);
            }
        }
        Ok(changes)
    }

    fn drain(&self) -> Result<Value, AdminError> {
        let _ = self.drain.send(true);
        Ok(json!({
            "draining": true,
            "open_connections": self.shared.limiter.open(),
        }))
    }
}
