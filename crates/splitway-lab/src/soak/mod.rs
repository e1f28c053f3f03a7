//! `splitway lab soak`: many concurrent split connections through a relay
//! pair for a long time, every byte verified, and the relays' descriptors
//! and memory compared before, during and after.
//!
//! Namespaces client — rc — rs — server joined by veth pairs (no emulated
//! delay). Each relay host runs `--relay-processes` splitway processes that
//! share its listener (SO_REUSEPORT): a process holds two sockets per
//! connection it carries, and the open-file limit is per process. The
//! client opens `--connections` SOCKS5 connections through rc (rc dials rs,
//! rs dials the server) and keeps every one open until `--duration` is
//! over, with intermittent exchanges of mixed sizes (bytes to MBs), both
//! directions at once: the client's bytes are checked by the server, the
//! server's by the client, each against a pattern derived from a
//! per-exchange seed. Small exchanges run whenever a connection wants; at
//! most `--bulk-slots` larger ones run at once, so the kernel memory the
//! soak's own traffic takes stays bounded (the host's `tcp_mem` is global
//! and shared). Then every connection closes, and the relays must return to
//! their baseline descriptors, and their memory must not grow from one
//! round to the next (`--rounds`). Exits non-zero on any failed check.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use splitway_sys::netns::{self, Netns};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::runner::{LabError, is_root, splitway_binary};

mod host;
mod report;
mod rig;
mod traffic;

use host::*;
use report::*;
use rig::*;
use traffic::*;

const PREFIX: &str = "sws";
// Addresses of the testbed chain (`testbed::chain`, two relays).
const RC_WEST: &str = "10.0.1.2";
const RS_WEST: &str = "10.0.12.2";
const SERVER: &str = "10.0.3.2";
const SOCKS_PORT: u16 = 1080;
const PEER_PORT: u16 = 7100;
const SERVER_PORT: u16 = 5001;
/// Admin port of a host's first relay process; the next ones count up.
const ADMIN_BASE_PORT: u16 = 9090;
/// Longest the ramp (every connection set up) may take.
const RAMP_LIMIT: Duration = Duration::from_secs(300);
/// Connection setups in progress at once (keeps SYN queues from overflowing).
const SETUP_CONCURRENCY: usize = 256;
/// Descriptors a relay needs beyond two per connection: listeners, admin,
/// epoll, and splice pipes held while bytes are in flight.
const RELAY_FD_HEADROOM: u64 = 400;
/// Descriptors a relay may hold after the run beyond its baseline besides
/// its splice pipe cache (bounded per thread, see [`fd_margin`]).
const FD_SLACK: u64 = 16;
/// Memory a relay may keep after the run beyond its baseline: allocator
/// caches, not per-connection state (10,000 connections leaking even 1 KiB
/// each would exceed it).
const RSS_MARGIN: u64 = 16 * 1024 * 1024;
/// Largest socket buffer (tcp_rmem/tcp_wmem max) in the soak's namespaces.
/// Veth legs without delay need little (this is many BDPs); the defaults
/// (6–32 MiB) let tens of thousands of sockets exhaust the host's tcp_mem.
const SOCKET_BUFFER_MAX: u64 = 256 * 1024;
/// An exchange moving at most this much (both directions) needs no bulk
/// slot: small messages flow freely and keep every connection in use.
const SMALL_EXCHANGE: u64 = 4096;
/// How long after a round's end its connections may take to finish their
/// exchange and close; beyond it they count as stalled (an error).
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// Descriptors a generator process needs beyond one socket per connection.
const GENERATOR_FD_HEADROOM: u64 = 256;
/// Share of connections one relay process may get above an even split:
/// SO_REUSEPORT spreads them by hash, not exactly evenly.
const REUSEPORT_SKEW_PERCENT: u64 = 10;

/// `splitway lab soak` options.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Concurrent split connections, all open for the whole run.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// How long the connections keep exchanging data (e.g. 120s, 10m).
    #[arg(long, default_value = "10m", value_parser = splitway_control::params::duration_arg)]
    pub duration: Duration,
    /// Rounds: each opens every connection, exchanges for duration/rounds,
    /// closes them all; relay memory after each round shows a leak (growth)
    /// apart from allocator retention (a plateau).
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Mean pause between two exchanges on one connection, in ms.
    #[arg(long, default_value_t = 1000)]
    pub pause_ms: u64,
    /// Largest transfer of one exchange in one direction (bytes).
    #[arg(long, default_value_t = 2 * 1024 * 1024)]
    pub max_size: u64,
    /// splitway processes per relay host, sharing its listener with
    /// SO_REUSEPORT (each holds two sockets per connection it carries, and
    /// the open-file limit is per process).
    #[arg(long, default_value_t = 2)]
    pub relay_processes: usize,
    /// Exchanges larger than 4 KiB running at once over all connections
    /// (the others wait their turn): bounds the kernel socket memory the
    /// soak's own traffic takes.
    #[arg(long, default_value_t = 128)]
    pub bulk_slots: usize,
    /// Also write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Internal: run only the soak's server (inside the server namespace,
    /// in its own process so that each side has its own descriptor limit).
    #[arg(long, hide = true)]
    pub serve: bool,
}

/// Descriptors and memory of one relay at one moment.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Resources {
    pub fds: u64,
    pub rss_bytes: u64,
}

/// Descriptors a relay may keep after every connection closed: each of
/// its threads may cache up to `POOL_PER_THREAD` empty pipes (two
/// descriptors each) for reuse, plus a little slack.
fn fd_margin(pid: u32) -> u64 {
    let threads = fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(1);
    threads * 2 * splitway_sys::splice::POOL_PER_THREAD as u64 + FD_SLACK
}

fn resources(pid: u32) -> Option<Resources> {
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(Resources {
        fds,
        rss_bytes: kib * 1024,
    })
}

/// One relay process's figures over the run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RelayFigures {
    /// `rc1`, `rc2`, `rs1`, ...
    pub name: String,
    /// `rc` or `rs`.
    pub host: String,
    pub baseline: Resources,
    pub peak: Resources,
    pub after: Resources,
    /// After each round, every connection closed.
    pub after_rounds: Vec<Resources>,
    pub peak_connections_open: u64,
}

/// One relay host's processes together: sums taken at the same sample.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HostFigures {
    pub name: String,
    pub processes: usize,
    pub baseline: Resources,
    pub peak: Resources,
    pub after: Resources,
}

/// The host's TCP memory (`/proc/net/sockstat` "mem", in pages; global to
/// the kernel, so other work on the host counts too) against `tcp_mem`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TcpMemory {
    /// `net.ipv4.tcp_mem`: below, pressure, high (pages).
    pub tcp_mem: [u64; 3],
    pub baseline_pages: u64,
    pub peak_pages: u64,
    /// Sockets allocated host-wide at the TCP memory peak.
    pub sockets_at_peak: u64,
    /// Samples at or above the pressure threshold.
    pub samples_over_pressure: u64,
}

/// TcpExt counters of one soak namespace after the run (memory trouble
/// shows here: pressure entered, receive queue drops, pruning).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NamespaceCounters {
    pub namespace: String,
    pub memory_pressures: u64,
    pub rcvq_drops: u64,
    pub prune_called: u64,
    pub abort_on_memory: u64,
}

/// What a soak run did and saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SoakReport {
    pub connections_requested: usize,
    pub connections_made: u64,
    pub peak_concurrent: u64,
    pub duration_s: f64,
    pub ramp_s: f64,
    pub exchanges: u64,
    pub bytes_checked: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub relays: Vec<RelayFigures>,
    pub hosts: Vec<HostFigures>,
    pub tcp_memory: TcpMemory,
    pub namespaces: Vec<NamespaceCounters>,
    /// Load average (1, 5, 15 min) at the start and at the end.
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub failures: Vec<String>,
    pub notes: Vec<String>,
}

/// Runs `splitway lab soak`.
pub fn run(args: SoakArgs) -> Result<(), LabError> {
    if args.serve {
        return serve_process(args.connections);
    }
    if !is_root() {
        return Err(LabError::NotRoot);
    }
    if args.connections == 0
        || args.max_size == 0
        || args.relay_processes == 0
        || args.bulk_slots == 0
    {
        return Err(LabError::Usage(
            "--connections, --max-size, --relay-processes and --bulk-slots must be positive".into(),
        ));
    }
    let report = soak(&args)?;
    print_report(&report, &args);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("soak report serialises");
        fs::write(path, text).map_err(|e| LabError::io(format!("write {}", path.display()), e))?;
        println!("JSON: {}", path.display());
    }
    if report.failures.is_empty() {
        Ok(())
    } else {
        Err(LabError::Soak(report.failures.join("; ")))
    }
}

/// One splitway process of a relay host.
fn soak(args: &SoakArgs) -> Result<SoakReport, LabError> {
    let binary = splitway_binary()?;
    let nofile = raise_nofile(args.connections, Some(args.relay_processes))?;
    let tcp_mem = tcp_mem_limits();
    let mut report = SoakReport {
        connections_requested: args.connections,
        loadavg_start: loadavg(),
        tcp_memory: TcpMemory {
            tcp_mem,
            ..TcpMemory::default()
        },
        ..SoakReport::default()
    };
    let (mem_now, _) = tcp_sockstat().unwrap_or_default();
    report.tcp_memory.baseline_pages = mem_now;
    println!(
        "soak: {} connections for {:?} through rc → rs (SOCKS5), {} relay processes per host, {} bulk slots, \
         open-file limit {nofile}; host TCP memory {mem_now} pages (tcp_mem {} {} {}); load average {}",
        args.connections,
        args.duration,
        args.relay_processes,
        args.bulk_slots,
        tcp_mem[0],
        tcp_mem[1],
        tcp_mem[2],
        report.loadavg_start
    );
    let mut rig = Rig::build(&binary, args.relay_processes)?;
    rig.start_server(&binary, args.connections)?;
    let mut figures: Vec<RelayFigures> = rig
        .relays
        .iter()
        .map(|r| -> Result<RelayFigures, LabError> {
            let baseline = rig.sample(&r.name)?;
            Ok(RelayFigures {
                name: r.name.clone(),
                host: r.host.into(),
                baseline,
                peak: baseline,
                ..RelayFigures::default()
            })
        })
        .collect::<Result<_, _>>()?;
    let host_sum =
        |figures: &[RelayFigures], host: &str, pick: &dyn Fn(&RelayFigures) -> Resources| {
            figures.iter().filter(|f| f.host == host).map(pick).fold(
                Resources::default(),
                |a, b| Resources {
                    fds: a.fds + b.fds,
                    rss_bytes: a.rss_bytes + b.rss_bytes,
                },
            )
        };
    let mut hosts: Vec<HostFigures> = ["rc", "rs"]
        .iter()
        .map(|h| {
            let baseline = host_sum(&figures, h, &|f| f.baseline);
            HostFigures {
                name: h.to_string(),
                processes: args.relay_processes,
                baseline,
                peak: baseline,
                after: Resources::default(),
            }
        })
        .collect();

    let counters = Arc::new(Counters::default());
    let args_shared = Arc::new(args.clone());
    let started = Instant::now();
    let rounds = args.rounds.max(1);
    let round_time = args.duration / rounds;
    // Round boundaries: the load thread says a round's connections are all
    // closed and waits until the relays have been measured.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<u32>();
    let (next_tx, next_rx) = std::sync::mpsc::channel::<()>();
    let load_body = {
        let counters = counters.clone();
        let args = args_shared.clone();
        move || -> Result<f64, String> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| format!("tokio runtime: {e}"))?;
            rt.block_on(async move {
                let mut longest_ramp = 0f64;
                let bulk = Arc::new(Semaphore::new(args.bulk_slots));
                for round in 0..rounds {
                    let setup = Arc::new(Semaphore::new(SETUP_CONCURRENCY));
                    let (go_tx, go_rx) = tokio::sync::watch::channel(None);
                    let first = round as u64 * args.connections as u64;
                    let tasks: Vec<_> = (first..first + args.connections as u64)
                        .map(|id| {
                            tokio::spawn(client_conn(
                                id,
                                args.clone(),
                                setup.clone(),
                                bulk.clone(),
                                counters.clone(),
                                go_rx.clone(),
                            ))
                        })
                        .collect();
                    // Ramp: every connection set up (or failed), then the
                    // round's exchanges start.
                    let ramp_started = Instant::now();
                    let target = (round as u64 + 1) * args.connections as u64;
                    let ramp = loop {
                        let done = counters.made.load(Relaxed) + counters.setup_errors.load(Relaxed);
                        if done >= target {
                            break ramp_started.elapsed().as_secs_f64();
                        }
                        if ramp_started.elapsed() > RAMP_LIMIT {
                            counters.error(format!(
                                "round {round}: only {done} of {target} connections set up after {RAMP_LIMIT:?}"
                            ));
                            break ramp_started.elapsed().as_secs_f64();
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    };
                    longest_ramp = longest_ramp.max(ramp);
                    let _ = go_tx.send(Some(Instant::now() + round_time));
                    for t in tasks {
                        if let Err(e) = t.await {
                            counters.error(format!("connection task panicked: {e}"));
                        }
                    }
                    if done_tx.send(round).is_err() || next_rx.recv().is_err() {
                        return Err("the sampler went away".into());
                    }
                }
                Ok(longest_ramp)
            })
        }
    };

    let ramp = std::thread::scope(|scope| -> Result<f64, LabError> {
        // The runtime is built inside the client namespace: its worker
        // threads inherit it, so every client socket is created there.
        let client = &rig.client;
        let load = scope.spawn(move || client.run_in(load_body));
        // Sample the relays and the host's TCP memory while the load runs.
        let mut last_print = Instant::now();
        while !load.is_finished() {
            let mut now_by_process = Vec::with_capacity(figures.len());
            for f in &mut figures {
                let now = rig.sample(&f.name)?;
                f.peak.fds = f.peak.fds.max(now.fds);
                f.peak.rss_bytes = f.peak.rss_bytes.max(now.rss_bytes);
                if let Some(open) = rig.connections_open(&f.name) {
                    f.peak_connections_open = f.peak_connections_open.max(open);
                }
                now_by_process.push((f.host.clone(), now));
            }
            for h in &mut hosts {
                let (fds, rss) = now_by_process
                    .iter()
                    .filter(|(host, _)| *host == h.name)
                    .fold((0, 0), |(fds, rss), (_, r)| {
                        (fds + r.fds, rss + r.rss_bytes)
                    });
                h.peak.fds = h.peak.fds.max(fds);
                h.peak.rss_bytes = h.peak.rss_bytes.max(rss);
            }
            if let Some((pages, sockets)) = tcp_sockstat() {
                let m = &mut report.tcp_memory;
                if pages > m.peak_pages {
                    m.peak_pages = pages;
                    m.sockets_at_peak = sockets;
                }
                if m.tcp_mem[1] > 0 && pages >= m.tcp_mem[1] {
                    m.samples_over_pressure += 1;
                }
            }
            if let Ok(round) = done_rx.try_recv() {
                after_round(&rig, &mut figures, &mut report, round)?;
                let _ = next_tx.send(());
            }
            if last_print.elapsed() >= Duration::from_secs(10) {
                last_print = Instant::now();
                let procs: Vec<String> = figures
                    .iter()
                    .zip(&now_by_process)
                    .map(|(f, (_, r))| {
                        format!(
                            "{} {} fds {:.0} MiB",
                            f.name,
                            r.fds,
                            r.rss_bytes as f64 / 1048576.0
                        )
                    })
                    .collect();
                println!(
                    "  {:>5.0} s: {} open, {} exchanges, {:.2} GB checked, {} errors; TCP mem {} pages (peak {}); {}; load {}",
                    started.elapsed().as_secs_f64(),
                    counters.open.load(Relaxed),
                    counters.exchanges.load(Relaxed),
                    counters.bytes.load(Relaxed) as f64 / 1e9,
                    counters.errors.load(Relaxed),
                    tcp_sockstat().map(|(p, _)| p).unwrap_or(0),
                    report.tcp_memory.peak_pages,
                    procs.join(", "),
                    loadavg(),
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        load.join()
            .map_err(|_| LabError::Soak("the load generator panicked".into()))?
            .map_err(|e| sys("enter client namespace", e))?
            .map_err(LabError::Soak)
    })?;
    report.duration_s = started.elapsed().as_secs_f64();
    report.ramp_s = ramp;
    report.loadavg_end = loadavg();
    report.namespaces = [
        ("client", &rig.client),
        ("rc", &rig.rc),
        ("rs", &rig.rs),
        ("server", &rig.server),
    ]
    .iter()
    .map(|(label, ns)| namespace_counters(label, ns))
    .collect();

    for f in &mut figures {
        let after = f.after_rounds.last().copied().unwrap_or_default();
        f.after = after;
        let margin = fd_margin(rig.pid(&f.name));
        if after.fds > f.baseline.fds + margin {
            report.failures.push(format!(
                "{}: {} descriptors open after the run, baseline {} (margin {margin}: pipe cache + slack)",
                f.name, after.fds, f.baseline.fds
            ));
        }
        // Growth from one round to the next is a leak.
        if let (Some(first), Some(last)) = (f.after_rounds.first(), f.after_rounds.last())
            && last.rss_bytes > first.rss_bytes + RSS_MARGIN
        {
            report.failures.push(format!(
                "{}: RSS after round 1 {} B, after the last round {} B (margin {RSS_MARGIN} B): memory grows round after round",
                f.name, first.rss_bytes, last.rss_bytes
            ));
        }
        // The relay hands free heap back once idle, so what stays above
        // the baseline is memory still held.
        if after.rss_bytes > f.baseline.rss_bytes + RSS_MARGIN {
            report.failures.push(format!(
                "{}: RSS after the run {:.1} MiB, {:.1} MiB over the baseline (margin {RSS_MARGIN} B)",
                f.name,
                after.rss_bytes as f64 / 1048576.0,
                (after.rss_bytes - f.baseline.rss_bytes) as f64 / 1048576.0
            ));
        }
        // Every process must have carried a share: otherwise the listener
        // was not shared and the other process carried everything.
        if args.relay_processes > 1 && f.peak_connections_open == 0 {
            report.failures.push(format!(
                "{}: carried no connection (SO_REUSEPORT listener not shared?)",
                f.name
            ));
        }
    }
    for h in &mut hosts {
        h.after = host_sum(&figures, &h.name, &|f| f.after);
    }

    report.connections_made = counters.made.load(Relaxed);
    report.peak_concurrent = counters.peak_open.load(Relaxed);
    report.exchanges = counters.exchanges.load(Relaxed);
    report.bytes_checked = counters.bytes.load(Relaxed);
    report.errors = counters.errors.load(Relaxed);
    report.first_errors = counters.first_errors.lock().expect("errors lock").clone();
    report.relays = figures;
    report.hosts = hosts;
    if report.errors > 0 {
        report
            .failures
            .insert(0, format!("{} connection errors", report.errors));
    }
    if report.connections_made < args.connections as u64 * u64::from(args.rounds.max(1)) {
        report.failures.push(format!(
            "only {} of {} connections were made",
            report.connections_made,
            args.connections as u64 * u64::from(args.rounds.max(1))
        ));
    }
    if report.peak_concurrent < args.connections as u64 {
        report.failures.push(format!(
            "at most {} connections were open at once, not {}",
            report.peak_concurrent, args.connections
        ));
    }
    if report.exchanges < report.connections_made {
        report.failures.push(format!(
            "{} exchanges for {} connections: some connection carried no data",
            report.exchanges, report.connections_made
        ));
    }
    let m = &report.tcp_memory;
    if m.samples_over_pressure > 0 {
        report.notes.push(format!(
            "host TCP memory reached the pressure threshold ({} pages) in {} samples; peak {} pages",
            m.tcp_mem[1], m.samples_over_pressure, m.peak_pages
        ));
    }
    for c in &report.namespaces {
        if c.memory_pressures > 0 || c.rcvq_drops > 0 || c.abort_on_memory > 0 {
            report.notes.push(format!(
                "{}: TCPMemoryPressures {}, TCPRcvQDrop {}, PruneCalled {}, TCPAbortOnMemory {}",
                c.namespace, c.memory_pressures, c.rcvq_drops, c.prune_called, c.abort_on_memory
            ));
        }
    }
    let mut rig = rig;
    rig.keep = !report.failures.is_empty();
    drop(rig);
    Ok(report)
}
