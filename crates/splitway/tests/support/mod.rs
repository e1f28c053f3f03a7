//! Harness for the relay integration tests: a chain of network namespaces
//! (client — relay… — server) joined by veth pairs, the real `splitway`
//! binary started inside the relay namespaces, and helpers for sha256-checked
//! transfers, admin metrics and raw protocol clients.
//!
//! Every namespace, process and temp file belongs to a [`Lab`] and is removed
//! when it drops, on success and on panic alike.

// Each test binary (24 include this module) uses a different part of the
// harness and of its re-exports; every one leaves some of both unused.
#![expect(
    dead_code,
    unused_imports,
    reason = "each test binary uses a different part of the harness"
)]

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use sha2::{Digest as _, Sha256};
pub use splitway_lab::testbed::config::{
    self as testbed, DataPath, Intercept, ListenMode, RawAccel, RawConfig, RawForwarding,
    RawLimits, RawListener, RawPeer, RawPolicy, RawPool, RawRoute, RawTimeouts, RawTls, RawTuning,
    RawTurbo, RawVia,
};
use splitway_lab::testbed::{chain, probe};
use splitway_sys::netns::{self, Netns};

mod emulated;
mod nginx;
mod proxy_clients;
pub use emulated::*;
pub use nginx::*;
pub use proxy_clients::*;

/// The binary under test.
pub const SPLITWAY: &str = env!("CARGO_BIN_EXE_splitway");

/// Name prefix of every namespace and temp dir this suite creates.
pub const PREFIX: &str = "swt";

/// Port the tests' own TCP servers listen on (intercepted by the entry relay).
pub const SERVER_PORT: u16 = 5001;
/// Intercepted port on which nothing listens.
pub const REFUSED_PORT: u16 = 5009;
/// Port of the relays' TPROXY listeners.
pub const TPROXY_PORT: u16 = 7000;
/// Port of the relays' peer listeners.
pub const PEER_PORT: u16 = 7100;
pub const SOCKS_PORT: u16 = 1080;
pub const HTTP_CONNECT_PORT: u16 = 3128;

pub const MIB: u64 = 1024 * 1024;

pub use splitway_lab::testbed::chain::{EAST_IF, WEST_IF, link_v4, link_v6};

// ---------------------------------------------------------------------------
// Probe-then-skip
// ---------------------------------------------------------------------------

/// Whether namespaces can be used here. Without them each test returns early
/// after printing why, unless `SPLITWAY_REQUIRE_NETNS=1` (make test, CI), in
/// which case it fails.
pub fn netns_usable() -> bool {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    let probe = PROBE.get_or_init(|| {
        if !probe::is_root() {
            return Err("not running as root".into());
        }
        netns::remove_stale(PREFIX);
        remove_stale_temp_dirs();
        probe::netns(PREFIX)
    });
    match probe {
        Ok(()) => true,
        Err(reason) => {
            if std::env::var("SPLITWAY_REQUIRE_NETNS").as_deref() == Ok("1") {
                panic!("SPLITWAY_REQUIRE_NETNS=1 but namespaces are unusable: {reason}");
            }
            eprintln!("skipping: {reason}");
            false
        }
    }
}

/// Returns early from a test when namespaces are unusable (see [`netns_usable`]).
#[macro_export]
macro_rules! require_netns {
    () => {
        if !$crate::support::netns_usable() {
            return;
        }
    };
}

/// Serialises the bulk transfers of one test binary: on 2 shared cores two
/// 100 MiB runs side by side only make both slow enough to hit deadlines.
pub fn heavy_lock() -> MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------

/// A point in time a test must finish by.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    pub fn after(budget: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + budget,
        }
    }

    /// Time left; panics once the deadline has passed.
    pub fn remaining(&self, what: &str) -> Duration {
        let left = self.at.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "deadline passed while {what}");
        left
    }

    /// The earlier of two deadlines.
    pub fn min(self, other: Deadline) -> Deadline {
        Deadline {
            at: self.at.min(other.at),
        }
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.at
    }
}

/// Polls `check` until it returns `Some`, or `None` at the deadline. The
/// pause between polls only bounds CPU use; readiness is what ends the wait.
pub fn poll_until<T>(deadline: Deadline, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        let left = deadline.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Like [`poll_until`], panicking with `what` at the deadline.
pub fn wait_until<T>(deadline: Deadline, what: &str, check: impl FnMut() -> Option<T>) -> T {
    poll_until(deadline, check).unwrap_or_else(|| panic!("deadline passed while {what}"))
}

// ---------------------------------------------------------------------------
// Temp dir
// ---------------------------------------------------------------------------

/// A directory removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new() -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("{PREFIX}-tmp-{}-{n}", std::process::id()));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes temp dirs of earlier runs whose process is gone (a killed test
/// binary never runs its destructors). Names are `{PREFIX}-tmp-{pid}-{n}`.
fn remove_stale_temp_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let prefix = format!("{PREFIX}-tmp-");
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, _n)) = name.strip_prefix(&prefix).and_then(|r| r.split_once('-')) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A random 32-byte key in hex, written where the relays read it.
pub fn write_psk(path: &Path, seed: u64) {
    let mut key = [0u8; 32];
    StdRng::seed_from_u64(seed).fill_bytes(&mut key);
    fs::write(path, format!("{}\n", hex::encode(key))).expect("write psk file");
}

// ---------------------------------------------------------------------------
// Relay configuration
// ---------------------------------------------------------------------------

/// One relay's config file, typed: built from the relay's own
/// [`RawConfig`] layer, so a misspelt key or section is a compile error.
/// Rendered by [`RelayConfig::render`].
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub name: String,
    pub listeners: Vec<RawListener>,
    pub peers: Vec<RawPeer>,
    pub routes: Vec<RawRoute>,
    /// The file's other tables (`[accel]`, `[timeouts]`, `[policy]`, ...);
    /// its name, admin, key and list fields are ignored (set by
    /// [`RelayConfig::raw`] from the fields above).
    pub sections: RawConfig,
    /// Key file other than the lab's shared one.
    pub psk_file: Option<PathBuf>,
    /// `psk_file_previous`: the key still accepted during a rotation.
    pub psk_file_previous: Option<PathBuf>,
    /// Open-file limit (soft and hard) to start the relay under.
    pub nofile: Option<u64>,
}

impl RelayConfig {
    pub fn new(name: &str) -> RelayConfig {
        RelayConfig {
            name: name.to_owned(),
            listeners: Vec::new(),
            peers: Vec::new(),
            routes: Vec::new(),
            sections: RawConfig::default(),
            psk_file: None,
            psk_file_previous: None,
            nofile: None,
        }
    }

    pub fn listen(&mut self, mode: ListenMode, addr: &str) -> &mut Self {
        self.listener(RawListener::new(mode, addr))
    }

    /// A listener with more than its mode and address set.
    pub fn listener(&mut self, listener: RawListener) -> &mut Self {
        self.listeners.push(listener);
        self
    }

    pub fn listen_intercept(
        &mut self,
        mode: ListenMode,
        addr: &str,
        interfaces: &[&str],
        ports: &[u16],
    ) -> &mut Self {
        self.listener(RawListener {
            intercept: Some(Intercept {
                interfaces: interfaces.iter().map(|s| s.to_string()).collect(),
                ports: ports.to_vec(),
            }),
            ..RawListener::new(mode, addr)
        })
    }

    pub fn peer(&mut self, name: &str, addr: &str) -> &mut Self {
        self.peers.push(RawPeer::new(name, addr));
        self
    }

    pub fn route(&mut self, dst: &str, via: &str) -> &mut Self {
        self.routes.push(RawRoute::new(dst, via));
        self
    }

    /// A route with more than its destination and one hop set.
    pub fn raw_route(&mut self, route: RawRoute) -> &mut Self {
        self.routes.push(route);
        self
    }

    /// Edits `[accel]` (created empty if absent).
    pub fn accel(&mut self, edit: impl FnOnce(&mut RawAccel)) -> &mut Self {
        edit(self.sections.accel.get_or_insert_default());
        self
    }

    /// Edits `[timeouts]` (created empty if absent).
    pub fn timeouts(&mut self, edit: impl FnOnce(&mut RawTimeouts)) -> &mut Self {
        edit(self.sections.timeouts.get_or_insert_default());
        self
    }

    /// Edits `[policy]` (created empty if absent).
    pub fn policy(&mut self, edit: impl FnOnce(&mut RawPolicy)) -> &mut Self {
        edit(self.sections.policy.get_or_insert_default());
        self
    }

    /// Edits `[limits]` (created empty if absent).
    pub fn limits(&mut self, edit: impl FnOnce(&mut RawLimits)) -> &mut Self {
        edit(self.sections.limits.get_or_insert_default());
        self
    }

    /// Sets `[forwarding] data_path`.
    pub fn data_path(&mut self, data_path: DataPath) -> &mut Self {
        self.sections.forwarding = Some(RawForwarding {
            data_path: Some(data_path),
        });
        self
    }

    /// Edits the tuning of one leg kind: `[client]`, `[direct]` or
    /// `[upstream]` (created empty if absent).
    pub fn tuning(&mut self, leg: Leg, edit: impl FnOnce(&mut RawTuning)) -> &mut Self {
        let section = match leg {
            Leg::Client => &mut self.sections.client,
            Leg::Direct => &mut self.sections.direct,
            Leg::Upstream => &mut self.sections.upstream,
        };
        edit(section.get_or_insert_default());
        self
    }

    /// The whole file as a value.
    pub fn raw(&self, psk_file: &Path) -> RawConfig {
        let psk_file = self.psk_file.as_deref().unwrap_or(psk_file);
        let base = testbed::relay(&self.name, "127.0.0.1:9090", Some(psk_file));
        RawConfig {
            name: base.name,
            admin: base.admin,
            psk_file: base.psk_file,
            psk_file_previous: self
                .psk_file_previous
                .as_ref()
                .map(|p| p.display().to_string()),
            listen: self.listeners.clone(),
            peer: self.peers.clone(),
            route: self.routes.clone(),
            ..self.sections.clone()
        }
    }

    /// The file's text.
    pub fn render(&self, psk_file: &Path) -> String {
        self.raw(psk_file).to_toml()
    }

    /// Ports whose listening sockets mean the relay is ready.
    fn listen_ports(&self) -> Vec<u16> {
        self.listeners
            .iter()
            .filter_map(|l| l.addr.rsplit(':').next()?.parse().ok())
            .collect()
    }
}

/// Which legs a tuning table applies to.
#[derive(Debug, Clone, Copy)]
pub enum Leg {
    /// `[client]`: accepted client connections.
    Client,
    /// `[direct]`: dials to destinations.
    Direct,
    /// `[upstream]`: accepted peer legs.
    Upstream,
}

/// `via = [a, b, ...]`: candidates in order.
pub fn via_list(names: &[&str]) -> RawVia {
    RawVia::Many(names.iter().map(|n| n.to_string()).collect())
}

/// A route to `dst` through `via`.
pub fn route_via(dst: &str, via: RawVia) -> RawRoute {
    RawRoute {
        dst: dst.to_owned(),
        via,
        proxy_protocol: None,
        source: None,
    }
}

/// A peer's `pool = { low, high }`.
pub fn pool_bounds(low: usize, high: usize) -> RawPool {
    RawPool {
        low: Some(low),
        high: Some(high),
        idle: None,
    }
}

// ---------------------------------------------------------------------------
// Topology
// ---------------------------------------------------------------------------

// Addresses: `splitway_lab::testbed::chain` (link_v4, link_v6).

pub const SERVER_V4: &str = "10.0.3.2";
pub const SERVER_V6: &str = "fd00:3::2";
/// The last relay's server-facing addresses: what the server sees as peer.
pub const LAST_RELAY_V4: &str = "10.0.3.1";
pub const LAST_RELAY_V6: &str = "fd00:3::1";
pub const ENTRY_V4: &str = "10.0.1.2";

/// A running `splitway relay`.
#[derive(Debug)]
pub struct RelayProcess {
    pub name: String,
    child: Child,
    pub stderr_path: PathBuf,
    pub config_path: PathBuf,
}

impl RelayProcess {
    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Asks the relay to exit (SIGTERM, so it can remove what it installed)
    /// and waits for it, killing it if it takes too long.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let child = &mut self.child;
        let exited = poll_until(Deadline::after(Duration::from_secs(5)), || {
            child.try_wait().ok().flatten()
        });
        if exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        exited
    }
}

/// client — relays[0] — … — relays[n-1] — server.
pub struct Lab {
    // Field order is drop order: processes first, then namespaces, then files.
    relays_running: Vec<RelayProcess>,
    helpers_running: Vec<Child>,
    pub client: Netns,
    pub relays: Vec<Netns>,
    pub relay_names: Vec<String>,
    pub server: Netns,
    pub dir: TempDir,
    pub psk_path: PathBuf,
    /// `/etc/netns/<ns>` dirs created for per-namespace files.
    etc_dirs: Vec<PathBuf>,
}

impl Lab {
    /// The standard two-relay lab: client — rc — rs — server.
    pub fn two_relays() -> Lab {
        Lab::chain(&["rc", "rs"])
    }

    pub fn chain(relay_names: &[&str]) -> Lab {
        record_failures();
        let n = relay_names.len();
        assert!(n >= 1);
        let dir = TempDir::new();
        let psk_path = dir.join("psk.key");
        write_psk(&psk_path, 0x5717_0001);
        let create = || {
            let name = netns::unique_name(PREFIX);
            Netns::create(&name).unwrap_or_else(|e| panic!("create netns {name}: {e}"))
        };
        // Each namespace is owned as soon as it exists, so a failure below
        // still removes the ones already created.
        let client = create();
        let relays: Vec<Netns> = relay_names.iter().map(|_| create()).collect();
        let server = create();
        let lab = Lab {
            relays_running: Vec::new(),
            helpers_running: Vec::new(),
            client,
            relays,
            relay_names: relay_names.iter().map(|s| s.to_string()).collect(),
            server,
            dir,
            psk_path,
            etc_dirs: Vec::new(),
        };
        lab.wire();
        lab
    }

    fn wire(&self) {
        let mut nodes = vec![&self.client];
        nodes.extend(&self.relays);
        nodes.push(&self.server);
        chain::wire(&nodes).unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn rc(&self) -> &Netns {
        &self.relays[0]
    }

    pub fn rs(&self) -> &Netns {
        self.relays.last().expect("at least one relay")
    }

    /// Address of relay `r`'s peer listener, as its west neighbour dials it.
    pub fn peer_addr(&self, r: usize) -> String {
        format!("{}:{PEER_PORT}", link_v4(r, self.relays.len(), 2))
    }

    /// Default configs for every relay: the entry relay intercepts
    /// `ports` arriving on its client interface, offers SOCKS5 and HTTP
    /// CONNECT to the client; each relay forwards the server's subnets to
    /// the next one; the last goes direct. The TPROXY listener is IPv4 only
    /// unless `ipv6`, then it is a single dual-stack `[::]` listener (the
    /// relay binds `[::]` without IPV6_V6ONLY, so it cannot share the port
    /// with a `0.0.0.0` one).
    pub fn default_configs(&self, ports: &[u16], ipv6: bool) -> Vec<RelayConfig> {
        let n = self.relays.len();
        (0..n)
            .map(|r| {
                let mut cfg = RelayConfig::new(&self.relay_names[r]);
                if r == 0 {
                    let any = if ipv6 { "[::]" } else { "0.0.0.0" };
                    cfg.listen_intercept(
                        ListenMode::Tproxy,
                        &format!("{any}:{TPROXY_PORT}"),
                        &[WEST_IF],
                        ports,
                    );
                    cfg.listen(ListenMode::Socks5, &format!("{ENTRY_V4}:{SOCKS_PORT}"));
                    cfg.listen(
                        ListenMode::HttpConnect,
                        &format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}"),
                    );
                    // Explicit proxies accept loopback only unless told otherwise.
                    let n = cfg.listeners.len();
                    for l in &mut cfg.listeners[n - 2..] {
                        l.allow_clients = vec!["10.0.1.0/24".into()];
                    }
                } else {
                    cfg.listen(ListenMode::Peer, &format!("0.0.0.0:{PEER_PORT}"));
                }
                if r + 1 < n {
                    let next = &self.relay_names[r + 1];
                    cfg.peer(next, &self.peer_addr(r + 1));
                    cfg.route("10.0.3.0/24", next);
                    cfg.route("fd00:3::/64", next);
                } else {
                    cfg.route("0.0.0.0/0", "direct");
                    cfg.route("::/0", "direct");
                }
                cfg
            })
            .collect()
    }

    /// Starts every relay, the one nearest the server first so that each
    /// peer is listening before its west neighbour comes up, and waits until
    /// each answers on its admin endpoint and listens on its ports.
    pub fn start_relays(&mut self, configs: &[RelayConfig]) {
        assert_eq!(configs.len(), self.relays.len());
        for r in (0..configs.len()).rev() {
            self.start_relay(r, &configs[r]);
        }
    }

    fn start_relay(&mut self, r: usize, config: &RelayConfig) {
        let name = config.name.clone();
        let config_path = self.dir.join(&format!("{name}.toml"));
        fs::write(&config_path, config.render(&self.psk_path)).expect("write relay config");
        let stderr_path = self.dir.join(&format!("{name}.stderr"));
        let stderr = File::create(&stderr_path).expect("create stderr file");
        let mut command = match config.nofile {
            Some(n) => {
                let mut c = self.relays[r].command("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(SPLITWAY);
                c
            }
            None => self.relays[r].command(SPLITWAY),
        };
        let child = command
            .args(["relay", "--config"])
            .arg(&config_path)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(stderr.try_clone().expect("dup stderr file"))
            .stderr(stderr)
            .spawn()
            .expect("spawn splitway relay");
        self.relays_running.push(RelayProcess {
            name: name.clone(),
            child,
            stderr_path,
            config_path,
        });
        let index = self.relays_running.len() - 1;
        let ports = config.listen_ports();
        let deadline = Deadline::after(Duration::from_secs(15));
        let ns = &self.relays[r];
        let process = &mut self.relays_running[index];
        let status = wait_until(
            deadline,
            &format!("waiting for relay {name} to become ready"),
            || {
                if let Ok(Some(status)) = process.child.try_wait() {
                    panic!(
                        "relay {name} exited during startup with {status}; its output:\n{}",
                        process.stderr()
                    );
                }
                let status = curl_admin(ns, "/status").ok()?;
                listening_ports(ns).is_superset_of(&ports).then_some(status)
            },
        );
        let status = typed_status(&status)
            .unwrap_or_else(|e| panic!("relay {name}: /status: {e}: {status}"));
        assert_eq!(status.name, name, "/status of relay {name}: {status:?}");
    }

    /// Gives every relay namespace an `/etc/hosts` with `entries` (`ip
    /// netns exec` bind-mounts `/etc/netns/<ns>/hosts` over `/etc/hosts`).
    /// Call before starting the relays.
    pub fn relay_hosts_file(&mut self, entries: &str) {
        for ns in &self.relays {
            let dir = Path::new("/etc/netns").join(ns.name());
            fs::create_dir_all(&dir).expect("create /etc/netns dir");
            self.etc_dirs.push(dir.clone());
            fs::write(
                dir.join("hosts"),
                format!("127.0.0.1 localhost\n{entries}\n"),
            )
            .expect("write hosts file");
        }
    }

    /// Fails the test if a relay has exited (a crash mid-test).
    pub fn assert_relays_alive(&mut self) {
        for p in &mut self.relays_running {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!(
                    "relay {} exited with {status}; output:\n{}",
                    p.name,
                    p.stderr()
                );
            }
        }
    }

    /// What relay `name` wrote to stderr (its log) so far.
    pub fn relay_stderr(&self, name: &str) -> String {
        self.relays_running
            .iter()
            .find(|p| p.name == name)
            .expect("relay started")
            .stderr()
    }

    /// Stops relay by name with SIGTERM; returns its exit status (None: had to be killed).
    pub fn stop_relay(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let p = self
            .relays_running
            .iter_mut()
            .find(|p| p.name == name)
            .expect("relay running");
        p.stop()
    }

    /// Kills relay `name` with SIGKILL (no drain, no cleanup: a crash) and
    /// reaps it.
    pub fn kill_relay(&mut self, name: &str) {
        let p = self
            .relays_running
            .iter_mut()
            .find(|p| p.name == name)
            .expect("relay running");
        p.child.kill().expect("SIGKILL relay");
        p.child.wait().expect("reap killed relay");
    }

    /// Process id of the running relay `name`.
    pub fn relay_pid(&self, name: &str) -> u32 {
        self.relays_running
            .iter()
            .find(|p| p.name == name)
            .expect("relay running")
            .child
            .id()
    }

    /// Starts relay `name` again with `config` while its old process still
    /// runs (draining after SIGTERM): the old one keeps its entry (found
    /// first by name) and its log moves to `NAME.old.stderr`.
    pub fn start_relay_beside(&mut self, name: &str, config: &RelayConfig) {
        let old = self.running(name);
        let moved = old.stderr_path.with_extension("old.stderr");
        fs::rename(&old.stderr_path, &moved).expect("move the old relay's log");
        old.stderr_path = moved;
        let r = self
            .relay_names
            .iter()
            .position(|n| n == name)
            .expect("relay name");
        self.start_relay(r, config);
    }

    /// Starts a stopped relay again with `config` (same name, same namespace).
    pub fn restart_relay(&mut self, name: &str, config: &RelayConfig) {
        if let Some(i) = self.relays_running.iter().position(|p| p.name == name) {
            let mut old = self.relays_running.remove(i);
            old.stop();
        }
        let r = self
            .relay_names
            .iter()
            .position(|n| n == name)
            .expect("relay name");
        self.start_relay(r, config);
    }

    fn running(&mut self, name: &str) -> &mut RelayProcess {
        self.relays_running
            .iter_mut()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("relay {name} is not running"))
    }

    /// Sends `signal` (`HUP`, `TERM`, ...) to a running relay.
    pub fn signal_relay(&mut self, name: &str, signal: &str) {
        let pid = self.running(name).child.id().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("run kill");
        assert!(
            status.success(),
            "kill -{signal} {pid} (relay {name}) failed"
        );
    }

    /// Waits for a relay to exit by itself (after a drain) and returns its
    /// status; panics at the deadline.
    pub fn wait_relay_exit(&mut self, name: &str, deadline: Deadline) -> std::process::ExitStatus {
        let child = &mut self.running(name).child;
        wait_until(
            deadline,
            &format!("waiting for relay {name} to exit"),
            || child.try_wait().expect("try_wait"),
        )
    }

    /// The config file a relay was started with (rewrite it, then reload).
    pub fn config_path(&self, name: &str) -> PathBuf {
        self.dir.join(&format!("{name}.toml"))
    }

    /// Runs `splitway ctl ARGS` against a relay's admin API, in its namespace.
    pub fn ctl(&self, relay: &str, args: &[&str]) -> Output {
        output(self.relay_ns(relay).command(SPLITWAY).arg("ctl").args(args))
    }

    pub fn relay_ns(&self, name: &str) -> &Netns {
        let i = self
            .relay_names
            .iter()
            .position(|n| n == name)
            .expect("relay name");
        &self.relays[i]
    }

    /// Parsed `/metrics` of a relay.
    pub fn metrics(&self, relay: &str) -> Metrics {
        let text = curl_admin(self.relay_ns(relay), "/metrics")
            .unwrap_or_else(|e| panic!("GET /metrics from {relay}: {e}"));
        Metrics::parse(&text)
    }

    /// Waits until `counter(name, labels)` on `relay` reaches `at_least`.
    pub fn wait_counter(
        &self,
        relay: &str,
        name: &str,
        labels: &[(&str, &str)],
        at_least: f64,
        deadline: Deadline,
    ) -> f64 {
        let mut last = 0.0;
        // Counters follow the event they count within moments; a long wait
        // only delays the failure report.
        let deadline = deadline.min(Deadline::after(Duration::from_secs(10)));
        let reached = poll_until(deadline, || {
            last = self.metrics(relay).counter(name, labels);
            (last >= at_least).then_some(last)
        });
        reached.unwrap_or_else(|| {
            // Only the family: a whole page would push the cause out of
            // CI's cut of the output.
            let family: Vec<String> = curl_admin(self.relay_ns(relay), "/metrics")
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(name))
                .map(str::to_owned)
                .collect();
            panic!(
                "{relay} {name}{labels:?} stayed at {last}, expected >= {at_least}; the family:\n{}",
                family.join("\n")
            )
        })
    }

    /// Waits until `relay` has counted the payload of every finished
    /// transfer in `splitway_forwarded_bytes_total`, then checks the counts
    /// are exact: every byte forwarded is counted once, whatever path (copy,
    /// splice, carried with the relay header) it took.
    pub fn assert_forwarded_bytes(
        &self,
        relay: &str,
        to_server: u64,
        to_client: u64,
        deadline: Deadline,
    ) {
        let name = "splitway_forwarded_bytes_total";
        for (direction, expected) in [("to_server", to_server), ("to_client", to_client)] {
            let labels = [("direction", direction)];
            // Counters of a just-closed connection may land a moment later,
            // but not seconds later.
            let settle = Deadline::after(Duration::from_secs(5));
            deadline.remaining("checking forwarded byte counters");
            let settled = poll_until(settle, || {
                let v = self.metrics(relay).counter(name, &labels);
                (v >= expected as f64).then_some(v)
            });
            let metrics = self.metrics(relay);
            let counted = settled.unwrap_or_else(|| metrics.counter(name, &labels));
            assert_eq!(
                counted, expected as f64,
                "{relay} {name}{{direction={direction:?}}}: counted {counted}, payload {expected}; metrics:\n{}",
                metrics.text
            );
        }
    }

    /// Keeps a helper process (nginx, ...) to be killed with the lab.
    pub fn adopt(&mut self, child: Child) {
        self.helpers_running.push(child);
    }

    /// What relay `name` has logged so far.
    pub fn relay_log(&self, name: &str) -> String {
        self.relays_running
            .iter()
            .find(|p| p.name == name)
            .map(RelayProcess::stderr)
            .unwrap_or_else(|| panic!("no running relay {name}"))
    }

    /// Prints every relay's output (used on failure): first, for all
    /// relays, the lines that usually explain a failure (warnings, errors,
    /// connections that did not complete), since CI shows only the head
    /// and tail of a failure's output.
    pub fn dump_logs(&self) {
        eprintln!("===== unusual relay log lines =====");
        for p in &self.relays_running {
            for line in p.stderr().lines().filter(|l| unusual_line(l)) {
                eprintln!("[{}] {line}", p.name);
            }
        }
        for p in &self.relays_running {
            let text = p.stderr();
            // The harness's own admin polling would crowd out everything else.
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.contains("admin request"))
                .collect();
            let tail = &lines[lines.len().saturating_sub(300)..];
            eprintln!(
                "===== relay {} ({} lines, last {}) =====\n{}\n===== config {} =====\n{}",
                p.name,
                lines.len(),
                tail.len(),
                tail.join("\n"),
                p.config_path.display(),
                fs::read_to_string(&p.config_path).unwrap_or_default()
            );
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in &mut self.relays_running {
            p.stop();
        }
        for h in &mut self.helpers_running {
            let _ = h.kill();
            let _ = h.wait();
        }
        for dir in &self.etc_dirs {
            let _ = fs::remove_dir_all(dir);
        }
        if std::thread::panicking() {
            self.dump_logs();
            let mut unusual = String::new();
            for p in &self.relays_running {
                for line in p.stderr().lines().filter(|l| unusual_line(l)).take(30) {
                    unusual.push_str(&format!("[{}] {line}\n", p.name));
                }
            }
            record_failure(&unusual);
        }
    }
}

/// The relay log lines that usually explain a failure: warnings, errors,
/// connections that did not complete, loss isolation's verdicts.
fn unusual_line(l: &str) -> bool {
    l.contains(" WARN ")
        || l.contains(" ERROR ")
        || (l.contains(" closed ") && !l.contains("reason=\"completed\""))
        || l.contains("loss isolation: client leg")
        // A path choice's flip, with its cause and the candidates' names:
        // what a failover test that saw the wrong path needs.
        || l.contains("path changed")
}

/// With `SPLITWAY_TEST_FAILURES` set (`make test` sets it), every panic's
/// message and its lab's unusual relay lines are appended to that file,
/// which `make test` prints last: CI shows only the head and tail of a
/// long output, and a second failing test's message fell in the cut.
fn record_failures() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            let binary = std::env::current_exe()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default();
            let thread = std::thread::current();
            let test = thread.name().unwrap_or("?");
            record_failure(&format!("----- {binary} {test}: {info}\n"));
        }));
    });
}

fn record_failure(text: &str) {
    let Some(path) = std::env::var_os("SPLITWAY_TEST_FAILURES") else {
        return;
    };
    // Best effort: the failure is on stderr anyway.
    if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(text.as_bytes());
    }
}

/// Connects from `src` (an address of `ns`) to `dst`.
pub fn connect_from(ns: &splitway_sys::netns::Netns, src: &str, dst: SocketAddr) -> TcpStream {
    let src: IpAddr = src.parse().expect("source address");
    let stream = ns
        .run_in(move || -> std::io::Result<TcpStream> {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.bind(&SocketAddr::new(src, 0).into())?;
            s.connect_timeout(&dst.into(), Duration::from_secs(10))?;
            Ok(s.into())
        })
        .expect("enter namespace")
        .unwrap_or_else(|e| panic!("connect {src} → {dst}: {e}"));
    set_timeouts(&stream);
    stream
}

/// TCP Fast Open for clients and servers in `ns` (`tcp_fastopen = 3`).
pub fn enable_fast_open(ns: &Netns) {
    let out = output(
        ns.command("sysctl")
            .args(["-qw", "net.ipv4.tcp_fastopen=3"]),
    );
    assert!(out.status.success(), "sysctl tcp_fastopen: {out:?}");
}

/// GET an admin endpoint inside a namespace.
pub fn curl_admin(ns: &Netns, path: &str) -> Result<String, String> {
    let out = ns
        .command("curl")
        .args(["-sS", "--fail", "--max-time", "3"])
        .arg(format!("http://127.0.0.1:9090{path}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("spawn curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "curl {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("non-UTF-8 body: {e}"))
}

/// `GET /status` inside a namespace, typed. See [`typed_status`].
pub fn admin_status(ns: &Netns) -> Result<splitway_api::Status, String> {
    typed_status(&curl_admin(ns, "/status")?)
}

/// `GET /routes` inside a namespace, typed and checked like [`typed_status`].
pub fn admin_routes(ns: &Netns) -> Result<splitway_api::RoutesView, String> {
    typed_answer(&curl_admin(ns, "/routes")?)
}

/// A `/status` document as [`splitway_api::Status`], checked both ways:
/// the types refuse unknown fields (strict in tests) and must give back the
/// same JSON, so a field the relay adds, drops or retypes without the API
/// crate fails every test that starts a relay.
pub fn typed_status(text: &str) -> Result<splitway_api::Status, String> {
    typed_answer(text)
}

/// Deserialises an admin answer into its type and checks that serialising
/// it again gives the same JSON.
pub fn typed_answer<T: serde::Serialize + serde::de::DeserializeOwned>(
    text: &str,
) -> Result<T, String> {
    let raw: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    let typed: T = serde_json::from_value(raw.clone())
        .map_err(|e| format!("not in the shape of {} ({e})", std::any::type_name::<T>()))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("does not serialise ({e})"))?;
    if back != raw {
        return Err(format!(
            "{} does not give back the same JSON: {back}",
            std::any::type_name::<T>()
        ));
    }
    Ok(typed)
}

/// TCP ports in LISTEN state inside a namespace.
pub fn listening_ports(ns: &Netns) -> PortSet {
    let out = ns
        .command("ss")
        .args(["-Hltn"])
        .stdin(Stdio::null())
        .output();
    let mut ports = Vec::new();
    if let Ok(out) = out {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // State Recv-Q Send-Q Local:Port Peer:Port
            if let Some(local) = line.split_whitespace().nth(3)
                && let Some(port) = local.rsplit(':').next().and_then(|p| p.parse().ok())
            {
                ports.push(port);
            }
        }
    }
    PortSet(ports)
}

pub struct PortSet(Vec<u16>);

impl PortSet {
    pub fn is_superset_of(&self, ports: &[u16]) -> bool {
        ports.iter().all(|p| self.0.contains(p))
    }
}

/// Runs a command, returning its output whatever the exit status.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

pub struct Metrics {
    scrape: prometheus_parse::Scrape,
    pub text: String,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("parse Prometheus text");
        Metrics {
            scrape,
            text: text.to_owned(),
        }
    }

    /// Sum of every sample of `name` whose labels include `labels`; 0 when
    /// there is none (a counter never incremented may be absent).
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Untyped(v)
                | prometheus_parse::Value::Gauge(v) => v,
                _ => panic!("{name} is not a scalar metric"),
            })
            .fold(0.0, |sum, v| sum + v)
    }
}

// ---------------------------------------------------------------------------
// Sockets and transfers
// ---------------------------------------------------------------------------

/// Timeout applied to every read and write of the tests' sockets, so a
/// stalled relay fails a test instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

pub fn set_timeouts(stream: &TcpStream) {
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .expect("SO_RCVTIMEO");
    stream
        .set_write_timeout(Some(IO_TIMEOUT))
        .expect("SO_SNDTIMEO");
}

/// Connects from inside `ns`.
pub fn connect_in(ns: &Netns, addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = ns
        .run_in(move || TcpStream::connect_timeout(&addr, Duration::from_secs(10)))
        .expect("enter namespace")?;
    set_timeouts(&stream);
    Ok(stream)
}

/// A TCP listener living in the server namespace.
pub struct TestServer {
    listener: TcpListener,
    pub addr: SocketAddr,
}

impl TestServer {
    pub fn bind(ns: &Netns, addr: SocketAddr) -> TestServer {
        let listener = ns
            .run_in(move || TcpListener::bind(addr))
            .expect("enter namespace")
            .unwrap_or_else(|e| panic!("bind test server {addr}: {e}"));
        TestServer { listener, addr }
    }

    /// Accepts one connection, failing the test if none arrives in `timeout`.
    pub fn accept(&self, timeout: Duration) -> (TcpStream, SocketAddr) {
        let listener = self.listener.try_clone().expect("dup listener");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(listener.accept());
        });
        let (stream, peer) = rx
            .recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("no connection reached {} in {timeout:?}", self.addr))
            .expect("accept");
        set_timeouts(&stream);
        (stream, peer)
    }

    /// Accepts connections on a background thread, handing each to `handle`
    /// on its own thread, until the returned guard is dropped.
    pub fn serve_forever(&self, handle: impl Fn(TcpStream) + Send + Sync + 'static) -> ServeGuard {
        let listener = self.listener.try_clone().expect("dup listener");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handle = std::sync::Arc::new(handle);
        let flag = stop.clone();
        let waker = self.listener.try_clone().expect("dup listener");
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                set_timeouts(&conn);
                let handle = handle.clone();
                std::thread::spawn(move || handle(conn));
            }
        });
        ServeGuard {
            stop,
            waker,
            thread: Some(thread),
        }
    }

    /// Fails if a connection is waiting to be accepted.
    pub fn assert_no_pending_connection(&self) {
        self.listener.set_nonblocking(true).expect("nonblocking");
        let result = self.listener.accept();
        self.listener.set_nonblocking(false).expect("blocking");
        match result {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok((_, peer)) => panic!("the server unexpectedly got a connection from {peer}"),
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Serves requests of `b"GO"` with `len` pattern bytes of `seed` each;
/// connections that send anything else (early legs that never carry a
/// byte) are closed without an answer.
pub fn serve_go(server: &TestServer, len: u64, seed: u64) -> ServeGuard {
    server.serve_forever(move |mut s| {
        let mut req = [0u8; 2];
        if s.read_exact(&mut req).is_ok() && &req == b"GO" {
            let _ = send_pattern(&mut s, len, seed);
        }
    })
}

/// One request to a [`serve_go`] server at `dst` from `client`: `GO`, a
/// half-close, and the whole response checked against the pattern.
pub fn go_request(client: &Netns, dst: SocketAddr, len: u64, seed: u64) {
    let mut c = connect_in(client, dst).expect("client connects");
    c.write_all(b"GO").expect("request");
    c.shutdown(std::net::Shutdown::Write).expect("half-close");
    let got = recv_all(&mut c).expect("response");
    let want = send_pattern(&mut io::sink(), len, seed).expect("digest");
    assert_eq!(got, want, "response bytes");
}

/// Stops a [`TestServer::serve_forever`] loop when dropped.
pub struct ServeGuard {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    waker: TcpListener,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ServeGuard {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // The loop is blocked in accept(): shutting the listening socket
        // down makes accept fail at once, and the loop sees the flag.
        let _ = socket2::SockRef::from(&self.waker).shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Length and sha256 of a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamDigest {
    pub len: u64,
    pub sha256: [u8; 32],
}

impl std::fmt::Display for StreamDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes sha256 {}", self.len, hex::encode(self.sha256))
    }
}

const CHUNK: usize = 64 * 1024;

/// Writes `len` pseudo-random bytes derived from `seed`.
pub fn send_pattern(w: &mut impl Write, len: u64, seed: u64) -> io::Result<StreamDigest> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        hasher.update(&buf[..n]);
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(StreamDigest {
        len,
        sha256: hasher.finalize().into(),
    })
}

/// One `read`, retried when a signal interrupts it. A socket with a receive
/// timeout returns EINTR even for handlers installed with SA_RESTART, and
/// this process gets SIGCHLD from the clients it spawns.
pub fn read_some(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Reads until EOF, hashing everything.
pub fn recv_all(r: &mut impl Read) -> io::Result<StreamDigest> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut len = 0u64;
    loop {
        let n = read_some(r, &mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok(StreamDigest {
        len,
        sha256: hasher.finalize().into(),
    })
}

/// Reads until EOF or error; returns the bytes read and how it ended.
pub fn read_until_end(r: &mut impl Read) -> (u64, io::Result<()>) {
    let mut buf = vec![0u8; CHUNK];
    let mut len = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return (len, Ok(())),
            Ok(n) => len += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (len, Err(e)),
        }
    }
}

/// Asserts the peer has nothing more to say: the next read is a clean EOF.
pub fn expect_eof(stream: &mut TcpStream, who: &str) {
    let mut byte = [0u8; 1];
    match read_some(stream, &mut byte) {
        Ok(0) => {}
        Ok(_) => panic!("{who}: expected EOF, got data"),
        Err(e) => panic!("{who}: expected clean EOF, got {e}"),
    }
}

/// Makes `ns` drop every TCP packet to its port `port` (no RST, no answer):
/// a blackholed server.
pub fn blackhole_port(ns: &Netns, port: u16) {
    for cmd in [
        "add table inet swt_blackhole".to_owned(),
        "add chain inet swt_blackhole input { type filter hook input priority 0 ; }".to_owned(),
        format!("add rule inet swt_blackhole input tcp dport {port} drop"),
    ] {
        ns.exec("nft", &[cmd.as_str()])
            .unwrap_or_else(|e| panic!("nft {cmd} in {}: {e}", ns.name()));
    }
}

/// Asserts the stream ends with a reset (ECONNRESET), not a clean EOF.
pub fn expect_reset(stream: &mut TcpStream, who: &str) -> u64 {
    let (len, end) = read_until_end(stream);
    match end {
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => len,
        Err(e) => panic!("{who}: expected ECONNRESET after {len} bytes, got error {e}"),
        Ok(()) => panic!("{who}: expected ECONNRESET, got a clean EOF after {len} bytes"),
    }
}

pub fn assert_peer_ip(peer: SocketAddr, expected: &str) {
    let expected: IpAddr = expected.parse().expect("ip literal");
    assert_eq!(
        peer.ip(),
        expected,
        "the server should see the connection arrive from the last relay"
    );
}

/// Client → server: the client sends `len` bytes and half-closes; the
/// server reads to EOF, then closes; both ends' sha256 must match.
pub fn transfer_client_to_server(
    client: &Netns,
    server: &TestServer,
    dst: SocketAddr,
    len: u64,
    expected_peer: &str,
) {
    let seed = 0xC2_5000 + len;
    let started = Instant::now();
    let mut stream = connect_in(client, dst).unwrap_or_else(|e| panic!("connect {dst}: {e}"));
    let sender = std::thread::spawn(move || {
        let sent = send_pattern(&mut stream, len, seed).expect("client send");
        stream
            .shutdown(Shutdown::Write)
            .expect("client shutdown(Write)");
        expect_eof(&mut stream, "client after upload");
        sent
    });
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, expected_peer);
    let received = recv_all(&mut conn).expect("server receive");
    drop(conn);
    let sent = sender.join().expect("client thread");
    assert_eq!(
        received, sent,
        "client→server {len} B: received {received}, sent {sent}"
    );
    report_rate("client→server", len, started);
}

/// Server → client: the server sends `len` bytes and closes; the client
/// reads to EOF; both ends' sha256 must match.
pub fn transfer_server_to_client(
    client: &Netns,
    server: &TestServer,
    dst: SocketAddr,
    len: u64,
    expected_peer: &str,
) {
    let seed = 0x52C_0000 + len;
    let started = Instant::now();
    let mut stream = connect_in(client, dst).unwrap_or_else(|e| panic!("connect {dst}: {e}"));
    let receiver = std::thread::spawn(move || recv_all(&mut stream).expect("client receive"));
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, expected_peer);
    let sent = send_pattern(&mut conn, len, seed).expect("server send");
    conn.shutdown(Shutdown::Write)
        .expect("server shutdown(Write)");
    let received = receiver.join().expect("client thread");
    expect_eof(&mut conn, "server after download");
    assert_eq!(
        received, sent,
        "server→client {len} B: received {received}, sent {sent}"
    );
    report_rate("server→client", len, started);
}

/// Prints how long a transfer took (shown with `--nocapture`); informative
/// only, never asserted.
fn report_rate(direction: &str, len: u64, started: Instant) {
    let elapsed = started.elapsed();
    if len >= MIB {
        eprintln!(
            "{direction} {len} B (sha256 checked) in {elapsed:.2?}: {:.2} Gbit/s including hashing",
            len as f64 * 8.0 / elapsed.as_secs_f64() / 1e9
        );
    }
}

pub fn sha256_file(path: &Path) -> String {
    let mut file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    hex::encode(recv_all(&mut file).expect("read file").sha256)
}

/// Writes a random file of `len` bytes.
pub fn write_random_file(path: &Path, len: u64, seed: u64) -> StreamDigest {
    let mut file = File::create(path).expect("create file");
    let digest = send_pattern(&mut file, len, seed).expect("write file");
    file.sync_all().expect("sync");
    digest
}

/// The test server's IPv4 address and port.
pub fn server_v4() -> SocketAddr {
    sock(&format!("{SERVER_V4}:{SERVER_PORT}"))
}

pub fn sock(addr: &str) -> SocketAddr {
    addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"))
}

/// Loads an nftables `script` in `ns`.
pub fn nft(ns: &Netns, script: &str) {
    let mut child = ns
        .command("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn nft");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write nft script");
    assert!(
        child.wait().expect("wait nft").success(),
        "nft failed: {script}"
    );
}

/// Resident set size of a process in bytes (`VmRSS` of /proc/PID/status).
pub fn vm_rss_bytes(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The byte stream of [`send_pattern`] with `seed`, produced chunk by
/// chunk without an end: for senders that write until the connection fails.
pub struct PatternGen {
    rng: StdRng,
    buf: Vec<u8>,
}

impl PatternGen {
    pub fn new(seed: u64) -> PatternGen {
        PatternGen {
            rng: StdRng::seed_from_u64(seed),
            buf: vec![0u8; CHUNK],
        }
    }

    /// The next chunk (the same chunking as [`send_pattern`], so the bytes
    /// are identical).
    pub fn next_chunk(&mut self) -> &[u8] {
        self.rng.fill_bytes(&mut self.buf);
        &self.buf
    }
}

/// Checks a received stream byte for byte against the pattern of `seed`,
/// however the reads split it: used where a transfer is cut short on
/// purpose, so that the prefix that did arrive is still verified.
pub struct PatternCheck {
    pattern: PatternGen,
    expected: Vec<u8>,
    pos: usize,
    pub checked: u64,
}

impl PatternCheck {
    pub fn new(seed: u64) -> PatternCheck {
        PatternCheck {
            pattern: PatternGen::new(seed),
            expected: Vec::new(),
            pos: 0,
            checked: 0,
        }
    }

    /// Panics at the first byte that differs from the pattern.
    pub fn feed(&mut self, mut data: &[u8], who: &str) {
        while !data.is_empty() {
            if self.pos == self.expected.len() {
                self.expected = self.pattern.next_chunk().to_vec();
                self.pos = 0;
            }
            let n = data.len().min(self.expected.len() - self.pos);
            if data[..n] != self.expected[self.pos..self.pos + n] {
                let off = data[..n]
                    .iter()
                    .zip(&self.expected[self.pos..])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                panic!(
                    "{who}: received byte {} differs from what was sent",
                    self.checked + off as u64
                );
            }
            self.pos += n;
            self.checked += n as u64;
            data = &data[n..];
        }
    }
}

/// rc's strict-mode SYNs with `outcome`.
pub fn strict_count(lab: &Lab, outcome: &str) -> f64 {
    lab.metrics("rc")
        .counter("splitway_strict_syn_total", &[("outcome", outcome)])
}

/// Connections rc's TPROXY listener accepted.
pub fn tproxy_accepted(lab: &Lab) -> f64 {
    lab.metrics("rc")
        .counter("splitway_connections_accepted_total", &[("mode", "tproxy")])
}

/// The refusal must come as the answer to the SYN (connect fails), never as
/// a reset after a completed handshake.
pub fn assert_refused_at_connect(lab: &Lab, dst: SocketAddr, what: &str) {
    match connect_in(&lab.client, dst) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
        Err(e) => panic!("{what}: expected ECONNREFUSED from connect, got {e}"),
        Ok(_) => panic!("{what}: connect succeeded although the server refuses"),
    }
}

/// A SYN whose handshake never completes, on a lab whose rc starts legs at
/// the SYN with a short `early_syn_expiry`: its early leg reaches `server`
/// from the last relay, carries no byte, ends with a reset when rc's entry
/// expires (a FIN would tell the server that a client ended a request it
/// never sent), and rc counts it as expired. `server` listens on
/// [`server_v4`].
pub fn assert_expired_early_leg_is_reset(lab: &Lab, server: &TestServer, deadline: Deadline) {
    drop_syn_acks(&lab.client, "0-65535", "");
    let half_open = start_connect(&lab.client, 41000, server_v4());
    let (mut leg, peer) = server.accept(deadline.remaining("early leg at the server"));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let (n, end) = read_until_end(&mut leg);
    assert_eq!(n, 0, "no client byte can have been forwarded ({end:?})");
    assert_eq!(
        end.as_ref().map_err(io::Error::kind).err(),
        Some(io::ErrorKind::ConnectionReset),
        "the expired leg ends with a reset, not {end:?}"
    );
    lab.wait_counter(
        "rc",
        "splitway_early_syn_total",
        &[("outcome", "expired")],
        1.0,
        deadline,
    );
    drop(half_open);
}

/// Drops SYN-ACKs arriving at the client for local ports in `ports`.
pub fn drop_syn_acks(client: &Netns, ports: &str, extra_match: &str) {
    nft(
        client,
        &format!(
            "table inet swtest {{\n chain input {{\n  type filter hook input priority 0;\n  \
             tcp dport {ports} tcp flags & (syn | ack) == syn | ack {extra_match} drop\n }}\n}}\n"
        ),
    );
}

/// Starts a connect from `ns` without waiting for it (its SYNs go out and
/// are retransmitted by the kernel); the socket is returned to keep it alive.
pub fn start_connect(ns: &Netns, local_port: u16, dst: SocketAddr) -> socket2::Socket {
    ns.run_in(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        s.bind(&SocketAddr::from(([10, 0, 1, 1], local_port)).into())?;
        match s.connect(&dst.into()) {
            Err(e) if e.raw_os_error() == Some(libc_einprogress()) => Ok(s),
            Err(e) => Err(e),
            Ok(()) => Ok(s),
        }
    })
    .expect("enter namespace")
    .expect("start connect")
}

fn libc_einprogress() -> i32 {
    115
}
