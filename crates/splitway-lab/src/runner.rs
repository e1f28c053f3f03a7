//! Runs real peers through each configuration of a scenario and measures
//! them with curl.
//!
//! Per chain: one [`Topology`] (reused by every configuration), nginx in the
//! server's namespace serving one file per object size, and per
//! configuration the relay software on the relay hosts:
//!
//! - `e2e`: nothing; the relays only route. The client fetches
//!   `http://SERVER/…`.
//! - `haproxy`: HAProxy in TCP mode on every relay, each forwarding to the
//!   next relay's HAProxy, the last to the server. HAProxy is an explicit
//!   proxy: the client fetches `http://R1:8080/…`.
//! - `ssh`: `ssh -L` on the first relay over an SSH session to sshd on the
//!   last relay, which connects to the server (the KTCP paper's baseline).
//!   Explicit too: the client fetches `http://R1:8022/…`.
//! - `split`: splitway relays; the first intercepts the client's traffic to
//!   port 80 with TPROXY and chains over authenticated peer legs to the last
//!   relay, which connects directly. The client fetches `http://SERVER/…`.
//! - `split+es`, `split+es+pool`, `full`, `full+tfo`: `split` with the
//!   relays' accelerations switched on one by one.
//! - `socks5`: the first relay listens for SOCKS5 instead of intercepting;
//!   curl uses it with `--socks5` (relays otherwise as `split+es+pool`).
//! - `agent`: the client host runs `splitway agent` (cgroup connect
//!   redirect, destination in the SYN) and curl runs in its cgroup; the
//!   first relay intercepts nothing and listens with `mode = "syn-option"`,
//!   its SYNs watched for early SYN (relays otherwise as `split+es+pool`).
//!
//! Every download is a fresh curl process, so a fresh TCP connection; its
//! size is checked. Readiness is waited for by polling the listening sockets
//! (`ss`), never by fixed sleeps. Child processes and temporary files are
//! owned by guards, so every exit path tears them down; the topology's drop
//! removes the namespaces and kills whatever still runs inside.

use std::fs;
use std::io::Read as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod handover;
pub mod loss_fairness;
pub mod paths;
pub mod window_safety;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::emu::{EmuError, EmuStats};
pub use crate::family::{Families, Family};
use crate::model::{Config, Congestion, END_HOST_CONGESTION, RELAY_CONGESTION};
use crate::report::{ChainReport, LabReport, Measurement, ReportError, Spread, Status};
use crate::scenario::{Chain, Scenario, ScenarioError, format_size};
use crate::topology::{DEV_LEFT, EmuOptions, Host, Topology};

/// Prefix of the lab's namespaces (stale ones are removed on the next run).
pub const NETNS_PREFIX: &str = "swlab";
const HTTP_PORT: u16 = 80;
const HAPROXY_PORT: u16 = 8080;
const SSH_FORWARD_PORT: u16 = 8022;
const SSHD_PORT: u16 = 2222;
const TPROXY_PORT: u16 = 7000;
const SOCKS_PORT: u16 = 1080;
const SYNOPT_PORT: u16 = 7200;
const PEER_PORT: u16 = 7100;
const ADMIN_PORT: u16 = 9090;
/// Socket buffers of relay↔relay legs under Turbo-Start: the initial receive
/// window can only be advertised if the buffer holds it (net.core.rmem_max,
/// 4 MiB here, caps SO_RCVBUF).
const TURBO_BUFFER: usize = 4 * 1024 * 1024;
/// Unrecorded downloads before measuring a configuration.
const WARM_UP_DOWNLOADS: usize = 2;
/// Size of the warm-up object (small: a lossy scenario's bulk size would
/// make warming up as slow as measuring).
const WARM_UP_SIZE: u64 = 10_000;
/// How long a peer may take to start listening.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a peer may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval between readiness polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Everything that can stop a lab run, saying who failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error(
        "splitway lab needs root (network namespaces, TUN devices, nftables): run it with sudo"
    )]
    NotRoot,
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error("lab network: {0}")]
    Emulator(#[from] EmuError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("{tool} on {host} failed: {detail}")]
    Peer {
        tool: String,
        host: String,
        detail: String,
    },
    #[error("lab internal: {op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    NotBuilt(String),
    #[error("the emulator missed {0} fidelity check(s): its measurements cannot be trusted here")]
    Fidelity(usize),
    #[error("interrupted: the lab was torn down")]
    Interrupted,
    #[error("soak failed: {0}")]
    Soak(String),
}

/// Set by SIGINT/SIGTERM: the run stops after the current download and
/// every guard tears its part down (a signal's default action would skip
/// all destructors and leave namespaces and peers behind).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Sleeps until `at`, or until the run is interrupted (checked every
/// 100 ms: an aligned start can be a handover interval away).
fn wait_until(at: Instant) {
    while !interrupted() {
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

fn watch_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("lab-signals".into())
            .spawn(|| {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!(error = %e, "no signal watcher: Ctrl-C will skip teardown");
                        return;
                    }
                };
                runtime.block_on(async {
                    use tokio::signal::unix::{SignalKind, signal};
                    let (Ok(mut int), Ok(mut term)) = (
                        signal(SignalKind::interrupt()),
                        signal(SignalKind::terminate()),
                    ) else {
                        tracing::warn!("no signal watcher: Ctrl-C will skip teardown");
                        return;
                    };
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                    INTERRUPTED.store(true, Ordering::SeqCst);
                    eprintln!(
                        "\ninterrupted: stopping after the current download, tearing the lab down"
                    );
                });
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no signal watcher: Ctrl-C will skip teardown");
        }
    });
}

impl LabError {
    pub(crate) fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io {
            op: op.into(),
            source,
        }
    }

    fn peer(tool: &str, host: &str, detail: impl Into<String>) -> Self {
        LabError::Peer {
            tool: tool.into(),
            host: host.into(),
            detail: detail.into(),
        }
    }
}

/// True when running with an effective uid of 0 (the owner of
/// `/proc/self` is the process's effective uid).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// How to run a scenario.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The address families to run every chain over, in turn (empty: the
    /// scenario's).
    pub families: Vec<Families>,
    pub quick: bool,
    /// Overrides the scenario's repetitions.
    pub reps: Option<u32>,
    /// Overrides the scenario's configurations.
    pub configs: Option<Vec<Config>>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Seed of the emulator's loss PRNGs for every chain (None: random).
    pub loss_seed: Option<u64>,
    /// The emulator's release quantum, µs (None: the emulator's default).
    pub emulator_quantum_us: Option<u64>,
}

/// `http://addr:port` with an IPv6 address in brackets.
fn http_base(addr: IpAddr, port: u16) -> String {
    format!("http://{}", SocketAddr::new(addr, port))
}

/// Runs every chain and configuration of `scenario` and returns the report.
pub fn run_scenario(scenario: &Scenario, options: &RunOptions) -> Result<LabReport, LabError> {
    if !is_root() {
        return Err(LabError::NotRoot);
    }
    let reps = scenario.reps_for(options.quick, options.reps).max(1);
    let configs = options
        .configs
        .clone()
        .unwrap_or_else(|| scenario.configs.clone());
    watch_signals();
    let mut report = LabReport::new(scenario, true, options.quick, reps);
    report.loss_seed = options.loss_seed;
    let work = TempDir::create()?;
    let mut objects = scenario.sizes.clone();
    if !objects.contains(&WARM_UP_SIZE) {
        objects.push(WARM_UP_SIZE);
    }
    write_objects(&work.path.join("www"), &objects)?;

    let runnable = configs.iter().filter(|c| availability(**c).is_ok()).count();
    let families = if !options.families.is_empty() {
        options.families.clone()
    } else if !scenario.families.is_empty() {
        scenario.families.clone()
    } else {
        vec![Families::V4]
    };
    let total =
        scenario.chains.len() * families.len() * runnable * scenario.sizes.len() * reps as usize;
    let bar = if options.progress {
        ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:40} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );

    for chain in &scenario.chains {
        for &family in &families {
            let defaults = EmuOptions::default();
            let emu = EmuOptions {
                seed: options.loss_seed,
                release_quantum_ns: options
                    .emulator_quantum_us
                    .map_or(defaults.release_quantum_ns, |us| us * 1000),
                ..defaults
            };
            let run = ChainRun {
                configs: &configs,
                reps,
                work: &work.path,
                bar: &bar,
                emu: &emu,
                family,
            };
            report.chains.push(run_chain(scenario, chain, &run)?);
        }
    }
    bar.finish_and_clear();
    report.load_average_end = crate::report::load_average();
    Ok(report)
}

/// Every namespace of `topo` on the model's algorithm: the host's default
/// (often bbr) would leak into them, and the model assumes classic slow
/// start. A namespace may only pick reno or bbr as its default; splitway
/// sets its legs per socket.
fn end_hosts_on_model_congestion(topo: &Topology) -> Result<(), LabError> {
    for host in topo.hosts() {
        host.netns()
            .sysctl("net.ipv4.tcp_congestion_control", END_HOST_CONGESTION)
            .map_err(|e| LabError::peer("sysctl", host.name(), e.to_string()))?;
    }
    Ok(())
}

/// A counter's value in a Prometheus text page: the line that starts with
/// `series` (name and labels, as the relay writes them).
fn counter_value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

/// Whether the lab can run a configuration; Err explains why not.
pub fn availability(config: Config) -> Result<(), String> {
    match config {
        Config::E2e | Config::Haproxy | Config::Default | Config::Split => Ok(()),
        Config::Ssh => {
            if Path::new("/usr/sbin/sshd").is_file() {
                Ok(())
            } else {
                Err("openssh-server is not installed (no /usr/sbin/sshd)".into())
            }
        }
        Config::SplitEs
        | Config::SplitEsPool
        | Config::Full
        | Config::FullTfo
        | Config::Socks5
        | Config::Agent => Ok(()),
    }
}

/// How one chain is run: what the scenario does not say.
struct ChainRun<'a> {
    configs: &'a [Config],
    reps: u32,
    work: &'a Path,
    bar: &'a ProgressBar,
    emu: &'a EmuOptions,
    family: Families,
}

fn run_chain(scenario: &Scenario, chain: &Chain, run: &ChainRun) -> Result<ChainReport, LabError> {
    let ChainRun {
        configs,
        reps,
        work,
        bar,
        emu,
        family,
    } = *run;
    let chain = &*chain.over(family);
    let mut out = ChainReport::over(chain, family);
    bar.set_message(format!("{}: building the chain", chain.name));
    let topo = Topology::build_with(&chain.spec, NETNS_PREFIX, emu)?;
    end_hosts_on_model_congestion(&topo)?;
    for host in topo.hosts() {
        // TFO for client and server sockets; only sockets that ask for it
        // (curl --tcp-fastopen, relays with accel.tfo) use it.
        host.netns()
            .sysctl("net.ipv4.tcp_fastopen", "3")
            .map_err(|e| LabError::peer("sysctl", host.name(), e.to_string()))?;
    }
    let server = topo.server();
    let server_addr = family
        .ends
        .left(server)
        .ok_or_else(|| LabError::Usage(format!("the server has no {} link", family.ends.name())))?;
    let _nginx = start_nginx(server, work)?;
    // Timed RTT changes and loss bursts run through every configuration;
    // each row's downloads start aligned to them.
    let handovers = handover::Handovers::start(&topo, chain);

    for &config in configs {
        let mut rows: Vec<Measurement> = scenario
            .sizes
            .iter()
            .map(|&size| Measurement::unmeasured(chain, config, size))
            .collect();
        let available = availability(config);
        if let Err(reason) = available {
            for row in &mut rows {
                row.note = Some(reason.clone());
            }
            out.results.extend(rows);
            continue;
        }
        bar.set_message(format!("{}: {config}: starting", chain.name));
        let setup = match setup_config(config, &topo, server_addr, work, chain, family) {
            Ok(setup) => setup,
            Err(e) => {
                let (status, note) = match &e {
                    LabError::NotBuilt(why) => (Status::NotAvailable, why.clone()),
                    other => (Status::Failed, other.to_string()),
                };
                for row in &mut rows {
                    row.status = status;
                    row.note = Some(note.clone());
                }
                out.results.extend(rows);
                bar.inc(scenario.sizes.len() as u64 * u64::from(reps));
                continue;
            }
        };
        // Unrecorded downloads prove the path, warm nginx and fetch the TFO
        // cookies (the first TFO connection to a server only gets one).
        let warm = (0..WARM_UP_DOWNLOADS).try_for_each(|_| {
            curl(&setup, topo.client(), WARM_UP_SIZE, scenario.timeout)
                .and_then(|s| s.check(WARM_UP_SIZE))
        });
        if interrupted() {
            return Err(LabError::Interrupted);
        }
        // A relay pair in use has learned its legs' windows: with learned
        // windows on, wait for the first relay's window probe as part of
        // the warm-up (on a GEO hop it takes several seconds).
        let warm = warm.and_then(|()| {
            if config == Config::Default {
                wait_window_probe(&topo)
            } else {
                Ok(())
            }
        });
        if let Err(e) = warm {
            for row in &mut rows {
                row.status = Status::Failed;
                row.note = Some(format!("warm-up download through {config} failed: {e}"));
            }
            out.results.extend(rows);
            bar.inc(scenario.sizes.len() as u64 * u64::from(reps));
            continue;
        }
        for row in &mut rows {
            bar.set_message(format!(
                "{}: {config} {}",
                chain.name,
                format_size(row.size_bytes)
            ));
            let before = learned_windows(&topo);
            let stats = measure(&topo, &setup, row, reps, scenario.timeout, &handovers, bar);
            judge_row(chain, config, row, &stats);
            let after = learned_windows(&topo);
            row.learned_window_events = before
                .zip(after.as_ref())
                .map(|(b, a)| events_since(&b.events, &a.events));
            row.learned_windows_after = after.map(|a| a.peers).unwrap_or_default();
            if interrupted() {
                return Err(LabError::Interrupted);
            }
        }
        drop(setup);
        out.results.extend(rows);
    }
    Ok(out)
}

/// How long the warm-up waits for a window probe.
const WINDOW_PROBE_WAIT: Duration = Duration::from_secs(90);

/// Waits until the first relay counts a window probe sent (to its peer),
/// if its learned windows are active; Err after [`WINDOW_PROBE_WAIT`].
fn wait_window_probe(topo: &Topology) -> Result<(), String> {
    let Some(first) = topo.relays().first() else {
        return Ok(());
    };
    if topo.relays().len() < 2 {
        return Ok(());
    }
    let active = relay_status(first)
        .map_err(|e| e.to_string())?
        .accel
        .get("learned_window")
        .is_some_and(|a| a.state == "active");
    if !active {
        return Ok(());
    }
    let deadline = Instant::now() + WINDOW_PROBE_WAIT;
    loop {
        let metrics = admin_get(first, "/metrics").map_err(|e| e.to_string())?;
        let sent = counter_value(
            &String::from_utf8_lossy(&metrics),
            "splitway_window_probes_total{outcome=\"sent\"}",
        )
        .unwrap_or(0.0);
        if sent >= 1.0 {
            return Ok(());
        }
        if Instant::now() > deadline || interrupted() {
            return Err(format!(
                "{}'s window probe did not finish within {} s",
                first.name(),
                WINDOW_PROBE_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The host's learned-window counters and the windows the last relay
/// saved, as it reports them; `None` where it runs no `splitway_resume`
/// (or is not splitway).
fn learned_windows(topo: &Topology) -> Option<splitway_api::LearnedWindows> {
    let last = topo.relays().last()?;
    relay_status(last).ok()?.learned_windows
}

/// What grew from `before` to `after` (maps made anew count from zero).
fn events_since(
    before: &splitway_api::LearnedWindowEvents,
    after: &splitway_api::LearnedWindowEvents,
) -> splitway_api::LearnedWindowEvents {
    let d = |b: u64, a: u64| if a >= b { a - b } else { a };
    splitway_api::LearnedWindowEvents {
        jumps: d(before.jumps, after.jumps),
        rtt_mismatches: d(before.rtt_mismatches, after.rtt_mismatches),
        validated: d(before.validated, after.validated),
        retreats: d(before.retreats, after.retreats),
        saved: d(before.saved, after.saved),
    }
}

/// Whether the emulator could have moved `row`'s figures and whether the
/// model applied (see `verdict`).
fn judge_row(chain: &Chain, config: Config, row: &mut Measurement, stats: &EmuStats) {
    if row.n == 0 {
        return;
    }
    let verdict = crate::verdict::judge(
        &chain.model_links(),
        &chain.model,
        config,
        row.size_bytes,
        &crate::verdict::LinkLateness::from_stats(stats),
    );
    row.emulator_shift = Some(verdict.shift);
    row.suspect |= !verdict.suspect.is_empty();
    row.suspect_reasons.extend(verdict.suspect);
    row.premise = verdict.premise;
}

/// Runs `reps` downloads of one size and fills `row`; returns the
/// emulator's counters of the batch.
fn measure(
    topo: &Topology,
    setup: &Setup,
    row: &mut Measurement,
    reps: u32,
    timeout: Duration,
    handovers: &handover::Handovers,
    bar: &ProgressBar,
) -> EmuStats {
    let (mut ttfb, mut total, mut connect) = (Vec::new(), Vec::new(), Vec::new());
    let mut errors: Vec<String> = Vec::new();
    topo.reset_stats();
    for rep in 0..reps {
        if let Some(at) = handovers.aligned_start(rep, reps) {
            wait_until(at);
        }
        if interrupted() {
            break;
        }
        match curl(setup, topo.client(), row.size_bytes, timeout)
            .and_then(|s| s.check(row.size_bytes).map(|()| s))
        {
            Ok(s) => {
                connect.push(s.connect_s * 1000.0);
                ttfb.push(s.starttransfer_s * 1000.0);
                total.push(s.total_s * 1000.0);
            }
            Err(e) => {
                row.failures += 1;
                if !errors.contains(&e) {
                    errors.push(e);
                }
            }
        }
        bar.inc(1);
    }
    let stats = topo.stats();
    row.n = ttfb.len();
    row.ttfb_ms = Spread::of(&ttfb);
    row.total_ms = Spread::of(&total);
    row.connect_ms = Spread::of(&connect);
    row.status = if row.n > 0 && setup.degraded.is_some() {
        Status::Degraded
    } else if row.n > 0 {
        Status::Ok
    } else {
        Status::Failed
    };
    row.emulator = Some(stats.clone());
    let mut notes: Vec<String> = setup.note.iter().cloned().collect();
    notes.extend(setup.degraded.iter().cloned());
    if !errors.is_empty() {
        notes.push(format!("failures: {}", errors.join("; ")));
    }
    // A connect far slower than the model means the client did not reach
    // the relay it should have (e.g. TPROXY did not intercept): flag it
    // rather than report another configuration's numbers under this name.
    if let Some(c) = row.connect_ms.as_ref()
        && c.median > row.model_connect_ms * 1.2 + 3.0
    {
        row.suspect = true;
        row.suspect_reasons.push(format!(
            "client connect {:.1} ms, model {:.1} ms: did the relay terminate the connection?",
            c.median, row.model_connect_ms
        ));
    }
    if !notes.is_empty() {
        row.note = Some(notes.join("; "));
    }
    stats
}

// ------------------------------------------------------------------ curl

#[derive(Debug, Clone, Copy)]
struct CurlSample {
    connect_s: f64,
    starttransfer_s: f64,
    total_s: f64,
    http_code: u32,
    size: u64,
}

impl CurlSample {
    fn check(&self, expected: u64) -> Result<(), String> {
        if self.http_code != 200 {
            return Err(format!("HTTP status {}", self.http_code));
        }
        if self.size != expected {
            return Err(format!("got {} of {expected} bytes", self.size));
        }
        Ok(())
    }
}

/// One download in the client's namespace: a fresh process, so a fresh TCP
/// connection.
fn curl(setup: &Setup, client: &Host, size: u64, timeout: Duration) -> Result<CurlSample, String> {
    let url = setup.url(size);
    let mut cmd = match &setup.agent {
        // The shell joins the agent's cgroup, then becomes `ip netns exec
        // … curl`: joined from inside, `ip netns exec`'s fresh /sys would
        // hide the cgroup file system.
        Some(agent) => {
            let mut c = Command::new("sh");
            c.args(["-c", "echo $$ > \"$1\" && shift && exec \"$@\"", "sh"])
                .arg(agent.cgroup.join("cgroup.procs"))
                .args(["ip", "netns", "exec", client.netns().name(), "curl"]);
            c
        }
        None => client.netns().command("curl"),
    };
    if setup.tcp_fastopen {
        cmd.arg("--tcp-fastopen");
    }
    cmd.args(&setup.curl_args);
    let out = cmd
        .args([
            "-s",
            "-o",
            "/dev/null",
            "--max-time",
            &format!("{:.3}", timeout.as_secs_f64()),
            "-w",
            "%{time_connect} %{time_starttransfer} %{time_total} %{http_code} %{size_download}",
            &url,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run curl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    if !out.status.success() {
        return Err(format!(
            "curl exited with {} (partial: {})",
            out.status,
            text.trim()
        ));
    }
    parse_curl(&fields).ok_or_else(|| format!("unexpected curl output {:?}", text.trim()))
}

fn parse_curl(fields: &[&str]) -> Option<CurlSample> {
    if fields.len() != 5 {
        return None;
    }
    Some(CurlSample {
        connect_s: fields[0].parse().ok()?,
        starttransfer_s: fields[1].parse().ok()?,
        total_s: fields[2].parse().ok()?,
        http_code: fields[3].parse().ok()?,
        size: fields[4].parse().ok()?,
    })
}

// ------------------------------------------------------------ processes

/// A child process killed (and reaped) on drop. Its output goes to a log
/// file whose tail explains an early exit.
struct Proc {
    what: String,
    host: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(what: &str, host: &Host, mut cmd: Command, log: PathBuf) -> Result<Proc, LabError> {
        let file = fs::File::create(&log)
            .map_err(|e| LabError::io(format!("create {}", log.display()), e))?;
        let err_file = file
            .try_clone()
            .map_err(|e| LabError::io("duplicate log file", e))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .spawn()
            .map_err(|e| LabError::peer(what, host.name(), format!("cannot start: {e}")))?;
        Ok(Proc {
            what: what.to_owned(),
            host: host.name().to_owned(),
            child,
            log,
        })
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().rev().take(8).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// The last log line mentioning `needle`, shortened.
    fn log_line(&self, needle: &str) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let line = text
            .lines()
            .rev()
            .find(|l| l.contains(needle))
            .unwrap_or("no log line");
        // Drop the timestamp and level: the message says why.
        let from = line.find(needle).unwrap_or(0);
        line[from..].trim().chars().take(200).collect()
    }

    /// Err if the process already exited.
    fn check_alive(&mut self) -> Result<(), LabError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(LabError::peer(
                &self.what,
                &self.host,
                format!("exited with {status}: {}", self.log_tail()),
            )),
            Err(e) => Err(LabError::peer(&self.what, &self.host, format!("wait: {e}"))),
        }
    }

    /// Polls until `port` listens in the host's namespace.
    fn wait_listening(&mut self, host: &Host, ports: &[u16]) -> Result<(), LabError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if interrupted() {
                return Err(LabError::Interrupted);
            }
            self.check_alive()?;
            let listening = listening_ports(host)?;
            if ports.iter().all(|p| listening.contains(p)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LabError::peer(
                    &self.what,
                    &self.host,
                    format!(
                        "not listening on {ports:?} after {READY_TIMEOUT:?}: {}",
                        self.log_tail()
                    ),
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for Proc {
    /// SIGTERM first, so peers undo what they installed in the shared
    /// namespaces (a relay's nft rules and turbo routes would otherwise leak
    /// into the next configuration); SIGKILL if they do not exit in time.
    fn drop(&mut self) {
        let terminated = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if terminated {
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(Some(_)) => return,
                    Ok(None) => std::thread::sleep(POLL_INTERVAL),
                    Err(_) => break,
                }
            }
            tracing::warn!(what = %self.what, host = %self.host, "did not stop on SIGTERM; killing it");
        }
        if let Err(e) = self.child.kill() {
            tracing::debug!(what = %self.what, error = %e, "kill");
        }
        if let Err(e) = self.child.wait() {
            tracing::warn!(what = %self.what, error = %e, "cannot reap child");
        }
    }
}

/// TCP ports listening in the host's namespace (`ss -Hltn`).
fn listening_ports(host: &Host) -> Result<Vec<u16>, LabError> {
    let out = host
        .netns()
        .exec("ss", &["-Hltn"])
        .map_err(|e| LabError::peer("ss", host.name(), e.to_string()))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3))
        .filter_map(|local| local.rsplit(':').next()?.parse().ok())
        .collect())
}

/// A temporary directory removed on drop.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn create() -> Result<TempDir, LabError> {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("splitway-lab-{}-{n}", std::process::id()));
        fs::create_dir_all(&path)
            .map_err(|e| LabError::io(format!("create {}", path.display()), e))?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // SPLITWAY_LAB_KEEP=1 keeps configs and peer logs for debugging.
        if std::env::var_os("SPLITWAY_LAB_KEEP").is_some_and(|v| v == "1") {
            eprintln!("kept lab files in {}", self.path.display());
            return;
        }
        if let Err(e) = fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove lab temp dir");
        }
    }
}

fn write_file(path: &Path, contents: &[u8]) -> Result<(), LabError> {
    fs::write(path, contents).map_err(|e| LabError::io(format!("write {}", path.display()), e))
}

fn object_name(size: u64) -> String {
    format!("obj-{size}.bin")
}

/// One file per size, filled with a non-repeating-looking pattern.
fn write_objects(dir: &Path, sizes: &[u64]) -> Result<(), LabError> {
    fs::create_dir_all(dir).map_err(|e| LabError::io(format!("create {}", dir.display()), e))?;
    for &size in sizes {
        let mut data = Vec::with_capacity(size as usize);
        let mut x: u32 = 0x1234_5678;
        while (data.len() as u64) < size {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            data.push((x & 0xff) as u8);
        }
        write_file(&dir.join(object_name(size)), &data)?;
    }
    Ok(())
}

// ----------------------------------------------------------------- nginx

fn start_nginx(server: &Host, work: &Path) -> Result<Proc, LabError> {
    let dir = work.join("nginx");
    let tmp = dir.join("tmp");
    fs::create_dir_all(&tmp).map_err(|e| LabError::io(format!("create {}", tmp.display()), e))?;
    let conf = format!(
        "user root;\n\
         worker_processes 1;\n\
         daemon off;\n\
         pid {dir}/nginx.pid;\n\
         error_log {dir}/error.log warn;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
           access_log off;\n\
           default_type application/octet-stream;\n\
           sendfile on;\n\
           tcp_nodelay on;\n\
           tcp_nopush on;\n\
           keepalive_timeout 0;\n\
           client_body_temp_path {dir}/tmp/body;\n\
           proxy_temp_path {dir}/tmp/proxy;\n\
           server {{\n\
             listen {HTTP_PORT} backlog=4096 fastopen=256;\n\
             listen [::]:{HTTP_PORT} backlog=4096 fastopen=256;\n\
             root {www};\n\
           }}\n\
         }}\n",
        dir = dir.display(),
        www = work.join("www").display(),
    );
    let conf_path = dir.join("nginx.conf");
    write_file(&conf_path, conf.as_bytes())?;
    let mut cmd = server.netns().command("nginx");
    cmd.arg("-p")
        .arg(&dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(&conf_path);
    let mut proc = Proc::spawn("nginx", server, cmd, dir.join("stderr.log"))?;
    proc.wait_listening(server, &[HTTP_PORT])?;
    Ok(proc)
}

// --------------------------------------------------------- configurations

/// The peers of one configuration, torn down on drop.
struct Setup {
    /// Base URL the client fetches, without the object name.
    base: String,
    /// How the client reaches the relay, for the report.
    note: Option<String>,
    /// curl sends its request in the SYN (TFO).
    tcp_fastopen: bool,
    /// A feature of the configuration the relay reported unavailable.
    degraded: Option<String>,
    /// curl's proxy arguments (`socks5`).
    curl_args: Vec<String>,
    /// The agent's cgroup curl runs in (`agent`), detached on drop.
    agent: Option<AgentGuard>,
    _procs: Vec<Proc>,
}

impl Setup {
    fn url(&self, size: u64) -> String {
        format!("{}/{}", self.base, object_name(size))
    }
}

fn setup_config(
    config: Config,
    topo: &Topology,
    server_addr: IpAddr,
    work: &Path,
    chain: &Chain,
    family: Families,
) -> Result<Setup, LabError> {
    let relays = topo.relays();
    let direct = http_base(server_addr, HTTP_PORT);
    if config != Config::E2e && relays.is_empty() {
        return Err(LabError::Usage(format!(
            "{config} needs at least one relay"
        )));
    }
    // Per family too: a second family's run must not find the first's
    // keys and files (ssh-keygen will not overwrite a key).
    let dir = match family {
        Families::V4 => work.join(config.name().replace('+', "-")),
        other => work.join(format!(
            "{}-{}",
            config.name().replace('+', "-"),
            other.name()
        )),
    };
    fs::create_dir_all(&dir).map_err(|e| LabError::io(format!("create {}", dir.display()), e))?;
    match config {
        Config::E2e => Ok(Setup {
            base: direct,
            note: Some("relays only route".into()),
            tcp_fastopen: false,
            degraded: None,
            curl_args: Vec::new(),
            agent: None,
            _procs: Vec::new(),
        }),
        Config::Haproxy => setup_haproxy(relays, server_addr, &dir, family),
        Config::Ssh => setup_ssh(relays, server_addr, &dir, family),
        Config::Default
        | Config::Split
        | Config::SplitEs
        | Config::SplitEsPool
        | Config::Full
        | Config::FullTfo
        | Config::Socks5
        | Config::Agent => setup_splitway(config, topo, server_addr, &dir, chain, family),
    }
}

fn left_addr(host: &Host, family: Family) -> Result<IpAddr, LabError> {
    family.left(host).ok_or_else(|| {
        LabError::Usage(format!(
            "host {} has no {} client-side link",
            host.name(),
            family.name()
        ))
    })
}

fn setup_haproxy(
    relays: &[Host],
    server: IpAddr,
    dir: &Path,
    family: Families,
) -> Result<Setup, LabError> {
    let mut procs = Vec::new();
    // HAProxy's own address form: `ipv4@` / `ipv6@` prefixes, no brackets.
    let at = |addr: IpAddr, port: u16| match addr {
        IpAddr::V4(a) => format!("ipv4@{a}:{port}"),
        IpAddr::V6(a) => format!("ipv6@{a}:{port}"),
    };
    // Start from the server side so each HAProxy's next hop already listens.
    for (i, relay) in relays.iter().enumerate().rev() {
        // The first takes the client's family, the others the legs'.
        let bind = match i {
            0 => at(family.ends.any(), HAPROXY_PORT),
            _ => at(family.legs.any(), HAPROXY_PORT),
        };
        let next = match relays.get(i + 1) {
            Some(next) => at(left_addr(next, family.legs)?, HAPROXY_PORT),
            None => at(server, HTTP_PORT),
        };
        let conf = format!(
            "global\n  maxconn 4096\n\
             defaults\n  mode tcp\n  timeout connect 10s\n  timeout client 120s\n  timeout server 120s\n\
             frontend lab\n  bind {bind}\n  default_backend next\n\
             backend next\n  server next {next}\n"
        );
        let path = dir.join(format!("haproxy-{}.cfg", relay.name()));
        write_file(&path, conf.as_bytes())?;
        let mut cmd = relay.netns().command("haproxy");
        cmd.arg("-db").arg("-f").arg(&path);
        let mut proc = Proc::spawn(
            "haproxy",
            relay,
            cmd,
            dir.join(format!("haproxy-{}.log", relay.name())),
        )?;
        proc.wait_listening(relay, &[HAPROXY_PORT])?;
        procs.push(proc);
    }
    let first = left_addr(&relays[0], family.ends)?;
    let base = http_base(first, HAPROXY_PORT);
    Ok(Setup {
        note: Some(format!(
            "explicit proxy: the client connects to {}'s HAProxy at {base}",
            relays[0].name()
        )),
        base,
        tcp_fastopen: false,
        degraded: None,
        curl_args: Vec::new(),
        agent: None,
        _procs: procs,
    })
}

fn run_tool(what: &str, cmd: &mut Command) -> Result<(), LabError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::peer(what, "lab host", format!("cannot run: {e}")))?;
    if !out.status.success() {
        return Err(LabError::peer(
            what,
            "lab host",
            format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

fn setup_ssh(
    relays: &[Host],
    server: IpAddr,
    dir: &Path,
    family: Families,
) -> Result<Setup, LabError> {
    let first = &relays[0];
    let last = &relays[relays.len() - 1];
    let host_key = dir.join("ssh_host_ed25519_key");
    let client_key = dir.join("client_ed25519_key");
    for key in [&host_key, &client_key] {
        run_tool(
            "ssh-keygen",
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "splitway-lab", "-f"])
                .arg(key),
        )?;
    }
    let authorized = dir.join("authorized_keys");
    let public = fs::read(client_key.with_extension("pub"))
        .map_err(|e| LabError::io("read the lab's ssh client key", e))?;
    write_file(&authorized, &public)?;
    // sshd insists on its privilege separation directory.
    fs::create_dir_all("/run/sshd").map_err(|e| LabError::io("create /run/sshd", e))?;
    let conf = format!(
        "Port {SSHD_PORT}\nListenAddress {listen}\nHostKey {host_key}\nPidFile {dir}/sshd.pid\n\
         AuthorizedKeysFile {authorized}\nPermitRootLogin prohibit-password\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
         AllowTcpForwarding yes\nPermitOpen any\nX11Forwarding no\nPrintMotd no\nUseDNS no\n",
        listen = family.legs.any(),
        host_key = host_key.display(),
        dir = dir.display(),
        authorized = authorized.display(),
    );
    let conf_path = dir.join("sshd_config");
    write_file(&conf_path, conf.as_bytes())?;
    let mut cmd = last.netns().command("/usr/sbin/sshd");
    cmd.arg("-D").arg("-e").arg("-f").arg(&conf_path);
    let mut sshd = Proc::spawn("sshd", last, cmd, dir.join("sshd.log"))?;
    sshd.wait_listening(last, &[SSHD_PORT])?;

    let first_addr = left_addr(first, family.ends)?;
    let last_addr = left_addr(last, family.legs)?;
    // ssh's forwarding spec takes an IPv6 address in brackets.
    let bracket = |a: IpAddr| match a {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    };
    let mut cmd = first.netns().command("ssh");
    cmd.args(["-N", "-F", "/dev/null", "-i"])
        .arg(&client_key)
        .args([
            "-p",
            &SSHD_PORT.to_string(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "GatewayPorts=yes",
            "-o",
            "LogLevel=ERROR",
            "-L",
            &format!(
                "{}:{SSH_FORWARD_PORT}:{}:{HTTP_PORT}",
                bracket(first_addr),
                bracket(server)
            ),
            &format!("root@{last_addr}"),
        ]);
    let mut ssh = Proc::spawn("ssh -L", first, cmd, dir.join("ssh.log"))?;
    ssh.wait_listening(first, &[SSH_FORWARD_PORT])?;
    Ok(Setup {
        base: http_base(first_addr, SSH_FORWARD_PORT),
        note: Some(format!(
            "explicit: the client connects to ssh -L on {} ({}), \
             one SSH session to sshd on {}",
            first.name(),
            SocketAddr::new(first_addr, SSH_FORWARD_PORT),
            last.name()
        )),
        tcp_fastopen: false,
        degraded: None,
        curl_args: Vec::new(),
        agent: None,
        _procs: vec![ssh, sshd],
    })
}

/// The relay's `GET /status` document, fetched inside its namespace.
/// `GET path` from a relay's admin API, inside its namespace.
fn admin_get(relay: &Host, path: &str) -> Result<Vec<u8>, LabError> {
    let url = format!("http://127.0.0.1:{ADMIN_PORT}{path}");
    let out = relay
        .netns()
        .exec("curl", &["-s", "--max-time", "5", &url])
        .map_err(|e| LabError::peer("splitway relay admin", relay.name(), e.to_string()))?;
    Ok(out.stdout)
}

fn relay_status(relay: &Host) -> Result<splitway_api::Status, LabError> {
    let body = admin_get(relay, "/status")?;
    serde_json::from_slice(&body).map_err(|e| {
        LabError::peer(
            "splitway relay admin",
            relay.name(),
            format!("/status is not a relay status: {e}"),
        )
    })
}

/// The splitway binary: `$SPLITWAY_BIN`, else this executable if it is
/// `splitway`, else the `splitway` beside it (the `splitway-lab` binary).
pub(crate) fn splitway_binary() -> Result<PathBuf, LabError> {
    if let Some(path) = std::env::var_os("SPLITWAY_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(LabError::NotBuilt(format!(
                "SPLITWAY_BIN={} is not a file",
                path.display()
            )))
        };
    }
    let exe = std::env::current_exe().map_err(|e| LabError::io("locate the running binary", e))?;
    if exe.file_name().is_some_and(|n| n == "splitway") {
        return Ok(exe);
    }
    // `splitway-lab`: the multi-call front built beside it.
    let sibling = exe.with_file_name("splitway");
    if sibling.is_file() {
        Ok(sibling)
    } else {
        Err(LabError::NotBuilt(format!(
            "no splitway binary beside {} (cargo build -p splitway): run the lab as `splitway lab` or set SPLITWAY_BIN",
            exe.display()
        )))
    }
}

fn random_psk_hex() -> Result<String, LabError> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| LabError::io("read /dev/urandom", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// One relay's config file (see the relay's config documentation).
/// The relay accelerations a configuration switches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Accel {
    /// `default`: no `[accel]` and no tuning sections at all; the relays
    /// decide (the other fields are then unused).
    minimal: bool,
    early_syn: bool,
    /// 0-RTT Hellos on relay legs (every splitway configuration: it is no
    /// acceleration but the handshake itself since issue 13).
    zero_rtt: bool,
    /// TCP Fast Open on the relays' own legs (`tcp_fastopen = 3` on the
    /// relays): from `split+es` on the Hello rides the SYN, so that every
    /// relay, not only the first, starts its next leg at a SYN. Off, the
    /// relays keep the kernel's default (1): the Hello follows the handshake.
    peer_tfo: bool,
    pool: bool,
    tfo: bool,
    turbo: bool,
    /// How the client reaches the first relay.
    ingress: Ingress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ingress {
    /// TPROXY interception of the client's port 80.
    Tproxy,
    /// curl --socks5 to the first relay.
    Socks5,
    /// `splitway agent` on the client, a syn-option listener on the relay.
    Agent,
}

impl Accel {
    fn of(config: Config) -> Accel {
        let (early_syn, pool, turbo, tfo) = match config {
            Config::SplitEs => (true, false, false, false),
            Config::SplitEsPool => (true, true, false, false),
            Config::Full => (true, true, true, false),
            Config::FullTfo => (true, true, true, true),
            Config::Agent => (true, true, false, false),
            // An explicit proxy learns the destination after accept: no
            // early SYN on the first relay.
            Config::Socks5 => (false, true, false, false),
            _ => (false, false, false, false),
        };
        let ingress = match config {
            Config::Socks5 => Ingress::Socks5,
            Config::Agent => Ingress::Agent,
            _ => Ingress::Tproxy,
        };
        Accel {
            minimal: config == Config::Default,
            early_syn,
            zero_rtt: true,
            // The Hello in the relay legs' SYN, as in split+es+pool.
            peer_tfo: early_syn || ingress == Ingress::Socks5,
            pool,
            tfo,
            turbo,
            ingress,
        }
    }
}

/// splitway's congestion control on link `link` of `chain`.
fn leg_congestion(chain: &Chain, link: usize) -> &'static str {
    chain
        .relay_congestion
        .get(link)
        .copied()
        .flatten()
        .map_or(RELAY_CONGESTION, Congestion::name)
}

/// The client's and the server's addresses in the ends' family.
#[derive(Debug, Clone, Copy)]
struct EndAddrs {
    client: IpAddr,
    server: IpAddr,
}

fn relay_config(
    relays: &[Host],
    i: usize,
    psk: &Path,
    accel: Accel,
    chain: &Chain,
    ends: EndAddrs,
    family: Families,
) -> Result<String, LabError> {
    let EndAddrs { client, server } = ends;
    use crate::testbed::config::{
        self as testbed, Intercept, ListenMode, RawAccel, RawListener, RawPeer, RawRoute,
        RawTuning, RawTurbo,
    };
    let relay = &relays[i];
    let turbo_initcwnd = chain.model.turbo_initcwnd;
    // Relay i sits between link i (client side) and link i + 1.
    let right_cc = leg_congestion(chain, i + 1);
    let mut conf = testbed::relay(relay.name(), &format!("127.0.0.1:{ADMIN_PORT}"), Some(psk));
    let any = |port: u16| SocketAddr::new(family.ends.any(), port).to_string();
    let listener = if i == 0 {
        match accel.ingress {
            Ingress::Tproxy => {
                let mut l = RawListener::new(ListenMode::Tproxy, any(TPROXY_PORT));
                l.intercept = Some(Intercept {
                    interfaces: vec![DEV_LEFT.into()],
                    ports: vec![HTTP_PORT],
                });
                l
            }
            Ingress::Socks5 => {
                let mut l = RawListener::new(ListenMode::Socks5, any(SOCKS_PORT));
                l.allow_clients = vec![family.ends.host_prefix(client)];
                l
            }
            // `watch`: the detector reads the destination from the SYN.
            // An IPv6 destination rides the indexed form: its full form
            // does not fit beside Linux's own SYN options.
            Ingress::Agent => {
                let mut l = RawListener::new(ListenMode::SynOption, any(SYNOPT_PORT));
                l.allow_clients = vec![family.ends.host_prefix(client)];
                l.watch = vec![DEV_LEFT.into()];
                if let Some(prefix) = agent_v6_prefix(server) {
                    l.syn_option_prefixes = vec![format!("{AGENT_V6_INDEX}={prefix}")];
                }
                l
            }
        }
    } else {
        // Only the upstream relay may dial in; naming it also lets turbo
        // install the return route at start, before the first (pooled)
        // connection arrives.
        let upstream = family.legs.right(&relays[i - 1]).ok_or_else(|| {
            LabError::Usage(format!(
                "host {} has no server-side link",
                relays[i - 1].name()
            ))
        })?;
        let mut l = RawListener::new(
            ListenMode::Peer,
            SocketAddr::new(family.legs.any(), PEER_PORT).to_string(),
        );
        l.allow_clients = vec![family.legs.host_prefix(upstream)];
        l
    };
    conf.listen.push(listener);
    let via = match relays.get(i + 1) {
        Some(next) => {
            let mut peer = RawPeer::new(
                next.name(),
                SocketAddr::new(left_addr(next, family.legs)?, PEER_PORT).to_string(),
            );
            // The minimal config names no algorithm: its relay legs run
            // what the relay picks by default (the learned window).
            if !accel.minimal {
                peer.congestion = Some(right_cc.into());
            }
            conf.peer.push(peer);
            next.name()
        }
        None => "direct",
    };
    conf.route.push(RawRoute::new("0.0.0.0/0", via));
    conf.route.push(RawRoute::new("::/0", via));
    if accel.minimal {
        // The README's minimal config: listeners, peer, route. Nothing else.
        return Ok(conf.to_toml());
    }
    let cc = |name: &str| RawTuning {
        congestion: Some(name.into()),
        ..RawTuning::default()
    };
    conf.direct = Some(cc(right_cc));
    if i == 0 {
        // The client leg: the relay sends the downloads on these sockets.
        conf.client = Some(cc(leg_congestion(chain, 0)));
    } else {
        // The leg accepted from relay i - 1 (link i): this relay sends the
        // downloads on it.
        conf.upstream = Some(cc(leg_congestion(chain, i)));
    }
    // Every switch explicit: unset ones are on by default.
    conf.accel = Some(RawAccel {
        early_syn: Some(accel.early_syn && i == 0),
        zero_rtt: Some(accel.zero_rtt),
        pool: Some(accel.pool && i + 1 < relays.len()),
        tfo: Some(accel.tfo),
        // Every relay: the dialer installs routes to its peer, the acceptor
        // to its upstream relay, whose direction carries the downloads.
        turbo: accel.turbo.then_some(RawTurbo {
            initcwnd: Some(turbo_initcwnd),
            initrwnd: Some(turbo_initcwnd),
            buffer: Some(TURBO_BUFFER as u64),
        }),
        ..RawAccel::default()
    });
    Ok(conf.to_toml())
}

fn setup_splitway(
    config: Config,
    topo: &Topology,
    server_addr: IpAddr,
    dir: &Path,
    chain: &Chain,
    family: Families,
) -> Result<Setup, LabError> {
    let relays = topo.relays();
    let direct = http_base(server_addr, HTTP_PORT);
    let client = family
        .ends
        .right(topo.client())
        .ok_or_else(|| LabError::Usage("the client has no link".into()))?;
    let accel = Accel::of(config);
    let turbo_initcwnd = chain.model.turbo_initcwnd;
    let bin = splitway_binary()?;
    let psk = dir.join("psk.key");
    write_file(&psk, random_psk_hex()?.as_bytes())?;
    let mut procs = Vec::new();
    for relay in relays {
        let tfo = if accel.peer_tfo || accel.tfo {
            "3"
        } else {
            "1"
        };
        relay
            .netns()
            .sysctl("net.ipv4.tcp_fastopen", tfo)
            .map_err(|e| LabError::peer("sysctl", relay.name(), e.to_string()))?;
    }
    for (i, relay) in relays.iter().enumerate().rev() {
        let conf = relay_config(
            relays,
            i,
            &psk,
            accel,
            chain,
            EndAddrs {
                client,
                server: server_addr,
            },
            family,
        )?;
        let path = dir.join(format!("relay-{}.toml", relay.name()));
        write_file(&path, conf.as_bytes())?;
        let mut cmd = relay.netns().command(&bin.to_string_lossy());
        // Open connections need not drain: the lab's downloads are done.
        cmd.arg("relay")
            .arg("--config")
            .arg(&path)
            .arg("--drain-timeout")
            .arg("1s");
        let mut proc = Proc::spawn(
            "splitway relay",
            relay,
            cmd,
            dir.join(format!("relay-{}.log", relay.name())),
        )?;
        let port = match (i, accel.ingress) {
            (0, Ingress::Tproxy) => TPROXY_PORT,
            (0, Ingress::Socks5) => SOCKS_PORT,
            (0, Ingress::Agent) => SYNOPT_PORT,
            _ => PEER_PORT,
        };
        // The admin port opens once listeners and interception are set up.
        proc.wait_listening(relay, &[port, ADMIN_PORT])?;
        procs.push(proc);
    }
    // Relays start with a feature off when the host cannot provide it (they
    // log a warning); never report such a run under the feature's name.
    procs.reverse(); // client side first, like `relays`
    let mut missing = Vec::new();
    let mut decided = Vec::new();
    for (i, (relay, proc)) in relays.iter().zip(&procs).enumerate() {
        let status = relay_status(relay)?;
        if accel.minimal {
            // What the relay turned on by itself, for the note; early SYN
            // (the intercepting relay) and the pool (every relay with a
            // next relay) are what `default` is modelled with.
            let state = |a: &str| {
                status
                    .accel
                    .get(a)
                    .map_or_else(|| "?".to_owned(), |s| s.state.clone())
            };
            let active: Vec<&str> = ["early_syn", "pool", "zero_rtt", "tfo_peer", "tfo_client"]
                .into_iter()
                .filter(|a| state(a) == "active")
                .collect();
            decided.push(format!("{}: {}", relay.name(), active.join(" ")));
            if i == 0 && state("early_syn") != "active" {
                missing.push(format!("early SYN on {}", relay.name()));
            }
            if i + 1 < relays.len() && state("pool") != "active" {
                missing.push(format!("the connection pool on {}", relay.name()));
            }
            continue;
        }
        if accel.early_syn && i == 0 && status.early_syn.is_none() {
            missing.push(format!(
                "early SYN on {} ({})",
                relay.name(),
                proc.log_line("early SYN")
            ));
        }
        if accel.pool
            && i + 1 < relays.len()
            && status.peers.first().is_none_or(|p| p.pool.is_none())
        {
            missing.push(format!("the connection pool on {}", relay.name()));
        }
        if accel.turbo && relays.len() > 1 && status.features.turbo_start.is_none() {
            missing.push(format!("Turbo-Start on {}", relay.name()));
        }
        // A TFO client and server: the first relay accepts the client's
        // TFO SYN (`tfo_client`), the last opens the server leg with one
        // (`tfo_server`); relays in between have no client or server leg.
        let active = |a: &str| status.accel.get(a).is_some_and(|s| s.state == "active");
        if accel.tfo && i == 0 && !active("tfo_client") {
            missing.push(format!("TFO from the client on {}", relay.name()));
        }
        if accel.tfo && i + 1 == relays.len() && !active("tfo_server") {
            missing.push(format!("TFO to the server on {}", relay.name()));
        }
    }
    let degraded = (!missing.is_empty()).then(|| {
        format!(
            "measured WITHOUT {}: the relay reported it unavailable",
            missing.join(", ")
        )
    });
    let first = left_addr(&relays[0], family.ends)?;
    let socks = SocketAddr::new(first, SOCKS_PORT);
    let (how, curl_args, agent) = match accel.ingress {
        Ingress::Tproxy => (
            format!(
                "transparent: {} intercepts the client's port {HTTP_PORT} with TPROXY",
                relays[0].name()
            ),
            Vec::new(),
            None,
        ),
        Ingress::Socks5 => (
            format!("explicit: curl --socks5 {socks} ({})", relays[0].name()),
            vec!["--socks5".to_owned(), socks.to_string()],
            None,
        ),
        Ingress::Agent => (
            format!(
                "agent: splitway agent on the client redirects connect() to {server_addr} to \
                 {first}:{SYNOPT_PORT} ({}, a syn-option listener; no interception), \
                 the destination in the SYN",
                relays[0].name()
            ),
            Vec::new(),
            Some(AgentGuard::enable(
                &bin,
                dir,
                &agent_route(server_addr, first),
            )?),
        ),
    };
    Ok(Setup {
        base: direct,
        note: Some(format!(
            "{how}{}",
            if accel.minimal {
                format!(
                    "; README's minimal config, relays turned on: {}",
                    decided.join("; ")
                )
            } else if accel.turbo {
                format!("; Turbo-Start initcwnd/initrwnd {turbo_initcwnd} on relay-to-relay legs")
            } else {
                String::new()
            }
        )),
        tcp_fastopen: accel.tfo,
        degraded,
        curl_args,
        agent,
        _procs: procs,
    })
}

/// The index of the server's IPv6 prefix in the agent's route and the
/// relay's `syn_option_prefixes`.
const AGENT_V6_INDEX: u8 = 1;

/// The server's /64, which the agent's IPv6 route and the relay's
/// `syn_option_prefixes` name by index; None for IPv4.
fn agent_v6_prefix(server: IpAddr) -> Option<String> {
    let IpAddr::V6(v6) = server else {
        return None;
    };
    let mut segments = v6.segments();
    segments[4..].fill(0);
    Some(format!("{}/64", std::net::Ipv6Addr::from(segments)))
}

/// `splitway agent --route` sending connections to `server` through the
/// syn-option listener at `relay`: IPv4 in the option's full form, IPv6 in
/// the indexed one (7 + 8 bytes for a /64).
fn agent_route(server: IpAddr, relay: IpAddr) -> String {
    let listener = SocketAddr::new(relay, SYNOPT_PORT);
    match agent_v6_prefix(server) {
        Some(prefix) => format!("{prefix}={listener}#{AGENT_V6_INDEX}"),
        None => format!("{server}/32={listener}"),
    }
}

/// `splitway agent` enabled for a cgroup of its own (curl joins it);
/// disabled and the cgroup removed on drop.
struct AgentGuard {
    bin: PathBuf,
    pin_dir: PathBuf,
    cgroup: PathBuf,
}

impl AgentGuard {
    fn enable(bin: &Path, dir: &Path, route: &str) -> Result<AgentGuard, LabError> {
        let mounts =
            fs::read_to_string("/proc/mounts").map_err(|e| LabError::io("read /proc/mounts", e))?;
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() > 2 && f[2] == "cgroup2")
            .map(|f| PathBuf::from(f[1]))
            .ok_or_else(|| LabError::NotBuilt("agent: no cgroup v2 mount on this host".into()))?;
        let id = std::process::id();
        let cgroup = root.join(format!("splitway-lab-agent-{id}"));
        fs::create_dir(&cgroup)
            .map_err(|e| LabError::io(format!("create cgroup {}", cgroup.display()), e))?;
        // From here the guard removes the cgroup (and the pins) on error.
        let guard = AgentGuard {
            bin: bin.to_owned(),
            pin_dir: PathBuf::from(format!("/sys/fs/bpf/splitway-lab-agent-{id}")),
            cgroup,
        };
        let out = Command::new(&guard.bin)
            .arg("agent")
            .arg("--pin-dir")
            .arg(&guard.pin_dir)
            .arg("enable")
            .arg("--cgroup")
            .arg(&guard.cgroup)
            .args(["--route", route])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| LabError::io("run splitway agent enable", e))?;
        let log = dir.join("agent.log");
        let _ = fs::write(&log, [&out.stdout[..], &out.stderr[..]].concat());
        if !out.status.success() {
            return Err(LabError::peer(
                "splitway agent enable",
                "client",
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        Ok(guard)
    }
}

impl Drop for AgentGuard {
    fn drop(&mut self) {
        let disabled = Command::new(&self.bin)
            .arg("agent")
            .arg("--pin-dir")
            .arg(&self.pin_dir)
            .arg("disable")
            .stdin(Stdio::null())
            .output();
        if let Err(e) = disabled {
            eprintln!("splitway agent disable ({}): {e}", self.pin_dir.display());
        }
        // Every curl in it has exited (each was waited for).
        if let Err(e) = fs::remove_dir(&self.cgroup) {
            eprintln!("remove cgroup {}: {e}", self.cgroup.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_each_family_are_written_as_their_tools_take_them() {
        let v6: IpAddr = "fd77:2::2".parse().unwrap();
        let v4: IpAddr = "10.77.2.2".parse().unwrap();
        assert_eq!(http_base(v6, 80), "http://[fd77:2::2]:80");
        assert_eq!(http_base(v4, 80), "http://10.77.2.2:80");
    }

    fn model_total(c: &Chain, config: Config, size: u64) -> f64 {
        crate::report::Measurement::unmeasured(c, config, size).model_total_ms
    }

    #[test]
    fn the_ipv6_model_takes_a_round_more_where_its_segments_cross_a_boundary() {
        let s = Scenario::load("paper-ktcp").expect("built in");
        let v4 = s.chains[0].over(Families::V4);
        let v6 = s.chains[0].over(Families::V6);
        assert_eq!(v6.model.mss, 1428);
        let e2e = |c: &Chain, size| model_total(c, Config::E2e, size);
        // 100 KB: 70 segments of 1448 fit slow start's first three rounds
        // (10 + 20 + 40), 71 of 1428 do not: one end-to-end RTT (274 ms) more.
        let extra = e2e(&v6, 100_000) - e2e(&v4, 100_000);
        assert!((250.0..300.0).contains(&extra), "{extra} ms");
        // 10 KB fits the first round either way.
        assert!((e2e(&v6, 10_000) - e2e(&v4, 10_000)).abs() < 1.0);
    }

    #[test]
    fn the_agent_names_an_ipv6_server_by_its_prefix_index() {
        let relay: IpAddr = "fd77::2".parse().expect("address");
        let server: IpAddr = "fd77:2::2".parse().expect("address");
        assert_eq!(agent_v6_prefix(server).as_deref(), Some("fd77:2::/64"));
        assert_eq!(
            agent_route(server, relay),
            format!("fd77:2::/64=[fd77::2]:{SYNOPT_PORT}#{AGENT_V6_INDEX}")
        );
        // IPv4 keeps the option's full form: the host itself, no index.
        let relay4: IpAddr = "10.77.0.2".parse().expect("address");
        let server4: IpAddr = "10.77.2.2".parse().expect("address");
        assert_eq!(agent_v6_prefix(server4), None);
        assert_eq!(
            agent_route(server4, relay4),
            format!("10.77.2.2/32=10.77.0.2:{SYNOPT_PORT}")
        );
    }

    #[test]
    fn a_mixed_chain_is_modelled_with_each_legs_segments() {
        let s = Scenario::load("paper-ktcp").expect("built in");
        let chain = &s.chains[0];
        let [v4, v6, v4_over_v6, v6_over_v4] = Families::ALL.map(|f| chain.over(f).into_owned());
        // e2e never crosses a relay leg: the ends' family decides.
        let e2e = |c: &Chain| model_total(c, Config::E2e, 100_000);
        assert!((e2e(&v4_over_v6) - e2e(&v4)).abs() < 1.0);
        assert!((e2e(&v6_over_v4) - e2e(&v6)).abs() < 1.0);
        // `split` slow-starts on every leg: IPv6's 71st segment costs the
        // 215 ms relay leg a round (less what overlaps the client leg's
        // rounds) where the legs carry IPv6. Where only the ends do, the
        // relay leg's 1,448-byte segments still fit three rounds, and the
        // short legs absorb the rest.
        let split = |c: &Chain| model_total(c, Config::Split, 100_000);
        let legs_extra = split(&v4_over_v6) - split(&v4);
        assert!((150.0..240.0).contains(&legs_extra), "{legs_extra} ms");
        let ends_extra = split(&v6_over_v4) - split(&v4);
        assert!(ends_extra.abs() < 40.0, "{ends_extra} ms");
        assert!((split(&v6) - split(&v4_over_v6)).abs() < 5.0);
        // The report and the runner name each run.
        assert_eq!(v4_over_v6.model.relay_leg_mss, Some(1428));
        assert_eq!(v6_over_v4.model.relay_leg_mss, Some(1448));
        assert_eq!(v6.model.relay_leg_mss, None);
        // Turbo-Start's "bdp" window counts the legs' segments:
        // 100 Mbit/s x 215 ms is 1,857 of 1,448 bytes, 1,883 of 1,428.
        assert_eq!(v4.model.turbo_initcwnd, 1857);
        assert_eq!(v6_over_v4.model.turbo_initcwnd, 1857);
        assert_eq!(v6.model.turbo_initcwnd, 1883);
        assert_eq!(v4_over_v6.model.turbo_initcwnd, 1883);
    }

    #[test]
    fn curl_output_parses() {
        let s =
            parse_curl(&["0.032912", "0.548123", "3.210000", "200", "10000000"]).expect("valid");
        assert_eq!(s.http_code, 200);
        assert_eq!(s.size, 10_000_000);
        assert!((s.starttransfer_s - 0.548123).abs() < 1e-9);
        assert!(s.check(10_000_000).is_ok());
        assert!(s.check(10).is_err());
        assert!(parse_curl(&["0.1", "x", "0.3", "200", "1"]).is_none());
        assert!(parse_curl(&["0.1"]).is_none());
    }

    #[test]
    fn accelerations_per_configuration() {
        assert_eq!(
            Accel::of(Config::Split),
            Accel {
                minimal: false,
                early_syn: false,
                zero_rtt: true,
                peer_tfo: false,
                pool: false,
                tfo: false,
                turbo: false,
                ingress: Ingress::Tproxy,
            }
        );
        assert!(Accel::of(Config::Default).minimal && !Accel::of(Config::Split).minimal);
        assert!(Accel::of(Config::SplitEs).peer_tfo && !Accel::of(Config::Split).peer_tfo);
        assert!(Accel::of(Config::SplitEs).early_syn && !Accel::of(Config::SplitEs).pool);
        assert!(Accel::of(Config::SplitEs).zero_rtt && Accel::of(Config::Full).zero_rtt);
        assert!(Accel::of(Config::SplitEsPool).pool && !Accel::of(Config::SplitEsPool).turbo);
        assert!(Accel::of(Config::Full).turbo && !Accel::of(Config::Full).tfo);
        assert!(Accel::of(Config::FullTfo).tfo);
        assert!(availability(Config::E2e).is_ok());
        // Issue 18: both ride split+es+pool's relays; only the agent's
        // first relay can start the next leg at the SYN.
        let (socks5, agent) = (Accel::of(Config::Socks5), Accel::of(Config::Agent));
        assert_eq!(socks5.ingress, Ingress::Socks5);
        assert_eq!(agent.ingress, Ingress::Agent);
        assert!(!socks5.early_syn && agent.early_syn);
        assert!(socks5.pool && agent.pool && socks5.peer_tfo && agent.peer_tfo);
        assert!(!socks5.turbo && !agent.turbo && !socks5.tfo && !agent.tfo);
        assert_eq!(
            Accel {
                ingress: Ingress::Tproxy,
                ..agent
            },
            Accel::of(Config::SplitEsPool)
        );
    }
}
