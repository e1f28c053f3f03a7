//! The relay as a whole: binds listeners, installs interception, serves the
//! admin API, runs accept loops, and drains on shutdown.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

use crate::accel::{AccelName, AccelState};
use splitway_sys::bpf::SynWatch;
use splitway_sys::nfqueue::NfQueue;
use splitway_sys::tproxy::{
    InterceptSpec, Interception, PendingInterception, StrictRules, StrictSpec,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::accel::{self, AccelStatus, HostFacts};
use crate::access_log::AccessLog;
use crate::admin::{LogControl, RelayAdmin};
use crate::config::{Config, ListenMode, Switch};
use crate::error::RelayError;
use crate::ingress;
use crate::limits::{ConnLimiter, DESCRIPTOR_RESERVE, descriptor_cap};
use crate::loops::OwnListeners;
use crate::reload::Reloader;
use crate::route::RouteTable;
use crate::state::{ConnRegistry, Live};
use crate::strict::{self, Strict};
use crate::syn_start::{self, EarlyLegs};

// Their paths from before `state`, `shutdown` and `pool::new_pool` split out
// of this module (code written against the old layout keeps compiling).
pub(crate) use crate::pool::new_pool;
pub use crate::shutdown::stopped;
pub use crate::state::{Cached, Current, Shared};

/// How the process around the relay hands it what it owns.
#[derive(Default)]
pub struct RelayOptions {
    /// The config file, re-read by [`Reloader::reload`] (SIGHUP, `POST
    /// /reload`). Without it a reload is refused.
    pub config_path: Option<PathBuf>,
    /// Listening sockets inherited from the service manager (socket
    /// activation), used instead of binding the `[[listen]]` entry with the
    /// same address.
    pub inherited: Vec<splitway_sys::activation::Inherited>,
    /// Changes the log filter (`log.level` in `PUT /params`).
    pub log: Option<Arc<dyn LogControl>>,
    /// Called once every `[[listen]]` socket listens, before the slow half
    /// of the start (BPF loads, `nft`): clients' connections queue from
    /// then on instead of being refused. The relay binary tells the
    /// service manager (`STATUS=`); READY=1 still waits for the whole start.
    pub on_listening: Option<Box<dyn FnOnce() + Send>>,
}

/// A relay whose sockets are bound and whose rules are installed, ready to
/// run. Binding first means every startup error is reported before the
/// relay claims to be ready.
pub struct Relay {
    shared: Arc<Shared>,
    current: Arc<Current>,
    reloader: Arc<Reloader>,
    log: Option<Arc<dyn LogControl>>,
    syn_watch: Option<SynWatch>,
    /// Per `[[listen]]` entry, its accept sockets (one if inherited).
    listeners: Vec<Vec<TcpListener>>,
    admin: Option<AdminSocket>,
    /// `metrics`: the address that serves only `GET /metrics`.
    metrics_only: Option<TcpListener>,
    interceptions: Vec<Interception>,
    /// Sends the stop every accept loop and waiting leg ends on.
    stop: watch::Sender<bool>,
    /// Strict mode's SYN reader and its rules (removed before TPROXY's).
    strict: Option<(Arc<Strict>, Vec<StrictRules>)>,
}

impl Relay {
    pub async fn bind(cfg: Config) -> Result<Relay, RelayError> {
        Relay::bind_with(cfg, RelayOptions::default()).await
    }

    pub async fn bind_with(mut cfg: Config, options: RelayOptions) -> Result<Relay, RelayError> {
        interfaces_present(&cfg)?;
        let descriptor_cap = descriptor_cap_for(&cfg);
        let Starting {
            bound,
            congestion,
            detector,
        } = Starting::start(&cfg, options.inherited, options.on_listening);
        let (metrics, rooms) = metrics_with_rooms(cfg.peers.iter().map(|p| p.name.as_str()));
        let detector = detector.map(crate::beside::Beside::join);
        // BPF congestion controls before any socket could select them, and
        // the first error as before: theirs, strict mode's, the listeners'.
        let learned_window = finish_congestion(&mut cfg, congestion)?;
        let Bound {
            strict_queue,
            listeners,
            intercepting,
        } = bound?;
        let interceptions = finish_interception(intercepting)?;
        let mut host = HostFacts::read();
        host.learned_window = learned_window;
        let (admin, metrics_only) = bind_admin(&cfg).await?;
        let pools = cfg
            .peers
            .iter()
            .map(|p| new_pool(&cfg, p, &rooms.kept.pools))
            .collect();
        let (early, syn_watch) = start_early_syn(&cfg, rooms.early_syn, detector, &mut host);
        rooms
            .kept
            .turbo
            .install_at_start(&cfg)
            .map_err(|e| RelayError::Internal(e.to_string()))?;
        let zero_rtt = crate::zero_rtt::start(&cfg, rooms.kept.zero_rtt.clone());
        host.hello_register = zero_rtt.register;
        let strict = match (&early, strict_queue) {
            (Some(early), Some(queue)) => {
                Some(start_strict(&cfg, queue, early.clone(), rooms.strict)?)
            }
            _ => None,
        };
        let accept_paths = listeners
            .iter()
            .map(|set| set.iter().map(|_| Arc::default()).collect())
            .collect();
        let own = own_ports(&listeners, admin.as_ref(), metrics_only.as_ref());
        let host_addrs = crate::policy::HostAddrs::read();
        let plan = accel::plan(&cfg, &host);
        log_start(&host_addrs, &plan);
        let accel = Arc::new(AccelStatus::new(
            plan,
            rooms.accel,
            host.peer_fast_open(&cfg),
        ));
        let (stop, stopping) = watch::channel(false);
        let shared = Arc::new(Shared {
            access_log: AccessLog::start(cfg.access_log.as_ref())?,
            rooms: rooms.kept,
            stopping,
            accel,
            accept_paths,
            own: Arc::new(own),
            host: Arc::new(host_addrs),
            upstreams: Arc::default(),
            limiter: ConnLimiter::with_descriptor_cap(cfg.limits, descriptor_cap),
            live: Arc::new(Live::new(&cfg)),
            conns: Arc::new(ConnRegistry::default()),
            generation: 0,
            routes: RouteTable::new(&cfg.routes),
            paths: Arc::new(crate::paths::Paths::new(&cfg, rooms.paths)),
            cfg,
            metrics,
            started: Instant::now(),
            pools,
            early,
            hellos: zero_rtt.window,
        });
        let current = Arc::new(Current::new(shared.clone()));
        let reloader = Arc::new(Reloader::new(
            options.config_path,
            current.clone(),
            syn_watch.is_some(),
        ));
        Ok(Relay {
            shared,
            current,
            reloader,
            log: options.log,
            syn_watch,
            listeners,
            admin,
            metrics_only,
            interceptions,
            strict,
            stop,
        })
    }

    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|set| set.first()?.local_addr().ok())
            .collect()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Re-reads and applies the config file while the relay runs (SIGHUP).
    pub fn reloader(&self) -> Arc<Reloader> {
        self.reloader.clone()
    }

    /// Runs until `shutdown` completes (or the admin API asks for a drain),
    /// then stops accepting and lets open connections finish for up to
    /// `drain`.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()>,
        drain: Duration,
    ) -> Result<Stopped, RelayError> {
        let stop_tx = self.stop;
        let stop_rx = stop_tx.subscribe();
        // `POST /drain` ends the relay like a signal does.
        let (drain_tx, mut drain_rx) = watch::channel(false);
        // The admin API outlives the listeners: it answers during a drain.
        let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
        let mut tasks = spawn_accept_loops(self.listeners, &self.current, &stop_rx);
        // The metrics-only address lives as long as the admin API.
        let metrics_task = self.metrics_only.map(|l| {
            let handler = RelayAdmin::new(
                self.current.clone(),
                self.reloader.clone(),
                None,
                drain_tx.clone(),
            );
            spawn_metrics_only(
                l,
                self.shared.metrics.clone(),
                handler,
                admin_stop_rx.clone(),
            )
        });
        let admin_task = self.admin.map(|socket| {
            let admin = RelayAdmin::new(
                self.current.clone(),
                self.reloader.clone(),
                self.log.clone(),
                drain_tx,
            );
            spawn_admin(socket, self.shared.metrics.clone(), admin, admin_stop_rx)
        });
        if let (Some(early), Some(watch)) = (self.shared.early.clone(), self.syn_watch) {
            info!("early SYN on");
            tasks.push(tokio::spawn(early_syn_loop(
                early,
                watch,
                self.current.clone(),
                stop_rx.clone(),
            )));
        }
        if let Some((strict, _)) = &self.strict {
            info!(
                queue = strict::QUEUE,
                "strict mode on: SYNs are held until the server accepts"
            );
            tasks.push(tokio::spawn(
                strict.clone().serve(self.current.clone(), stop_rx.clone()),
            ));
        }
        self.reloader.start_pools(&self.shared.pools);
        tasks.extend(spawn_background(&self.current, &stop_rx));
        info!(name = %self.shared.cfg.name, "relay ready");

        let by_admin = tokio::select! {
            () = shutdown => false,
            () = stopped(&mut drain_rx) => {
                info!("drain requested through the admin API");
                true
            }
        };
        info!("shutting down: no new connections");
        let _ = stop_tx.send(true);
        let pools = self.reloader.stop();
        for t in tasks.into_iter().chain(pools) {
            let _ = t.await;
        }
        close_idle_pooled_legs(&self.current);
        // New SYNs are no longer held: they go the way TPROXY's drain
        // sends them. SYNs still held are dropped with the queue (their
        // clients retransmit).
        drop(self.strict.take());
        stop_intercepting_new(&mut self.interceptions);
        self.shared.rooms.turbo.clear();

        // Every open connection holds a limiter permit until its task ends
        // (or, still being admitted, an admission).
        let open = &self.shared.limiter;
        let cut = match tokio::time::timeout(drain, open.all_closed()).await {
            Ok(()) => 0,
            Err(_) => {
                let cut = open.open();
                warn!(
                    open = cut,
                    "drain deadline reached; closing remaining connections"
                );
                cut
            }
        };
        drop(self.interceptions);
        let _ = admin_stop_tx.send(true);
        for t in admin_task.into_iter().chain(metrics_task) {
            let _ = t.await;
        }
        Ok(Stopped { by_admin, cut })
    }
}

/// How a relay's run ended, for the last line its command logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// The admin API asked for the drain (else the shutdown future ended).
    pub by_admin: bool,
    /// Connections still open at the drain's deadline, then closed.
    pub cut: usize,
}

/// One accept loop per accept socket of every listener.
fn spawn_accept_loops(
    listeners: Vec<Vec<TcpListener>>,
    current: &Arc<Current>,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let shared = current.load();
    let mut tasks = Vec::new();
    for (i, set) in listeners.into_iter().enumerate() {
        let spec = &shared.cfg.listeners[i];
        info!(mode = spec.mode.as_str(), addr = %spec.addr, accept_sockets = set.len(), "listening");
        for (path, l) in set.into_iter().enumerate() {
            tasks.push(tokio::spawn(ingress::accept_loop(
                current.clone(),
                i,
                l,
                shared.accept_paths[i][path].clone(),
                stop.clone(),
            )));
        }
    }
    tasks
}

/// What runs beside the connections until `stop`: path and window
/// probes, the host's address list, giving the heap back when idle.
fn spawn_background(
    current: &Arc<Current>,
    stop: &watch::Receiver<bool>,
) -> [tokio::task::JoinHandle<()>; 4] {
    let shared = current.load();
    [
        tokio::spawn(crate::probe::probe_loop(current.clone(), stop.clone())),
        tokio::spawn(crate::probe::window_probe_loop(
            current.clone(),
            stop.clone(),
        )),
        tokio::spawn(refresh_host_addrs(shared.host.clone(), stop.clone())),
        tokio::spawn(release_heap_when_idle(shared.limiter.clone(), stop.clone())),
    ]
}

/// New connections stop being redirected with the listeners gone (they go
/// to their destination directly); packets of transparent connections
/// still open keep reaching their sockets until the drain ends, when the
/// rules go. Where that fails, the rules go now.
fn stop_intercepting_new(interceptions: &mut Vec<Interception>) {
    for i in interceptions.iter() {
        if let Err(e) = i.stop_new() {
            warn!(error = %e, "cannot stop intercepting new connections; removing the interception now, open transparent connections will break");
            interceptions.clear();
            return;
        }
    }
}

/// Starts a leg at each SYN the detector reports, until `stop` or until
/// the detector fails (early SYN is then off, and says why).
async fn early_syn_loop(
    early: Arc<EarlyLegs>,
    mut watch: SynWatch,
    current: Arc<Current>,
    mut stop: watch::Receiver<bool>,
) {
    // Unanswered legs are closed within a sweep of their
    // deadline (a few handshake round trips, ≥ 250 ms).
    let mut sweep = tokio::time::interval(Duration::from_millis(100));
    let mut snapshot = current.cached();
    // The detector's count of IPv6 packets it could not see into, read
    // once a second (a map read per CPU).
    let mut unwalked = 0;
    let mut ticks = 0u32;
    loop {
        tokio::select! {
            ev = watch.next() => match ev {
                Ok(ev) => {
                    let shared = current.refresh(&mut snapshot);
                    match &ev.options {
                        Some(o) => syn_start::on_option_syn(&early, shared, ev.client, ev.original_dst, o.as_slice(), ev.ttl),
                        None if syn_start::is_for_syn_option_listener(shared, ev.original_dst) => {}
                        None => syn_start::on_syn(&early, shared, ev.client, ev.original_dst, ev.ttl),
                    }
                }
                Err(e) => {
                    warn!(error = %e, "SYN detector failed; early SYN off from now on");
                    early.detector_died();
                    current.load().accel.set(
                        AccelName::EarlySyn,
                        AccelState::Unavailable,
                        format!("BPF SYN detector failed while running: {e}; legs start at accept"),
                    );
                    break;
                }
            },
            _ = sweep.tick() => {
                early.sweep();
                ticks = ticks.wrapping_add(1);
                if ticks.is_multiple_of(10)
                    && let Ok(now) = watch.ipv6_unwalked()
                {
                    early.ipv6_unwalked(now.saturating_sub(unwalked));
                    unwalked = now;
                }
            }
            () = stopped(&mut stop) => break,
        }
        for (prefix, near) in early.near_changes() {
            match watch.set_near(prefix, near) {
                Ok(()) => {
                    early.near_applied(prefix, near);
                    debug!(%prefix, near, "early SYN: client prefix sampled or reported again");
                }
                Err(e) => warn!(%prefix, error = %e, "early SYN: cannot update near prefixes"),
            }
        }
    }
    // Dropping the watch detaches the BPF program.
    drop(watch);
}

/// Serves `GET /metrics` (only) on `l` until `stop`.
fn spawn_metrics_only(
    l: TcpListener,
    metrics: Arc<Metrics>,
    handler: RelayAdmin,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    if let Ok(addr) = l.local_addr() {
        info!(%addr, "metrics listening (GET /metrics only)");
    }
    tokio::spawn(async move {
        let config = splitway_control::AdminConfig {
            metrics_only: true,
            ..splitway_control::AdminConfig::default()
        };
        let r = splitway_control::serve_with_config(
            l,
            metrics.served(),
            Arc::new(handler),
            config,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        )
        .await;
        if let Err(e) = r {
            warn!(error = %e, "metrics address stopped");
        }
    })
}

/// Serves the admin API on `socket` (once free, for a relay restarted
/// during a drain) until `stop`.
fn spawn_admin(
    socket: AdminSocket,
    metrics: Arc<Metrics>,
    admin: RelayAdmin,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let l = match socket {
            AdminSocket::Bound(l) => l,
            AdminSocket::Waiting(addr) => {
                let Some(l) = bind_when_free(addr, &mut stop).await else {
                    return;
                };
                l
            }
        };
        match l.local_addr() {
            Ok(addr) => info!(%addr, "admin API listening"),
            Err(e) => info!(error = %e, "admin API listening (its address unreadable)"),
        }
        let r = splitway_control::serve(l, metrics.served(), Arc::new(admin), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
        if let Err(e) = r {
            warn!(error = %e, "admin API stopped");
        }
    })
}

/// Idle pooled legs to the next relays would only wait to be closed at
/// exit: closed when the drain starts, so the next relays' drains need not
/// wait.
fn close_idle_pooled_legs(current: &Current) {
    let closed: usize = current
        .load()
        .pools
        .iter()
        .flatten()
        .map(|p| p.close_idle())
        .sum();
    if closed > 0 {
        info!(closed, "drain: closed the idle pooled legs");
    }
}

/// The ports actually bound (a configured port 0 got one): a destination
/// there is refused.
fn own_ports(
    listeners: &[Vec<TcpListener>],
    admin: Option<&AdminSocket>,
    metrics_only: Option<&TcpListener>,
) -> OwnListeners {
    OwnListeners::new(
        listeners
            .iter()
            .flatten()
            .filter_map(|l| l.local_addr().ok())
            .chain(admin.and_then(AdminSocket::addr))
            .chain(metrics_only.and_then(|l| l.local_addr().ok()))
            .map(|a| a.port()),
    )
}

/// Two sockets per split connection, plus pipes while data moves. Beyond
/// what the open-file limit holds, new connections are shed at accept (a
/// reset, counted) instead of failing half-way; 0: no cap known.
fn descriptor_cap_for(cfg: &Config) -> usize {
    match splitway_sys::sock::raise_nofile_limit() {
        Ok((soft, _)) => {
            let reserve = DESCRIPTOR_RESERVE
                + if cfg.accel.early_syn || cfg.accel.strict {
                    cfg.accel.early_syn_budget
                } else {
                    0
                }
                + cfg.peers.iter().map(|p| p.pool.high).sum::<usize>();
            let cap = descriptor_cap(soft, reserve);
            if cfg.limits.max_connections == 0 || cap < cfg.limits.max_connections {
                info!(
                    nofile = soft,
                    max_connections = cfg.limits.max_connections,
                    shed_above = cap,
                    "the open-file limit holds {cap} split connections; new ones beyond are shed (raise LimitNOFILE for more)"
                );
            }
            cap
        }
        Err(e) => {
            warn!(error = %e, "cannot read the open-file limit; no descriptor cap");
            0
        }
    }
}

/// An interface that is not there would intercept nothing, silently.
fn interfaces_present(cfg: &Config) -> Result<(), RelayError> {
    let missing = crate::preflight::interfaces(cfg, &crate::preflight::present_interfaces());
    if missing.is_empty() {
        Ok(())
    } else {
        Err(RelayError::Host(crate::preflight::HostIssues(missing)))
    }
}

/// Registers the config's BPF congestion controls on a thread of their
/// own: the learned-window algorithm first when relay legs would run it.
fn start_congestion(cfg: &Config) -> crate::congestion::Registering {
    let learning = cfg.accel.learned_window && crate::learned_window::wants_learned_window(cfg);
    crate::congestion::Registering::start(
        learning.then_some(crate::config::LEARNED_WINDOW_CC),
        cfg.congestion_keys(),
    )
}

/// Joins the registrations: relay legs take the learned-window algorithm
/// if it registered (why not goes to `/status`), and an algorithm the
/// config names that did not register fails the start.
fn finish_congestion(
    cfg: &mut Config,
    registering: crate::congestion::Registering,
) -> Result<Option<Result<Vec<String>, String>>, RelayError> {
    let (learning, named) = registering.join();
    let learned_window = cfg.accel.learned_window.then(|| match learning {
        Some(registered) => crate::learned_window::learned(cfg, registered),
        None => Ok(Vec::new()),
    });
    named?;
    Ok(learned_window)
}

/// The start's slow steps, under way once every listener listens.
struct Starting {
    bound: Result<Bound, RelayError>,
    congestion: crate::congestion::Registering,
    detector: Option<crate::beside::Beside<crate::early_syn::Detector>>,
}

impl Starting {
    /// Every listener listens first (#31): clients queue from then on, and
    /// `on_listening` runs. Then the slow steps start and overlap: the
    /// congestion controls register on a thread (even when a listener
    /// failed: their error is reported first), the detector loads on
    /// another (only once the listeners are bound: nothing would use it),
    /// `nft` runs as a process.
    fn start(
        cfg: &Config,
        inherited: Vec<splitway_sys::activation::Inherited>,
        on_listening: Option<Box<dyn FnOnce() + Send>>,
    ) -> Starting {
        let bound = bind_strict_and_listeners(cfg, inherited);
        if bound.is_ok()
            && let Some(listening) = on_listening
        {
            listening();
        }
        let congestion = start_congestion(cfg);
        let detector = bound
            .is_ok()
            .then(|| crate::early_syn::Detector::start(cfg))
            .flatten();
        Starting {
            bound: bound.and_then(|b| b.intercept(cfg)),
            congestion,
            detector,
        }
    }
}

/// Each listener's interception rules being installed, by its address.
type Intercepting = Vec<(SocketAddr, PendingInterception)>;

/// Strict mode's queue, each `[[listen]]` entry's accept sockets, and the
/// interception rules being installed ([`Bound::intercept`] starts them).
struct Bound {
    strict_queue: Option<NfQueue>,
    listeners: Vec<Vec<TcpListener>>,
    intercepting: Intercepting,
}

impl Bound {
    /// Starts each intercepting listener's rules (`nft` runs while the
    /// start goes on; [`finish_interception`] waits for it).
    fn intercept(mut self, cfg: &Config) -> Result<Bound, RelayError> {
        for (index, l) in cfg.listeners.iter().enumerate() {
            let Some(i) = &l.intercept else { continue };
            let spec = InterceptSpec {
                // One table per listener: two tproxy listeners (v4 and
                // v6-only) may both intercept.
                table: format!("splitway_{}_{index}", cfg.name.replace('-', "_")),
                v6_only: l.v6_only,
                interfaces: i.interfaces.clone(),
                ports: i.ports.clone(),
                listener: l.addr,
            };
            let pending = spec.start().map_err(|source| RelayError::Intercept {
                addr: l.addr,
                source,
            })?;
            self.intercepting.push((l.addr, pending));
        }
        Ok(self)
    }
}

/// Waits for each listener's interception rules; the first that failed
/// fails the start (the others are removed again).
fn finish_interception(intercepting: Intercepting) -> Result<Vec<Interception>, RelayError> {
    intercepting
        .into_iter()
        .map(|(addr, p)| {
            p.finish()
                .map_err(|source| RelayError::Intercept { addr, source })
        })
        .collect()
}

/// Strict mode's queue, then the listeners (their interception rules start
/// in [`Bound::intercept`], once every listener listens).
fn bind_strict_and_listeners(
    cfg: &Config,
    inherited: Vec<splitway_sys::activation::Inherited>,
) -> Result<Bound, RelayError> {
    // Strict mode's queue first: a host that cannot hold SYNs (or a queue
    // already taken) fails the start before anything is installed.
    let strict_queue = if cfg.accel.strict {
        Some(bind_strict_queue(cfg)?)
    } else {
        None
    };
    let listeners = bind_listeners(cfg, inherited)?;
    Ok(Bound {
        strict_queue,
        listeners,
        intercepting: Vec::new(),
    })
}

/// Each `[[listen]]` entry's accept sockets (the service manager's, where
/// it passed one).
fn bind_listeners(
    cfg: &Config,
    inherited: Vec<splitway_sys::activation::Inherited>,
) -> Result<Vec<Vec<TcpListener>>, RelayError> {
    let mut inherited = match_inherited(cfg, inherited)?;
    let mut listeners = Vec::new();
    for (index, l) in cfg.listeners.iter().enumerate() {
        let leg_buffer = cfg.accel.relay_leg_buffer();
        listeners.push(match inherited[index].take() {
            Some(sock) => {
                info!(mode = l.mode.as_str(), addr = %l.addr, "using the listening socket passed by the service manager");
                vec![ingress::adopt(l, sock, &cfg.accel, leg_buffer)?]
            }
            None => ingress::bind(
                l,
                ingress::accept_sockets(l),
                &cfg.accel,
                leg_buffer,
            )?,
        });
    }
    Ok(listeners)
}

/// The admin API's socket and the metrics-only one, where configured.
async fn bind_admin(
    cfg: &Config,
) -> Result<(Option<AdminSocket>, Option<TcpListener>), RelayError> {
    let admin = match cfg.admin {
        Some(a) => Some(match splitway_control::bind(a).await {
            Ok(l) => AdminSocket::Bound(l),
            // A relay restarted while the old one drains: the old one
            // keeps answering there until it exits; this one serves
            // from then on instead of refusing to start.
            Err(splitway_control::ControlError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse =>
            {
                warn!(addr = %a, "admin API address in use (by a relay still draining?): the admin API starts once it is free");
                AdminSocket::Waiting(a)
            }
            Err(e) => return Err(e.into()),
        }),
        None => None,
    };
    let metrics_only = match cfg.metrics {
        Some(a) => Some(splitway_control::bind(a).await?),
        None => None,
    };
    Ok((admin, metrics_only))
}

/// The early-SYN legs and, unless strict mode holds the SYNs itself, the
/// BPF detector on the intercept interfaces (`detector`, loaded while the
/// rules were installed); without BPF support the relay says so once (in `host`)
/// and runs without it.
fn start_early_syn(
    cfg: &Config,
    metrics: crate::early_syn::EarlySynMetrics,
    detector: Option<crate::early_syn::Detector>,
    host: &mut HostFacts,
) -> (Option<Arc<EarlyLegs>>, Option<SynWatch>) {
    let legs = |metrics| {
        EarlyLegs::new(
            cfg.accel.early_syn_budget,
            cfg.accel.early_syn_prefix_budget,
            cfg.accel.early_syn_expiry,
            metrics,
        )
    };
    if cfg.accel.strict {
        // Strict mode sees every SYN in its queue: no BPF detector.
        if cfg.accel.early_syn {
            info!(
                "accel.strict holds SYNs and starts their legs itself; the early-SYN detector is not attached"
            );
        }
        return (Some(Arc::new(legs(metrics))), None);
    }
    let Some(detector) = detector else {
        return (None, None);
    };
    match detector.attached {
        Ok(w) => {
            host.early_syn = Some(Ok(format!(
                "BPF SYN detector attached on {} ({:?})",
                detector.interfaces.join(", "),
                w.hook()
            )));
            // `early_syn = true` starts every leg it can; `auto` leaves
            // out the clients it cannot help.
            let early = if cfg.accel.requested.early_syn == Switch::Auto {
                legs(metrics).learning_near_clients()
            } else {
                legs(metrics)
            };
            (Some(Arc::new(early)), Some(w))
        }
        Err(e) => {
            host.early_syn = Some(Err(format!(
                "BPF SYN detector did not attach: {}",
                accel::bpf_hint(&e.to_string())
            )));
            (None, None)
        }
    }
}

/// What the relay refuses as this host's addresses, and each
/// acceleration's state, logged once at start.
fn log_start(host_addrs: &crate::policy::HostAddrs, plan: &[accel::Entry]) {
    let addresses: Vec<String> = host_addrs
        .snapshot()
        .iter()
        .map(IpAddr::to_string)
        .collect();
    info!(addresses = %addresses.join(", "), "this host's addresses: refused as destinations to remote clients unless policy.allow_host_addresses");
    for e in plan {
        match e.state {
            AccelState::Unavailable => {
                warn!(accel = %e.name, requested = e.requested, reason = %e.reason, "acceleration unavailable")
            }
            state => {
                info!(accel = %e.name, requested = e.requested, %state, reason = %e.reason, "acceleration")
            }
        }
    }
}

/// What the rooms that declare their own metric families hand the relay:
/// the handles they count through.
pub struct RoomMetrics {
    accel: crate::accel::AccelMetrics,
    strict: crate::strict::StrictMetrics,
    early_syn: crate::early_syn::EarlySynMetrics,
    paths: crate::paths::PathMetrics,
    /// What `Shared` keeps for the relay's lifetime.
    kept: Arc<crate::rooms::Rooms>,
}

/// The relay's registry with every family declared (splitway-control's
/// and the rooms'), the series of the peers named `peers` at zero, and the
/// rooms' handles: what `/metrics` exports.
pub fn metrics_with_rooms<'a>(
    peers: impl IntoIterator<Item = &'a str>,
) -> (Arc<Metrics>, RoomMetrics) {
    let mut metrics = Metrics::builder();
    let r = metrics.registry();
    let kept = crate::rooms::Rooms {
        lossy: crate::loss_isolation::LossyClients::new(
            crate::loss_isolation::LossIsolationMetrics::register(r),
        ),
        learned: crate::learned_window::LearnedWindows::new(
            crate::learned_window::LearnedWindowMetrics::register(r),
            crate::learned_window::WindowProbeMetrics::register(r),
        ),
        pools: crate::pool::PoolFamilies::register(r),
        proxy_protocol: crate::proxy_header::ProxyProtocolMetrics::register(r),
        turbo: crate::turbo::TurboRoutes::default(),
        zero_rtt: crate::zero_rtt::ZeroRttMetrics::register(r),
    };
    let rooms = RoomMetrics {
        accel: crate::accel::AccelMetrics::register(r),
        strict: crate::strict::StrictMetrics::register(r),
        early_syn: crate::early_syn::EarlySynMetrics::register(r),
        paths: crate::paths::PathMetrics::register(r),
        kept: Arc::new(kept),
    };
    let metrics = Arc::new(metrics.build());
    for peer in peers {
        metrics.register_peer(peer);
        rooms.kept.pools.register_peer(peer);
    }
    (metrics, rooms)
}

/// Binds strict mode's queue, then installs its rules for each
/// intercepting listener. Any failure stops the relay from starting:
/// strict was asked for explicitly, and running without it would break
/// its promise silently.
fn start_strict(
    cfg: &Config,
    queue: NfQueue,
    early: Arc<EarlyLegs>,
    outcomes: crate::strict::StrictMetrics,
) -> Result<(Arc<Strict>, Vec<StrictRules>), RelayError> {
    let mut rules = Vec::new();
    for (index, l) in cfg.listeners.iter().enumerate() {
        let Some(i) = &l.intercept else { continue };
        let (v4, v6) = match l.addr {
            SocketAddr::V4(_) => (true, false),
            SocketAddr::V6(a) => (a.ip().is_unspecified() && !l.v6_only, true),
        };
        let spec = StrictSpec {
            name: format!("swstrict_{index}_{:08x}", name_hash(&cfg.name)),
            interfaces: i.interfaces.clone(),
            ports: i.ports.clone(),
            queue: strict::QUEUE,
            v4,
            v6,
        };
        // Dropping `rules` on an error removes what was installed.
        rules.push(
            spec.install()
                .map_err(|e| strict_error("cannot install rules", e))?,
        );
    }
    let strict = Strict::new(
        queue,
        cfg.accel.early_syn_budget,
        cfg.accel.early_syn_expiry,
        early,
        outcomes,
    );
    Ok((strict, rules))
}

fn strict_error(what: &str, e: splitway_sys::SysError) -> RelayError {
    RelayError::Strict(format!(
        "{what}: {e} (strict mode needs the kernel's NFQUEUE and iptables/ip6tables)"
    ))
}

fn bind_strict_queue(cfg: &Config) -> Result<NfQueue, RelayError> {
    // The kernel queue holds at most the budget (plus retransmits in
    // flight); beyond it SYNs are dropped, never let through.
    let max_len = u32::try_from(cfg.accel.early_syn_budget.saturating_mul(2)).unwrap_or(u32::MAX);
    NfQueue::bind(strict::QUEUE, max_len).map_err(|e| strict_error("cannot bind NFQUEUE", e))
}

/// A stable short hash of the relay's name for rule names (iptables
/// chains are at most 28 characters).
fn name_hash(name: &str) -> u32 {
    // FNV-1a: stable across runs, unlike the std hasher.
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Reads the host's addresses again every [`HostAddrs::REFRESH`]: one
/// getifaddrs per period instead of one per connection, so an address
/// added at run time (DHCP, SLAAC) is refused at most that much later.
async fn refresh_host_addrs(host: Arc<crate::policy::HostAddrs>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(crate::policy::HostAddrs::REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = host.refresh() {
                    warn!(error = %e, "cannot read this host's addresses; keeping the previous list");
                }
            }
            () = stopped(&mut stop) => break,
        }
    }
}

/// Once most connections of a busy spell have closed, hands the heap glibc
/// kept back to the kernel, so the relay's RSS returns near its idle size
/// instead of staying at its peak (`docs/reliability.md`, soak and
/// flood). Not only at zero connections: pooled legs keep a relay from
/// ever being idle.
async fn release_heap_when_idle(limiter: Arc<ConnLimiter>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TRIM_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut trim = TrimTrigger::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => return,
        }
        let open = limiter.open();
        if let Some(peak) = trim.observe(open) {
            let started = Instant::now();
            let released = splitway_sys::mem::release_free_heap();
            debug!(
                released,
                peak,
                open,
                took_us = started.elapsed().as_micros() as u64,
                "connections fell well below their peak: free heap returned to the kernel"
            );
        }
    }
}

/// How often the connection count is compared with its peak.
const TRIM_CHECK: Duration = Duration::from_secs(2);

/// When to trim the heap: the open connections fell to at most half their
/// peak since the last trim, by at least [`TrimTrigger::MIN_CLOSED`]
/// (or to zero). A trim walks every free chunk (milliseconds on a large
/// heap), so a steady load, or a few connections coming and going, never
/// triggers one; a flood's end does, within [`TRIM_CHECK`].
#[derive(Default)]
struct TrimTrigger {
    peak: usize,
}

impl TrimTrigger {
    const MIN_CLOSED: usize = 256;

    /// Takes the open count; returns the peak when it is time to trim.
    fn observe(&mut self, open: usize) -> Option<usize> {
        self.peak = self.peak.max(open);
        let peak = self.peak;
        let fell = open <= peak / 2 && peak - open >= Self::MIN_CLOSED;
        if fell || (open == 0 && peak > 0) {
            self.peak = open;
            return Some(peak);
        }
        None
    }
}

/// The listener modes a config uses, for start-up logs.
pub fn modes(cfg: &Config) -> Vec<ListenMode> {
    cfg.listeners.iter().map(|l| l.mode).collect()
}

/// Pairs each inherited socket with the `[[listen]]` entry of its address
/// (`None` where the relay binds itself). A socket no entry wants is an
/// error: the unit and the config disagree, and serving part of what the
/// operator asked for would hide it.
fn match_inherited(
    cfg: &Config,
    inherited: Vec<splitway_sys::activation::Inherited>,
) -> Result<Vec<Option<std::net::TcpListener>>, RelayError> {
    let mut slots: Vec<Option<std::net::TcpListener>> =
        cfg.listeners.iter().map(|_| None).collect();
    for i in inherited {
        let fd = i.fd;
        let addr = i.listener.local_addr().map_err(|e| RelayError::Inherited {
            addr: "?".into(),
            fd,
            reason: format!("getsockname: {e}"),
        })?;
        let addr = SocketAddr::new(addr.ip().to_canonical(), addr.port());
        let fail = |reason: String| RelayError::Inherited {
            addr: addr.to_string(),
            fd,
            reason,
        };
        let Some(index) = cfg.listeners.iter().position(|l| l.addr == addr) else {
            return Err(fail(format!(
                "no [[listen]] entry has this addr (configured: {})",
                cfg.listeners
                    .iter()
                    .map(|l| l.addr.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if cfg.listeners[index].mode.intercepts() {
            return Err(fail(
                "tproxy listeners need IP_TRANSPARENT before bind: let the relay bind them".into(),
            ));
        }
        if slots[index].is_some() {
            return Err(fail("passed twice".into()));
        }
        slots[index] = Some(i.listener);
    }
    Ok(slots)
}

/// The admin API's socket: bound at start, or its address to bind once a
/// draining predecessor lets go of it.
enum AdminSocket {
    Bound(TcpListener),
    Waiting(SocketAddr),
}

impl AdminSocket {
    fn addr(&self) -> Option<SocketAddr> {
        match self {
            AdminSocket::Bound(l) => l.local_addr().ok(),
            AdminSocket::Waiting(a) => Some(*a),
        }
    }
}

/// Binds `addr` as soon as it is free (every 250 ms); `None` if the relay
/// stops first or the bind fails for another reason (logged).
async fn bind_when_free(addr: SocketAddr, stop: &mut watch::Receiver<bool>) -> Option<TcpListener> {
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
            () = stopped(stop) => return None,
        }
        match splitway_control::bind(addr).await {
            Ok(l) => return Some(l),
            Err(splitway_control::ControlError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => {
                warn!(error = %e, "admin API not started");
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TrimTrigger;

    /// A flood's end triggers one trim though pooled legs stay open; a
    /// steady load or a small dip does not, and going idle still does.
    #[test]
    fn trims_when_connections_fall_well_below_their_peak() {
        let mut t = TrimTrigger::default();
        for open in [8, 8, 300, 5_000, 4_000, 3_000] {
            assert_eq!(t.observe(open), None, "at {open}");
        }
        assert_eq!(t.observe(8), Some(5_000), "flood over, 8 pooled legs");
        assert_eq!(t.observe(8), None, "once");
        for open in [200, 150, 100, 50] {
            assert_eq!(t.observe(open), None, "a small dip at {open}");
        }
        assert_eq!(t.observe(0), Some(200), "idle");
        assert_eq!(t.observe(0), None);
    }
}
