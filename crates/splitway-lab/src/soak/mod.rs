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
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::runner::{LabError, is_root, splitway_binary};

mod host;
mod report;
mod rig;
mod spec;
mod traffic;

use host::*;
use report::*;
use rig::*;
use spec::*;
use traffic::*;

pub use spec::SoakArgs;

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
