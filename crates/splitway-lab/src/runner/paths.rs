//! Runs a graph scenario's path measurement (issue #20): the relay on
//! `paths.relay` chooses among `paths.candidates` for SOCKS5 connections
//! from `paths.client` to a server on `paths.server`; timed events change
//! links or kill relays, each starting a phase.
//!
//! Per phase: how long new connections took to leave the path chosen
//! before the event (`switch_s`), then the adaptive relay's median TTFB
//! beside the oracle's: one statically routed relay per candidate in the
//! chooser's namespace, measured in the same phase, the best of them being
//! the oracle. Flips and probes per peer come from the chooser's
//! `GET /routes`. The run fails when a target of the issue is missed:
//! switch <= 3 s when the best path changed, TTFB within 5 % of the
//! oracle's, one flip per switch and none otherwise, <= 1 probe per second
//! per peer.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use splitway_api::RoutesView;

use super::{
    LabError, POLL_INTERVAL, Proc, READY_TIMEOUT, TempDir, interrupted, is_root, random_psk_hex,
    splitway_binary, watch_signals, write_file,
};
use crate::emu::EmuError;
use crate::report::{git_commit, kernel_release, load_average, utc_now_iso8601};
use crate::scenario::Scenario;
use crate::scenario::graph::{Action, GraphScenario};
use crate::testbed::config::{
    self as testbed, ListenMode, RawConfig, RawListener, RawPeer, RawRoute, RawVia,
};
use crate::topology::EmuOptions;
use crate::topology::graph::{Graph, GraphHost, LinkSummary, ms};

const NETNS_PREFIX: &str = "swpath";
const SERVER_PORT: u16 = 80;
const SOCKS_PORT: u16 = 1080;
const PEER_PORT: u16 = 7100;
const ADMIN_PORT: u16 = 9090;
const REQUEST: usize = 64;
/// Switch targets (issue #20).
const SWITCH_TARGET_S: f64 = 3.0;
const TTFB_TARGET: f64 = 1.05;
/// Connections are started for this long after an event to time the switch,
const SWITCH_WINDOW: Duration = Duration::from_secs(5);
/// one every this long.
const SWITCH_SPACING: Duration = Duration::from_millis(50);
/// One connection's deadline (a refused or black-holed attempt).
const CONN_TIMEOUT: Duration = Duration::from_secs(10);

/// Oracle relay `k`'s SOCKS port and admin port.
fn oracle_ports(k: usize) -> (u16, u16) {
    (SOCKS_PORT + 1 + k as u16, ADMIN_PORT + 1 + k as u16)
}

fn err(host: &str, detail: impl Into<String>) -> LabError {
    LabError::peer("path lab", host, detail)
}

/// The response to request `seed`: `len` pseudo-random bytes.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Which host each request came from (its seed → source address): the
/// path a connection took, seen by the server, not inferred.
type Sources = Arc<Mutex<HashMap<u64, IpAddr>>>;

/// The server: reads a request naming its seed, sends the pattern, closes.
struct Server {
    listener: Arc<TcpListener>,
    thread: Option<std::thread::JoinHandle<()>>,
    sources: Sources,
}

impl Server {
    fn start(host: &GraphHost, response: u64) -> Result<Server, LabError> {
        let listener = host
            .netns()
            .run_in(|| TcpListener::bind(("0.0.0.0", SERVER_PORT)))
            .map_err(|e| err(host.name(), format!("server namespace: {e}")))?
            .map_err(|e| LabError::io(format!("bind the server on {}", host.name()), e))?;
        let listener = Arc::new(listener);
        let l = listener.clone();
        let sources: Sources = Arc::default();
        let seen = sources.clone();
        let thread = std::thread::Builder::new()
            .name("path-lab-server".into())
            .spawn(move || {
                // Ends when `Drop` shuts the listener down.
                while let Ok((mut conn, from)) = l.accept() {
                    let seen = seen.clone();
                    std::thread::spawn(move || {
                        let mut request = [0u8; REQUEST];
                        if conn.read_exact(&mut request).is_ok() {
                            let seed =
                                u64::from_be_bytes(request[..8].try_into().expect("8 bytes"));
                            seen.lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .insert(seed, from.ip());
                            // A client gone early is the client's finding.
                            let _ = conn.write_all(&pattern(seed, response));
                            let _ = conn.shutdown(Shutdown::Write);
                            let _ = conn.read_to_end(&mut Vec::new());
                        }
                    });
                }
            })
            .map_err(|e| LabError::io("start the server thread", e))?;
        Ok(Server {
            listener,
            thread: Some(thread),
            sources,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // shutdown(2) on a listener wakes a blocked accept on Linux.
        if let Err(e) = socket2::SockRef::from(&*self.listener).shutdown(Shutdown::Both) {
            tracing::warn!(error = %e, "cannot stop the path-lab server");
            return;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection through the SOCKS5 listener at `socks`: time from
/// connect to the response's first byte; every byte is checked.
fn ttfb_once(
    socks: SocketAddr,
    server: SocketAddr,
    seed: u64,
    response: u64,
) -> Result<Duration, String> {
    let started = Instant::now();
    let mut s =
        TcpStream::connect_timeout(&socks, CONN_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(CONN_TIMEOUT))
        .and_then(|()| s.set_nodelay(true))
        .map_err(|e| format!("socket options: {e}"))?;
    let SocketAddr::V4(dst) = server else {
        return Err("IPv4 server only".into());
    };
    s.write_all(&[5, 1, 0])
        .map_err(|e| format!("SOCKS greeting: {e}"))?;
    let mut method = [0u8; 2];
    s.read_exact(&mut method)
        .map_err(|e| format!("SOCKS method reply: {e}"))?;
    if method != [5, 0] {
        return Err(format!("SOCKS method reply {method:?}"));
    }
    let mut req = vec![5, 1, 0, 1];
    req.extend_from_slice(&dst.ip().octets());
    req.extend_from_slice(&dst.port().to_be_bytes());
    s.write_all(&req)
        .map_err(|e| format!("SOCKS request: {e}"))?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply)
        .map_err(|e| format!("SOCKS reply: {e}"))?;
    if reply[1] != 0 {
        return Err(format!("relay refused: SOCKS status {}", reply[1]));
    }
    let mut request = [0u8; REQUEST];
    request[..8].copy_from_slice(&seed.to_be_bytes());
    s.write_all(&request)
        .map_err(|e| format!("send request: {e}"))?;
    let mut got = vec![0u8; 1];
    s.read_exact(&mut got)
        .map_err(|e| format!("first response byte: {e}"))?;
    let at = started.elapsed();
    s.read_to_end(&mut got)
        .map_err(|e| format!("response: {e}"))?;
    if got != pattern(seed, response) {
        return Err(format!(
            "response of request {seed}: {} bytes, not the {response} sent",
            got.len()
        ));
    }
    Ok(at)
}

struct Lab {
    graph: Graph,
    sources: Sources,
    /// Source address at the server → candidate name.
    path_names: HashMap<IpAddr, String>,
    client: usize,
    chooser: usize,
    socks: SocketAddr,
    server: SocketAddr,
    response: u64,
    seed: AtomicU64,
    /// Connections through the adaptive relay that failed (refused, reset,
    /// timed out), per phase.
    failures: AtomicU64,
}

impl Lab {
    fn host(&self, i: usize) -> &GraphHost {
        &self.graph.hosts()[i]
    }

    /// One timed connection from the client through `socks`: its seed
    /// and TTFB (None: it failed, counted).
    fn ttfb(&self, socks: SocketAddr) -> Result<(u64, Option<Duration>), LabError> {
        if interrupted() {
            return Err(LabError::Interrupted);
        }
        let seed = self.seed.fetch_add(1, Ordering::Relaxed);
        let (server, response) = (self.server, self.response);
        let r = self
            .host(self.client)
            .netns()
            .run_in(move || ttfb_once(socks, server, seed, response))
            .map_err(|e| err("client", format!("client namespace: {e}")))?;
        Ok((seed, self.judge(socks, r)))
    }

    fn judge(&self, socks: SocketAddr, r: Result<Duration, String>) -> Option<Duration> {
        match r {
            Ok(t) => Some(t),
            Err(why) => {
                tracing::debug!(%why, %socks, "path-lab connection failed");
                // An oracle's failure shows as its path's missing median.
                if socks == self.socks {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// The candidate request `seed` reached the server through.
    fn path_of(&self, seed: u64) -> String {
        let sources = self
            .sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match sources.get(&seed) {
            Some(ip) => self
                .path_names
                .get(ip)
                .cloned()
                .unwrap_or_else(|| format!("unknown {ip}")),
            None => "none".into(),
        }
    }

    fn routes(&self) -> Result<RoutesView, LabError> {
        let host = self.host(self.chooser);
        let url = format!("http://127.0.0.1:{ADMIN_PORT}/routes");
        let out = host
            .netns()
            .exec("curl", &["-s", "--max-time", "5", &url])
            .map_err(|e| err(host.name(), format!("GET /routes: {e}")))?;
        serde_json::from_slice(&out.stdout)
            .map_err(|e| err(host.name(), format!("/routes is not a routes view: {e}")))
    }

    fn chosen(&self) -> Result<String, LabError> {
        let r = self.routes()?;
        r.routes
            .first()
            .map(|r| r.chosen.clone())
            .ok_or_else(|| err(self.host(self.chooser).name(), "no route in /routes"))
    }
}

/// Flips of the route and probes per peer, from one `/routes` read.
#[derive(Debug, Clone)]
struct Counts {
    at: Instant,
    flips: u64,
    probes: Vec<(String, u64)>,
}

fn counts(lab: &Lab) -> Result<Counts, LabError> {
    let r = lab.routes()?;
    let route = r
        .routes
        .first()
        .ok_or_else(|| err("relay", "no route in /routes"))?;
    Ok(Counts {
        at: Instant::now(),
        flips: route.flips,
        probes: route
            .candidates
            .iter()
            .filter(|c| c.name != "direct")
            .map(|c| (c.name.clone(), c.probes))
            .collect(),
    })
}

#[derive(Debug, serde::Serialize)]
struct PhaseResult {
    phase: String,
    event: Option<String>,
    /// Since the first phase began, when the event was applied.
    applied_at_s: Option<f64>,
    /// Since the route's last change, when the event was applied.
    since_last_flip_s: Option<f64>,
    chosen_before: String,
    chosen: String,
    ttfb_ms: f64,
    oracle_ttfb_ms: f64,
    oracle_path: String,
    /// `None` (null): the path failed every sample of the phase.
    per_path_ttfb_ms: BTreeMap<String, Option<f64>>,
    switch_s: Option<f64>,
    /// Paths the adaptive relay's steady-state connections took, as the
    /// server saw them.
    paths_taken: BTreeMap<String, u64>,
    flips: u64,
    probes_per_s: BTreeMap<String, f64>,
    /// Through the adaptive relay, switch window included.
    failed_connections: u64,
    missed: Vec<String>,
}

fn median_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// From `since`, a connection every [`SWITCH_SPACING`], each on its own
/// (a black-holed one must not hold up the next), until one succeeds on a
/// path other than `from` as the server saw it: `Some(its start)`.
fn time_switch(lab: &Lab, from: &str, since: Instant) -> Result<Option<f64>, LabError> {
    let (tx, rx) = mpsc::channel();
    let ns = lab.host(lab.client).netns().name().to_owned();
    let (socks, server, response) = (lab.socks, lab.server, lab.response);
    let mut first_new: Option<f64> = None;
    let mut launched = 0usize;
    let mut answered = 0usize;
    while first_new.is_none() {
        if interrupted() {
            return Err(LabError::Interrupted);
        }
        let at = since.elapsed();
        if at <= SWITCH_WINDOW {
            let seed = lab.seed.fetch_add(1, Ordering::Relaxed);
            let (tx, ns) = (tx.clone(), ns.clone());
            std::thread::spawn(move || {
                let r = splitway_sys::netns::run_in_named(&ns, move || {
                    ttfb_once(socks, server, seed, response)
                })
                .map_err(|e| format!("client namespace: {e}"))
                .and_then(|r| r);
                // The receiver is gone once the switch is found: fine.
                let _ = tx.send((at, seed, r));
            });
            launched += 1;
        } else if answered == launched {
            break;
        }
        let next = since + SWITCH_SPACING * launched as u32;
        let wait = next.saturating_duration_since(Instant::now());
        let wait = if at > SWITCH_WINDOW {
            CONN_TIMEOUT
        } else {
            wait
        };
        match rx.recv_timeout(wait) {
            Ok((at, seed, r)) => {
                answered += 1;
                if lab.judge(socks, r).is_some() && lab.path_of(seed) != from {
                    let s = at.as_secs_f64();
                    first_new = Some(first_new.map_or(s, |f: f64| f.min(s)));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if at > SWITCH_WINDOW {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(first_new)
}

/// Adaptive median, each oracle's median, paths the adaptive samples took.
type Measured = (f64, Vec<(String, Option<f64>)>, BTreeMap<String, u64>);

/// The steady state in rounds: each oracle once (a path that fails once
/// is out for the phase: None), then the adaptive relay, so drift in the
/// machine's load hits every path alike. Round 0 warms pools and caches
/// and is not counted.
fn measure(lab: &Lab, g: &GraphScenario) -> Result<Measured, LabError> {
    let chooser = lab.host(lab.chooser).addr();
    let n = g.paths.candidates.len();
    let mut oracle: Vec<Option<Vec<Duration>>> = vec![Some(Vec::new()); n];
    let mut v = Vec::new();
    let mut taken = BTreeMap::new();
    for round in 0..=g.paths.samples {
        for (k, samples) in oracle.iter_mut().enumerate() {
            let Some(list) = samples else { continue };
            let socks = SocketAddr::from((chooser, oracle_ports(k).0));
            match lab.ttfb(socks)?.1 {
                Some(t) if round > 0 => list.push(t),
                Some(_) => {}
                None => *samples = None,
            }
        }
        // Failures show in failed_connections; the median is of successes.
        if let (seed, Some(t)) = lab.ttfb(lab.socks)?
            && round > 0
        {
            v.push(t);
            *taken.entry(lab.path_of(seed)).or_insert(0) += 1;
        }
    }
    if v.is_empty() {
        return Err(err(
            lab.host(lab.chooser).name(),
            "every connection through the adaptive relay failed in a steady phase",
        ));
    }
    let per_path = g
        .paths
        .candidates
        .iter()
        .zip(oracle)
        .map(|(p, s)| (p.clone(), s.map(median_ms)))
        .collect();
    Ok((median_ms(v), per_path, taken))
}

fn relay_conf(name: &str, psk: &Path, admin: u16) -> RawConfig {
    testbed::relay(name, &format!("127.0.0.1:{admin}"), Some(psk))
}

/// Polls until `ports` listen in the host's namespace.
fn wait_listening(proc: &mut Proc, host: &GraphHost, ports: &[u16]) -> Result<(), LabError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if interrupted() {
            return Err(LabError::Interrupted);
        }
        proc.check_alive()?;
        let out = host
            .netns()
            .exec("ss", &["-Hltn"])
            .map_err(|e| LabError::peer("ss", host.name(), e.to_string()))?;
        let listening: Vec<u16> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().nth(3))
            .filter_map(|local| local.rsplit(':').next()?.parse().ok())
            .collect();
        if ports.iter().all(|p| listening.contains(p)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(LabError::peer(
                &proc.what,
                &proc.host,
                format!(
                    "not listening on {ports:?} after {READY_TIMEOUT:?}: {}",
                    proc.log_tail()
                ),
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

fn start_relay(
    host: &GraphHost,
    name: &str,
    conf: &RawConfig,
    dir: &Path,
    ports: &[u16],
) -> Result<Proc, LabError> {
    let path = dir.join(format!("{name}.toml"));
    write_file(&path, conf.to_toml().as_bytes())?;
    let bin = splitway_binary()?;
    let mut cmd = host.netns().command(&bin.to_string_lossy());
    cmd.arg("relay")
        .arg("--config")
        .arg(&path)
        .arg("--drain-timeout")
        .arg("1s");
    let log = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log)
        .map_err(|e| LabError::io(format!("create {}", log.display()), e))?;
    let err_file = file
        .try_clone()
        .map_err(|e| LabError::io("duplicate log file", e))?;
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err_file)
        .spawn()
        .map_err(|e| LabError::peer("splitway relay", host.name(), format!("cannot start: {e}")))?;
    let mut proc = Proc {
        what: format!("splitway relay {name}"),
        host: host.name().to_owned(),
        child,
        log,
    };
    wait_listening(&mut proc, host, ports)?;
    Ok(proc)
}

/// Applies `action`; a killed relay's process is removed from `relays`.
fn apply(lab: &mut Lab, action: &Action, relays: &mut Vec<(String, Proc)>) -> Result<(), LabError> {
    match action {
        Action::SetLink {
            link,
            rtt_ms,
            rtt_add_ms,
            loss,
        } => {
            let (spec, _) = lab.graph.link(link)?;
            let mut spec = spec.clone();
            let rtt = spec.effective_rtt().as_secs_f64() * 1e3;
            let new_rtt = rtt_ms.unwrap_or(rtt + rtt_add_ms.unwrap_or(0.0));
            if new_rtt < 0.0 {
                return Err(LabError::Emulator(EmuError::Spec(format!(
                    "link {link}: RTT {rtt} ms {rtt_add_ms:?} ms is negative"
                ))));
            }
            spec.one_way = None;
            spec.rtt = ms(new_rtt);
            if let Some(l) = loss {
                spec.loss = *l;
                spec.loss_one_way = None;
            }
            lab.graph.set_link(link, spec)?;
        }
        Action::LinkDown(l) => lab.graph.set_up(l, false)?,
        Action::LinkUp(l) => lab.graph.set_up(l, true)?,
        Action::Kill(h) => {
            let at = relays
                .iter()
                .position(|(host, _)| host == h)
                .ok_or_else(|| err(h, "no relay runs there (killed before?)"))?;
            let (_, mut proc) = relays.remove(at);
            // SIGKILL: no goodbye to its peers, as a crash or power loss.
            proc.child
                .kill()
                .map_err(|e| LabError::io(format!("kill the relay on {h}"), e))?;
            proc.child
                .wait()
                .map_err(|e| LabError::io(format!("reap the relay on {h}"), e))?;
        }
    }
    Ok(())
}

/// Runs the measurement and returns its JSON document; `Err` also when a
/// target was missed (the document is written first by the caller's
/// `json` path, so the figures are never lost).
pub fn run(
    scenario: &Scenario,
    g: &GraphScenario,
    loss_seed: Option<u64>,
    json: Option<&Path>,
) -> Result<(), LabError> {
    if !is_root() {
        return Err(LabError::NotRoot);
    }
    watch_signals();
    let load_before = load_average();
    let started_at = utc_now_iso8601();
    let graph = Graph::build(
        &g.spec,
        NETNS_PREFIX,
        &EmuOptions {
            seed: loss_seed,
            ..EmuOptions::default()
        },
    )?;
    let idx = |name: &str| {
        g.spec
            .hosts
            .iter()
            .position(|h| h == name)
            .expect("validated host name")
    };
    let (client, chooser, server) = (
        idx(&g.paths.client),
        idx(&g.paths.relay),
        idx(&g.paths.server),
    );
    let work = TempDir::create()?;
    let psk = work.path.join("psk.key");
    write_file(&psk, random_psk_hex()?.as_bytes())?;
    let chooser_addr = graph.hosts()[chooser].addr();
    let server_addr = graph.hosts()[server].addr();
    let server_proc = Server::start(&graph.hosts()[server], g.paths.response_bytes)?;
    let mut path_names = HashMap::new();
    path_names.insert(IpAddr::V4(chooser_addr), "direct".to_owned());
    for p in g.paths.peer_hosts() {
        path_names.insert(IpAddr::V4(graph.hosts()[idx(p)].addr()), p.to_owned());
    }

    // Candidate relays: peer listener, everything direct.
    let mut relays: Vec<(String, Proc)> = Vec::new();
    for name in g.paths.peer_hosts() {
        let host = &graph.hosts()[idx(name)];
        let mut conf = relay_conf(name, &psk, ADMIN_PORT);
        conf.listen.push(RawListener {
            allow_clients: vec![format!("{chooser_addr}/32")],
            ..RawListener::new(ListenMode::Peer, format!("0.0.0.0:{PEER_PORT}"))
        });
        conf.route.push(RawRoute::new("0.0.0.0/0", "direct"));
        let proc = start_relay(host, name, &conf, &work.path, &[PEER_PORT, ADMIN_PORT])?;
        relays.push((name.to_owned(), proc));
    }
    // The chooser and one oracle per candidate, in the chooser's namespace.
    let client_addr = graph.hosts()[client].addr();
    let peer = |p: &str| RawPeer::new(p, format!("{}:{PEER_PORT}", graph.hosts()[idx(p)].addr()));
    let socks = |port: u16| RawListener {
        allow_clients: vec![format!("{client_addr}/32")],
        ..RawListener::new(ListenMode::Socks5, format!("{chooser_addr}:{port}"))
    };
    let chooser_host = &graph.hosts()[chooser];
    let mut conf = relay_conf(&g.paths.relay, &psk, ADMIN_PORT);
    conf.listen.push(socks(SOCKS_PORT));
    conf.peer.extend(g.paths.peer_hosts().map(peer));
    conf.route.push(RawRoute {
        dst: format!("{server_addr}/32"),
        via: RawVia::Many(g.paths.candidates.clone()),
        proxy_protocol: None,
        source: None,
    });
    let chooser_proc = start_relay(
        chooser_host,
        &g.paths.relay,
        &conf,
        &work.path,
        &[SOCKS_PORT, ADMIN_PORT],
    )?;
    let relay_started = Instant::now();
    let mut oracles = Vec::new();
    for (k, via) in g.paths.candidates.iter().enumerate() {
        let (port, admin) = oracle_ports(k);
        let name = format!("oracle-{via}");
        let mut conf = relay_conf(&name, &psk, admin);
        conf.listen.push(socks(port));
        // Only its own peer: no pools or legs to the others.
        if via != "direct" {
            conf.peer.push(peer(via));
        }
        conf.route
            .push(RawRoute::new(format!("{server_addr}/32"), via.as_str()));
        oracles.push(start_relay(
            chooser_host,
            &name,
            &conf,
            &work.path,
            &[port, admin],
        )?);
    }

    let mut lab = Lab {
        graph,
        sources: server_proc.sources.clone(),
        path_names,
        client,
        chooser,
        socks: SocketAddr::from((chooser_addr, SOCKS_PORT)),
        server: SocketAddr::from((server_addr, SERVER_PORT)),
        response: g.paths.response_bytes,
        seed: AtomicU64::new(1),
        failures: AtomicU64::new(0),
    };

    // Every relay candidate measured before the first phase.
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let r = lab.routes()?;
        let measured = r.routes.first().is_some_and(|r| {
            r.candidates
                .iter()
                .all(|c| c.name == "direct" || c.leg_rtt_ms.is_some())
        });
        if measured {
            break;
        }
        if Instant::now() > deadline {
            return Err(err(
                &g.paths.relay,
                format!("candidates not probed after {READY_TIMEOUT:?}"),
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
    }

    let t0 = Instant::now();
    let mut last_change: Option<Instant> = None;
    let mut phases = Vec::new();
    let steps = std::iter::once(None).chain(g.events.iter().map(Some));
    for event in steps {
        let mut applied_at_s = None;
        let mut since_last_flip_s = None;
        if let Some(e) = event {
            // The event's time, waited for in slices so Ctrl-C stops it.
            let until = t0 + e.at;
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                if interrupted() {
                    return Err(LabError::Interrupted);
                }
                std::thread::sleep(left.min(Duration::from_millis(200)));
            }
        }
        let before = lab.chosen()?;
        let start_counts = counts(&lab)?;
        lab.failures.store(0, Ordering::Relaxed);
        if let Some(e) = event {
            since_last_flip_s = last_change.map(|t| t.elapsed().as_secs_f64());
            apply(&mut lab, &e.action, &mut relays)?;
            applied_at_s = Some(t0.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        let switch = time_switch(&lab, &before, t)?;
        if switch.is_some() {
            last_change = Some(Instant::now());
        }
        let (ttfb_ms, per_path, paths_taken) = measure(&lab, g)?;
        let end_counts = counts(&lab)?;
        let chosen = lab.chosen()?;
        let (oracle_path, oracle_ttfb_ms) = per_path
            .iter()
            .filter_map(|(p, m)| m.map(|m| (p.clone(), m)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .ok_or_else(|| err(&g.paths.relay, "no candidate path works in this phase"))?;
        let elapsed = end_counts.at.duration_since(start_counts.at).as_secs_f64();
        let mut probes_per_s = BTreeMap::new();
        let mut missed = Vec::new();
        for ((peer, a), (_, b)) in start_counts.probes.iter().zip(&end_counts.probes) {
            let n = b.saturating_sub(*a);
            probes_per_s.insert(peer.clone(), n as f64 / elapsed);
            // One a second: a phase of E seconds holds at most floor(E) + 1.
            if n as f64 > elapsed.floor() + 1.0 {
                missed.push(format!("{n} probes to {peer} in {elapsed:.1} s"));
            }
        }
        let flips = end_counts.flips - start_counts.flips;
        let phase_name = event.map_or(g.paths.first_phase.clone(), |e| e.phase.clone());
        if ttfb_ms > oracle_ttfb_ms * TTFB_TARGET {
            missed.push(format!(
                "TTFB {ttfb_ms:.1} ms above 1.05 x the oracle's {oracle_ttfb_ms:.1} ms"
            ));
        }
        if before != oracle_path {
            match switch {
                Some(s) if s <= SWITCH_TARGET_S => {}
                Some(s) => missed.push(format!("switched after {s:.2} s")),
                None => missed.push(format!("still on {before} after {SWITCH_WINDOW:?}")),
            }
        }
        if flips != u64::from(switch.is_some()) {
            missed.push(format!(
                "{flips} flips, {} switch",
                u64::from(switch.is_some())
            ));
        }
        phases.push(PhaseResult {
            phase: phase_name,
            event: event.map(|e| e.action.describe()),
            applied_at_s,
            since_last_flip_s,
            chosen_before: before,
            chosen,
            ttfb_ms,
            oracle_ttfb_ms,
            oracle_path,
            per_path_ttfb_ms: per_path.into_iter().collect(),
            switch_s: switch,
            paths_taken,
            flips,
            probes_per_s,
            failed_connections: lab.failures.load(Ordering::Relaxed),
            missed,
        });
    }
    let totals = counts(&lab)?;
    let run_s = relay_started.elapsed().as_secs_f64();
    let links = lab.graph.link_summaries();
    drop(oracles);
    drop(chooser_proc);
    drop(relays);

    let met = phases.iter().all(|p| p.missed.is_empty());
    let report = PathReport {
        scenario: &scenario.name,
        origin: &scenario.origin,
        date: started_at,
        commit: git_commit(),
        kernel: kernel_release(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).ok(),
        load_before,
        load_after: load_average(),
        loss_seed,
        hosts: &g.spec.hosts,
        links,
        relay: &g.paths.relay,
        candidates: &g.paths.candidates,
        samples_per_median: g.paths.samples,
        request_bytes: REQUEST,
        response_bytes: g.paths.response_bytes,
        flips: totals.flips,
        probes_per_s_per_peer: totals
            .probes
            .iter()
            .map(|(p, n)| (p.clone(), *n as f64 / run_s))
            .collect(),
        phases: &phases,
        targets: Targets {
            switch_s: SWITCH_TARGET_S,
            ttfb_over_oracle: TTFB_TARGET,
            probes_per_s_per_peer: 1.0,
            met,
        },
    };
    println!("{}", render(scenario, &report));
    if let Some(path) = json {
        let text = report_json(&report)
            .map_err(|e| LabError::io("serialize the path report", std::io::Error::other(e)))?;
        write_file(path, text.as_bytes())?;
        println!("JSON: {}", path.display());
    }
    if met {
        Ok(())
    } else {
        let n = phases.iter().filter(|p| !p.missed.is_empty()).count();
        Err(LabError::Usage(format!(
            "path-choice targets missed in {n} phase(s) (see `missed` in the table above)"
        )))
    }
}

/// The JSON file of a run (`--json`), read by `relay_paths_lab` and kept
/// in lab-results/.
#[derive(Debug, serde::Serialize)]
struct PathReport<'a> {
    scenario: &'a str,
    origin: &'a str,
    date: String,
    commit: String,
    kernel: String,
    cpus: Option<usize>,
    load_before: String,
    load_after: String,
    loss_seed: Option<u64>,
    hosts: &'a [String],
    links: Vec<LinkSummary>,
    relay: &'a str,
    candidates: &'a [String],
    samples_per_median: usize,
    request_bytes: usize,
    response_bytes: u64,
    flips: u64,
    probes_per_s_per_peer: BTreeMap<String, f64>,
    phases: &'a [PhaseResult],
    targets: Targets,
}

#[derive(Debug, serde::Serialize)]
struct Targets {
    switch_s: f64,
    ttfb_over_oracle: f64,
    probes_per_s_per_peer: f64,
    met: bool,
}

/// The report's text. Through `serde_json::Value`, whose objects sort their
/// keys (no `preserve_order`): the files keep the alphabetical key order
/// they had when the report was built with `json!`.
fn report_json(report: &PathReport<'_>) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&serde_json::to_value(report)?)
}

fn render(scenario: &Scenario, report: &PathReport<'_>) -> String {
    let phases = report.phases;
    let mut out = format!(
        "{}: {}\ncommit {}  kernel {}  load {} -> {}\n\n",
        scenario.name,
        scenario.description.trim(),
        report.commit.chars().take(12).collect::<String>(),
        report.kernel,
        report.load_before,
        report.load_after,
    );
    out.push_str(&format!(
        "{:<18} {:>7} {:<15} {:>9} {:>9} {:<8} {:>6} {:>8} {:>6} {:>7}  {}\n",
        "phase",
        "at s",
        "chosen",
        "TTFB ms",
        "oracle",
        "(path)",
        "Δ %",
        "switch s",
        "flips",
        "probe/s",
        "verdict"
    ));
    for p in phases {
        let max_probe = p.probes_per_s.values().copied().fold(0.0, f64::max);
        out.push_str(&format!(
            "{:<18} {:>7} {:<15} {:>9.1} {:>9.1} {:<8} {:>+6.1} {:>8} {:>6} {:>7.2}  {}\n",
            p.phase,
            p.applied_at_s.map_or("-".into(), |t| format!("{t:.1}")),
            format!("{} -> {}", p.chosen_before, p.chosen),
            p.ttfb_ms,
            p.oracle_ttfb_ms,
            p.oracle_path,
            (p.ttfb_ms / p.oracle_ttfb_ms - 1.0) * 100.0,
            p.switch_s.map_or("-".into(), |s| format!("{s:.2}")),
            p.flips,
            max_probe,
            if p.missed.is_empty() {
                "ok".to_owned()
            } else {
                format!("MISSED: {}", p.missed.join("; "))
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys, in the order of the files in lab-results/ (written when
    /// the report was a `json!` value), which scripts and
    /// `relay_paths_lab` read.
    #[test]
    fn report_keys_are_those_of_the_recorded_files() {
        let phase = PhaseResult {
            phase: "detour".into(),
            event: None,
            applied_at_s: None,
            since_last_flip_s: None,
            chosen_before: "direct".into(),
            chosen: "rs1".into(),
            ttfb_ms: 97.3,
            oracle_ttfb_ms: 97.0,
            oracle_path: "rs1".into(),
            per_path_ttfb_ms: [("direct".into(), Some(406.3)), ("rs2".into(), None)].into(),
            switch_s: Some(0.2),
            paths_taken: [("rs1".into(), 9)].into(),
            flips: 1,
            probes_per_s: [("rs1".into(), 0.9)].into(),
            failed_connections: 0,
            missed: Vec::new(),
        };
        let hosts = vec!["client".to_owned(), "rc".to_owned()];
        let report = PathReport {
            scenario: "path-choice",
            origin: "issue #20",
            date: "2026-11-24T23:55:59Z".into(),
            commit: "e084b71".into(),
            kernel: "6.18".into(),
            cpus: Some(2),
            load_before: "0.10".into(),
            load_after: "0.20".into(),
            loss_seed: None,
            hosts: &hosts,
            links: Vec::new(),
            relay: "rc",
            candidates: &hosts,
            samples_per_median: 3,
            request_bytes: REQUEST,
            response_bytes: 1024,
            flips: 1,
            probes_per_s_per_peer: [("rs1".into(), 0.9)].into(),
            phases: std::slice::from_ref(&phase),
            targets: Targets {
                switch_s: SWITCH_TARGET_S,
                ttfb_over_oracle: TTFB_TARGET,
                probes_per_s_per_peer: 1.0,
                met: true,
            },
        };
        let text = report_json(&report).expect("serializes");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("parses");
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().expect("an object").keys().cloned().collect()
        };
        assert_eq!(
            keys(&doc),
            [
                "candidates",
                "commit",
                "cpus",
                "date",
                "flips",
                "hosts",
                "kernel",
                "links",
                "load_after",
                "load_before",
                "loss_seed",
                "origin",
                "phases",
                "probes_per_s_per_peer",
                "relay",
                "request_bytes",
                "response_bytes",
                "samples_per_median",
                "scenario",
                "targets",
            ]
        );
        assert_eq!(
            keys(&doc["phases"][0]),
            [
                "applied_at_s",
                "chosen",
                "chosen_before",
                "event",
                "failed_connections",
                "flips",
                "missed",
                "oracle_path",
                "oracle_ttfb_ms",
                "paths_taken",
                "per_path_ttfb_ms",
                "phase",
                "probes_per_s",
                "since_last_flip_s",
                "switch_s",
                "ttfb_ms",
            ]
        );
        assert_eq!(
            keys(&doc["targets"]),
            [
                "met",
                "probes_per_s_per_peer",
                "switch_s",
                "ttfb_over_oracle"
            ]
        );
        // A failed path is null, as `json!(None::<f64>)` wrote it.
        assert!(doc["phases"][0]["per_path_ttfb_ms"]["rs2"].is_null());
        // Keys come out sorted in the text itself, not only once parsed.
        assert!(text.find("\"candidates\"") < text.find("\"scenario\""));
    }

    #[test]
    fn patterns_differ_by_seed_and_are_stable() {
        assert_eq!(pattern(7, 100), pattern(7, 100));
        assert_ne!(pattern(7, 100), pattern(8, 100));
        assert_eq!(pattern(1, 1000).len(), 1000);
    }
}
