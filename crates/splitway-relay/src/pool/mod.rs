//! Pre-established, authenticated connections to each peer relay (the KTCP
//! paper's connection pool, pingora-pool's idle bookkeeping).
//!
//! Each pooled connection completed mutual authentication in advance and
//! carries exactly one split connection, then closes: a reused byte stream
//! must never mix two clients. Refill happens in a background task per peer,
//! never on a connection's critical path: when the idle count drops below
//! `low`, the task dials concurrently until `high` are idle or in flight.
//! The status line is [`plan`]'s; the watermarks' live parameters
//! (`pool.<peer>.low`, `pool.<peer>.high`) are `params.rs`'s.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use splitway_api as api;
use splitway_proto::auth::Psk;
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::config::{Config, Peer, Timeouts};
use crate::peer::{self, Pooled};
use crate::shutdown::stopped;

mod metrics;
mod params;
pub mod plan;

pub use metrics::{PoolEvent, PoolFamilies, PoolMetrics};
pub use params::{param_high, param_low, param_names};

/// After a failed refill dial, wait this long before the next (doubling up
/// to `MAX_BACKOFF`), so an unreachable peer is not hammered.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often idle connections are checked for age and liveness.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

pub struct PeerPool {
    peer: Peer,
    /// Watermarks, tunable live through the admin API.
    low: AtomicUsize,
    high: AtomicUsize,
    leg_buffer: Option<usize>,
    /// This peer's pool series, resolved once: what it counts, and what
    /// `/status` reads back.
    pool_metrics: PoolMetrics,
    psk: Psk,
    timeouts: Timeouts,
    idle: Mutex<VecDeque<Pooled>>,
    in_flight: AtomicUsize,
    wake: Notify,
    last_error: Mutex<Option<String>>,
}

impl PeerPool {
    pub fn new(
        peer: Peer,
        psk: Psk,
        timeouts: Timeouts,
        leg_buffer: Option<usize>,
        pool_metrics: PoolMetrics,
    ) -> Arc<PeerPool> {
        Arc::new(PeerPool {
            pool_metrics,
            low: AtomicUsize::new(peer.pool.low),
            high: AtomicUsize::new(peer.pool.high),
            peer,
            leg_buffer,
            psk,
            timeouts,
            idle: Mutex::new(VecDeque::new()),
            in_flight: AtomicUsize::new(0),
            wake: Notify::new(),
            last_error: Mutex::new(None),
        })
    }

    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// Idle connections ready to carry a split connection.
    pub fn level(&self) -> usize {
        self.idle.lock().expect("pool lock").len()
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("pool lock").clone()
    }

    /// Takes the freshest live connection, discarding dead or old ones.
    /// `None` when the pool is empty: the caller dials a fresh connection.
    pub fn take(&self) -> Option<Pooled> {
        let mut level;
        let found = loop {
            let candidate = {
                let mut idle = self.idle.lock().expect("pool lock");
                level = idle.len().saturating_sub(1);
                idle.pop_back()
            };
            let Some(c) = candidate else { break None };
            if c.born.elapsed() >= self.peer.pool.idle {
                self.count(PoolEvent::Expired, 1);
                continue;
            }
            if !c.is_alive() {
                self.count(PoolEvent::Dead, 1);
                continue;
            }
            break Some(c);
        };
        match &found {
            Some(_) => self.count(PoolEvent::Taken, 1),
            None => self.count(PoolEvent::Miss, 1),
        };
        self.pool_metrics.level(level);
        self.wake.notify_one();
        found
    }

    /// Closes every idle connection (the relay drains: none will be
    /// taken); how many. Counted as expired, their lifetime cut short.
    pub fn close_idle(&self) -> usize {
        let closed = std::mem::take(&mut *self.idle.lock().expect("pool lock"));
        self.count(PoolEvent::Expired, closed.len());
        self.pool_metrics.level(0);
        closed.len()
    }

    /// Like [`take`](Self::take), but only while at least `low` are idle:
    /// for speculative (early-SYN) legs, which must not drain the pool.
    /// Taking at `low` leaves fewer than `low`, which starts a refill; with
    /// `> low` a pool resting at `low` never refilled and every early-SYN
    /// leg dialed afresh (two more RTTs of the relay leg).
    pub fn take_above_low(&self) -> Option<Pooled> {
        if self.level() >= self.low() {
            self.take()
        } else {
            None
        }
    }

    pub fn low(&self) -> usize {
        self.low.load(Ordering::Relaxed)
    }

    pub fn high(&self) -> usize {
        self.high.load(Ordering::Relaxed)
    }

    /// New watermarks (validated by the caller: low <= high). A lower
    /// `high` lets the surplus retire by age; a higher `low` refills now.
    pub fn set_watermarks(&self, low: usize, high: usize) {
        self.low.store(low, Ordering::Relaxed);
        self.high.store(high, Ordering::Relaxed);
        self.wake.notify_one();
    }

    fn count(&self, event: PoolEvent, n: usize) {
        self.pool_metrics.event(event, n as u64);
    }

    fn needs_refill(&self) -> usize {
        let level = self.level() + self.in_flight.load(Ordering::Relaxed);
        if self.level() < self.low() || level < self.low() {
            self.high().saturating_sub(level)
        } else {
            0
        }
    }

    /// Drops idle connections that are too old or whose peer went away.
    fn sweep(&self) {
        let mut idle = self.idle.lock().expect("pool lock");
        let before = idle.len();
        let max_age = self.peer.pool.idle;
        let mut expired = 0;
        idle.retain(|c| {
            if c.born.elapsed() >= max_age {
                expired += 1;
                false
            } else {
                c.is_alive()
            }
        });
        let dropped = before - idle.len();
        let level = idle.len();
        drop(idle);
        self.count(PoolEvent::Expired, expired);
        self.count(PoolEvent::Dead, dropped - expired);
        self.pool_metrics.level(level);
    }

    /// Keeps the pool between its watermarks until `stop`.
    pub async fn maintain(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut backoff = MIN_BACKOFF;
        info!(peer = %self.peer.name, low = self.low(), high = self.high(), "pool started");
        'maintain: loop {
            self.sweep();
            let want = self.needs_refill();
            if want > 0 {
                let mut dials = tokio::task::JoinSet::new();
                for _ in 0..want {
                    self.in_flight.fetch_add(1, Ordering::Relaxed);
                    let pool = self.clone();
                    dials.spawn(async move {
                        let r = peer::dial_pooled(
                            &pool.peer,
                            &pool.psk,
                            &pool.timeouts,
                            pool.leg_buffer,
                        )
                        .await;
                        pool.in_flight.fetch_sub(1, Ordering::Relaxed);
                        r
                    });
                }
                let mut failed = false;
                loop {
                    // A dial to a dead peer whose SYNs are dropped waits out
                    // the connect timeout; stopping does not: the JoinSet's
                    // drop aborts the dials.
                    let r = tokio::select! {
                        r = dials.join_next() => match r {
                            Some(r) => r,
                            None => break,
                        },
                        () = stopped(&mut stop) => break 'maintain,
                    };
                    match r {
                        Ok(Ok(c)) => {
                            self.idle.lock().expect("pool lock").push_back(c);
                            self.count(PoolEvent::Refilled, 1);
                            self.pool_metrics.level(self.level());
                        }
                        Ok(Err(e)) => {
                            failed = true;
                            self.count(PoolEvent::DialFailure, 1);
                            let msg = e.to_string();
                            let mut last = self.last_error.lock().expect("pool lock");
                            if last.as_deref() != Some(msg.as_str()) {
                                warn!(peer = %self.peer.name, error = %msg, "pool refill failed");
                            }
                            *last = Some(msg);
                        }
                        Err(e) => {
                            failed = true;
                            self.count(PoolEvent::DialFailure, 1);
                            warn!(peer = %self.peer.name, error = %e, "pool dial task failed")
                        }
                    }
                }
                if failed {
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        () = stopped(&mut stop) => break,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
                backoff = MIN_BACKOFF;
                *self.last_error.lock().expect("pool lock") = None;
                debug!(peer = %self.peer.name, level = self.level(), "pool refilled");
                continue;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                () = stopped(&mut stop) => break,
            }
        }
        // Pooled connections close with the pool (FIN: they carry nothing).
        self.idle.lock().expect("pool lock").clear();
        info!(peer = %self.peer.name, "pool stopped");
    }

    /// A snapshot for the admin API.
    pub fn status(&self) -> api::Pool {
        api::Pool {
            level: self.level() as u64,
            in_flight: self.in_flight.load(Ordering::Relaxed) as u64,
            low: self.low() as u64,
            high: self.high() as u64,
            idle_seconds: self.peer.pool.idle.as_secs_f64(),
            taken: self.pool_metrics.count(PoolEvent::Taken),
            refilled: self.pool_metrics.count(PoolEvent::Refilled),
            dead: self.pool_metrics.count(PoolEvent::Dead),
            expired: self.pool_metrics.count(PoolEvent::Expired),
            misses: self.pool_metrics.count(PoolEvent::Miss),
            dial_failures: self.pool_metrics.count(PoolEvent::DialFailure),
            last_error: self.last_error(),
        }
    }
}

/// The pool for `peer` if `cfg` pools connections (it needs the key).
pub(crate) fn new_pool(
    cfg: &Config,
    peer: &Peer,
    families: &PoolFamilies,
) -> Option<Arc<PeerPool>> {
    match (&cfg.psk, cfg.accel.pool) {
        (Some(psk), true) => Some(PeerPool::new(
            peer.clone(),
            psk.clone(),
            cfg.timeouts.clone(),
            cfg.accel.relay_leg_buffer(),
            families.for_peer(&peer.name),
        )),
        _ => None,
    }
}
