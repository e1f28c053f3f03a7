//! The state a connection runs on: one config snapshot (`Shared`) and
//! what is built from it, the live values and the registry of open
//! connections every snapshot shares, and the swap a reload does
//! (`Current`). Nothing here dials, accepts or forwards: modules that take
//! a `&Shared` import this one, never the other way round.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::metrics::{Metrics, Mode};
use splitway_api as api;

use crate::accel_state::{AccelName, AccelState, AccelStatus};
use splitway_proto::Destination;

use crate::config::{Config, ListenMode, Via};
use crate::early_syn::EarlyStarts;
use crate::forward::Counters;
use crate::limits::ConnLimiter;
use crate::loops::OwnListeners;
use crate::next_leg::Started;
use crate::paths::{self};
use crate::pool::PeerPool;
use crate::route::RouteTable;
use crate::zero_rtt::HelloWindow;

/// What a connection runs on: one snapshot of the config and what is built
/// from it (routes, pools), plus handles to the state every snapshot shares
/// (metrics, limits, registry). A reload builds a new snapshot; connections
/// keep the one they started with.
pub struct Shared {
    pub cfg: Config,
    pub routes: RouteTable,
    pub metrics: Arc<Metrics>,
    pub started: Instant,
    /// One pool per peer (same index as `cfg.peers`), when pooling is on.
    pub pools: Vec<Option<Arc<PeerPool>>>,
    /// Legs started at the client's SYN, when early SYN is on and works.
    pub early: Option<Arc<EarlyStarts<Started>>>,
    pub limiter: Arc<ConnLimiter>,
    /// Values tunable at run time (admin API `PUT /params`).
    pub live: Arc<Live>,
    /// Open connections, for `GET /connections`.
    pub conns: Arc<ConnRegistry>,
    /// 0 for the config the relay started with, +1 per applied reload.
    pub generation: u64,
    /// Replay window for 0-RTT peer Hellos, when `[accel] zero_rtt` is on.
    pub hellos: Option<Arc<HelloWindow>>,
    /// Per listener, what each of its accept sockets took (`/status`).
    pub accept_paths: Arc<[Vec<Arc<AcceptCount>>]>,
    /// This relay's listening ports: a destination there is refused.
    pub own: Arc<OwnListeners>,
    /// This host's interface addresses (`[policy]`'s default deny-list),
    /// refreshed in the background.
    pub host: Arc<crate::policy::HostAddrs>,
    /// Upstream relays that authenticated here (nesting guard).
    pub upstreams: Arc<crate::policy::KnownRelays>,
    /// Each acceleration's effective state (`/status`, `/metrics`).
    pub accel: Arc<AccelStatus>,
    /// Measured candidates and each route's choice (`GET /routes`).
    pub paths: Arc<crate::paths::Paths>,
    /// The rooms' state and metrics, shared by a reload's successor.
    pub rooms: Arc<crate::rooms::Rooms>,
    /// `[access_log]`, opened at start (a reload keeps it).
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// Turns true when the relay stops accepting (a drain): what waits
    /// for a new connection's first bytes (a pooled leg before its header)
    /// ends then, so upstream relays dial elsewhere or afresh.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

/// The snapshot new connections start on, swapped by a reload.
///
/// Accept paths keep a [`Cached`] copy and check `generation` (one atomic
/// load, no lock, no shared write) per connection; the lock is taken only
/// after a reload, and by the admin API.
pub struct Current {
    snapshot: std::sync::RwLock<Arc<Shared>>,
    /// Bumped after each store; readers seeing a new value re-load.
    generation: AtomicU64,
}

/// A reader's copy of the current snapshot and the generation it saw.
pub struct Cached {
    seen: u64,
    shared: Arc<Shared>,
}

impl Cached {
    pub fn get(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Current {
    pub fn new(shared: Arc<Shared>) -> Current {
        Current {
            snapshot: std::sync::RwLock::new(shared),
            generation: AtomicU64::new(0),
        }
    }

    pub fn load(&self) -> Arc<Shared> {
        // Only a pointer swap happens under the lock: it cannot be poisoned
        // half-way.
        self.snapshot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn cached(&self) -> Cached {
        // Generation first: a store racing with us makes the next
        // `refresh` load again, never keeps an old snapshot for good.
        let seen = self.generation.load(Ordering::Acquire);
        Cached {
            seen,
            shared: self.load(),
        }
    }

    /// The current snapshot, re-loaded into `cached` if a store happened
    /// since it was taken. Once `store` has returned, every later call
    /// returns the stored snapshot (or a newer one).
    pub fn refresh<'a>(&self, cached: &'a mut Cached) -> &'a Arc<Shared> {
        if self.generation.load(Ordering::Acquire) != cached.seen {
            *cached = self.cached();
        }
        &cached.shared
    }

    pub(crate) fn store(&self, shared: Arc<Shared>) {
        let mut slot = self
            .snapshot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = shared;
        // Under the lock: stores are ordered, and a reader that sees this
        // generation finds this snapshot (or a newer one) behind the lock.
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl Shared {
    /// A snapshot for `cfg` sharing this one's run-time state.
    pub(crate) fn successor(&self, cfg: Config, pools: Vec<Option<Arc<PeerPool>>>) -> Shared {
        Shared {
            routes: RouteTable::new(&cfg.routes),
            // Measurements start afresh: peer indices may have changed.
            paths: Arc::new(crate::paths::Paths::new(&cfg, self.paths.metrics().clone())),
            cfg,
            pools,
            metrics: self.metrics.clone(),
            started: self.started,
            early: self.early.clone(),
            limiter: self.limiter.clone(),
            live: self.live.clone(),
            conns: self.conns.clone(),
            generation: self.generation + 1,
            hellos: self.hellos.clone(),
            accept_paths: self.accept_paths.clone(),
            own: self.own.clone(),
            host: self.host.clone(),
            upstreams: self.upstreams.clone(),
            accel: self.accel.clone(),
            access_log: self.access_log.clone(),
            rooms: self.rooms.clone(),
            stopping: self.stopping.clone(),
        }
    }
}

impl Shared {
    /// Where a fresh peer leg's 0-RTT Hello counts its outcome: `Some` when
    /// such legs open with one (`[accel] zero_rtt`).
    pub fn hello_dials(&self) -> Option<&crate::zero_rtt::ZeroRttMetrics> {
        self.cfg.accel.zero_rtt.then_some(&self.rooms.zero_rtt)
    }

    /// An upstream relay authenticated from `addr`: turbo-start for the
    /// return direction too (`turbo::TurboRoutes::learn_upstream`).
    pub fn learn_upstream(&self, addr: IpAddr) {
        self.rooms.turbo.learn_upstream(&self.cfg, addr);
    }
}

impl Shared {
    /// How long an explicit client waits for the chain's Reply: the next
    /// relays may each spend up to their connect timeout.
    pub fn reply_timeout(&self) -> Duration {
        self.cfg.timeouts.connect * 2 + self.cfg.timeouts.handshake
    }

    /// `GET /status` (the admin handler adds the log level).
    pub fn status(&self) -> api::Status {
        let via = |v: &Via| match v {
            Via::Direct => "direct".to_owned(),
            Via::Peer(i) => self.cfg.peers[*i].name.clone(),
        };
        api::Status {
            name: self.cfg.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            config_generation: self.generation,
            workers: tokio::runtime::Handle::try_current()
                .map_or(0, |h| h.metrics().num_workers() as u64),
            listeners: self
                .cfg
                .listeners
                .iter()
                .enumerate()
                .map(|(i, l)| self.listener_status(i, l))
                .collect(),
            peers: self
                .cfg
                .peers
                .iter()
                .enumerate()
                .map(|(i, p)| api::Peer {
                    name: p.name.clone(),
                    addr: p.addr.to_string(),
                    congestion: p.tuning.congestion.clone(),
                    pool: self.pools[i].as_ref().map(|pool| pool.status()),
                })
                .collect(),
            routes: self
                .routes
                .routes()
                .iter()
                .map(|r| api::Route {
                    dst: r.dst.to_string(),
                    via: via(&r.via),
                    proxy_protocol: r.reveal.proxy_protocol.map(|v| v.label().to_owned()),
                    source: if r.reveal.client_source {
                        "client"
                    } else {
                        "relay"
                    }
                    .to_owned(),
                })
                .collect(),
            early_syn: self.early.as_ref().map(|e| e.status()),
            // Effective states: what runs, not what the file asked for.
            accel: self.accel.api(),
            congestion_controls: crate::congestion::status(),
            learned_windows: crate::learned_window::LearnedWindows::status(&self.cfg),
            features: api::Features {
                data_path: format!("{:?}", self.cfg.forwarding.data_path).to_lowercase(),
                early_syn: self.accel.state(AccelName::EarlySyn) == AccelState::Active,
                strict: self.cfg.accel.strict,
                pool: self.accel.state(AccelName::Pool) == AccelState::Active,
                tfo: self.accel.state(AccelName::TfoClient) == AccelState::Active,
                zero_rtt: self.cfg.accel.zero_rtt.then_some(api::ZeroRtt {
                    window_ms: self.cfg.accel.zero_rtt_window.as_millis() as u64,
                }),
                turbo_start: self.cfg.accel.turbo.map(|t| api::TurboStart {
                    initcwnd: t.initcwnd,
                    initrwnd: t.initrwnd,
                    buffer: t.buffer as u64,
                    routes: self.rooms.turbo.destinations(),
                }),
            },
            connections_open: self.limiter.open() as u64,
            limits: api::Limits {
                max_connections: self.cfg.limits.max_connections as u64,
                per_client: self.cfg.limits.per_client as u64,
            },
            connections_active: api::ConnectionsActive {
                tproxy: self.metrics.active_count(Mode::Tproxy),
                socks5: self.metrics.active_count(Mode::Socks5),
                http_connect: self.metrics.active_count(Mode::HttpConnect),
                peer: self.metrics.active_count(Mode::Peer),
            },
            log_level: None,
        }
    }
}

impl Shared {
    /// One `[[listen]]` entry of `/status`; `i` its index.
    fn listener_status(&self, i: usize, l: &crate::config::Listener) -> api::Listener {
        api::Listener {
            mode: l.mode.as_str().to_owned(),
            addr: l.addr.to_string(),
            intercept: l.intercept.as_ref().map(|i| api::Intercept {
                interfaces: i.interfaces.clone(),
                ports: i.ports.clone(),
            }),
            accept_proxy_protocol: l
                .accept_proxy_protocol
                .iter()
                .map(|n| n.to_string())
                .collect(),
            // One entry per accept socket: connections it accepted.
            accept_paths: self.accept_paths.get(i).map(|paths| {
                paths
                    .iter()
                    .map(|p| api::AcceptPath { accepted: p.get() })
                    .collect()
            }),
            users: l.users.as_ref().map(|u| u.len()),
        }
    }
}

impl Shared {
    /// What path choice reads besides its own measurements.
    pub fn path_inputs(&self) -> paths::Inputs<'_> {
        paths::Inputs {
            routes: &self.routes,
            pools: &self.pools,
        }
    }
}

/// Connections one accept path took, for `/status`. Written by its accept
/// task only, on a cache line of its own.
#[derive(Default)]
#[repr(align(128))]
pub struct AcceptCount(AtomicU64);

impl AcceptCount {
    pub(crate) fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Values that `PUT /params` may change while connections run. A reload
/// sets them to the config file's values: the file wins over earlier
/// `PUT /params` changes.
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

    pub(crate) fn set_idle(&self, idle: Duration) {
        self.idle_ms.store(idle.as_millis() as u64, Relaxed);
    }

    pub(crate) fn set_early_syn(&self, on: bool) {
        self.early_syn.store(on, Relaxed);
    }
}

const SHARDS: usize = 16;

/// One entry per open connection, so kept small: 96 bytes with its key
/// (112 with the mode as a `&str` and the start as an `Instant`), plus
/// its `ConnLive`.
struct ConnInfo {
    mode: ListenMode,
    /// What the session updates while it runs, and its start.
    live: Arc<ConnLive>,
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

/// What an open connection's session tells the registry as it goes.
#[derive(Default)]
pub struct ConnLive {
    /// Milliseconds since the registry was created.
    started_ms: u64,
    /// Bytes forwarded so far, each way.
    pub counters: Counters,
    /// Where its next leg goes, once it is up.
    next_hop: OnceLock<SocketAddr>,
    /// Loss isolation: where the client leg's verdict counts from, once
    /// its start-up is over.
    pub loss_since: OnceLock<crate::loss_isolation::Since>,
}

impl ConnLive {
    /// The next leg is up, to `addr` (a peer relay or the server).
    pub fn set_next_hop(&self, addr: SocketAddr) {
        // Set once per connection: a second call has nothing new to say.
        let _ = self.next_hop.set(addr);
    }

    /// The next hop as `/routes` names it: a peer relay's name, or
    /// `direct` for a server leg; `None` while no leg is up.
    pub fn next_hop(&self, cfg: &Config) -> Option<String> {
        let addr = *self.next_hop.get()?;
        Some(match cfg.peers.iter().find(|p| p.addr == addr) {
            Some(peer) => peer.name.clone(),
            None => "direct".to_owned(),
        })
    }
}

/// Removes its connection from the registry when dropped.
pub struct Registered {
    shared: Arc<Shared>,
    id: u64,
    live: Arc<ConnLive>,
}

impl Registered {
    pub fn live(&self) -> &ConnLive {
        &self.live
    }
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
        let live = Arc::new(ConnLive {
            started_ms,
            ..ConnLive::default()
        });
        self.shard(id).lock().expect("registry lock").insert(
            id,
            ConnInfo {
                mode,
                live: live.clone(),
                client,
                dst,
            },
        );
        Registered { shared, id, live }
    }

    /// Counts by mode and up to `sample` connections, oldest first, with
    /// their next hop (named by `cfg`'s peers) and bytes so far.
    pub fn snapshot(&self, sample: usize, cfg: &Config) -> api::Connections {
        let mut by_mode: BTreeMap<String, u64> = BTreeMap::new();
        let mut all = Vec::new();
        for shard in &self.shards {
            for (id, c) in shard.lock().expect("registry lock").iter() {
                *by_mode.entry(c.mode.as_str().to_owned()).or_default() += 1;
                let dst = c.dst.to_string();
                all.push((
                    c.live.started_ms,
                    *id,
                    c.mode,
                    c.client,
                    dst,
                    c.live.clone(),
                ));
            }
        }
        let total = all.len();
        all.sort_by_key(|c| c.0);
        let now_ms = self.epoch.elapsed().as_secs_f64() * 1e3;
        let sample = all
            .into_iter()
            .take(sample)
            .map(
                |(started_ms, id, mode, client, dst, live)| api::Connection {
                    id: format!("{id:016x}"),
                    mode: mode.as_str().to_owned(),
                    state: "open".to_owned(),
                    client: client.to_string(),
                    dst,
                    age_seconds: (now_ms - started_ms as f64).max(0.0) / 1e3,
                    via: live.next_hop(cfg),
                    bytes_to_server: Some(live.counters.to_server()),
                    bytes_to_client: Some(live.counters.to_client()),
                },
            )
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
                live: Arc::default(),
                client,
                dst,
            },
        );
        let cfg = "name = \"r\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n[[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n";
        let snap = registry.snapshot(10, &Config::parse_str(cfg).unwrap());
        assert_eq!(snap.total, 1);
        assert_eq!(snap.by_mode["socks5"], 1);
        let entry = &snap.sample[0];
        assert_eq!(entry.mode, "socks5");
        assert_eq!(entry.client, "192.0.2.1:4000");
        assert_eq!(entry.dst, "198.51.100.2:443");
        assert!(entry.age_seconds >= 0.0);
        assert_eq!(entry.via, None, "no leg up yet");
        assert_eq!(entry.bytes_to_server, Some(0));
    }
}
