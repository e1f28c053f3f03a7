//! `splitway lab bench`: splitway against direct TCP, HAProxy (TCP mode,
//! splice) and socat on loopback inside a fresh network namespace, in one
//! run, methods interleaved per round; reports medians of per-round ratios.
//!
//! - `load`: backend servers and load generators (blocking sockets)
//! - `procs`: the proxies as child processes and /proc accounting
//! - `stats`: percentiles and medians of ratios
//! - `plan`: options, durations, counts; `error`: how it fails
//! - `report`: terminal table, JSON and the README markdown

mod error;
pub mod load;
pub mod loadgen;
mod plan;
mod procs;
mod report;
pub mod stats;

use std::path::PathBuf;
use std::time::Instant;

use splitway_sys::netns::{self, Netns};

use crate::runner::{LabError, is_root};
pub use error::BenchError;
pub use plan::{BenchArgs, FIXED_RATE, IDLE_CONNECTIONS, Plan, RESULTS_DIR};
use procs::{Instance, Launcher, Method, Targets};
pub use report::{BenchReport, Sample};

/// Runs `splitway lab bench`.
pub fn run(args: BenchArgs) -> Result<(), LabError> {
    if !is_root() {
        return Err(LabError::NotRoot);
    }
    let plan = Plan::new(&args);
    let splitway_bin = crate::runner::splitway_binary()?;
    let nofile = raise_nofile()?;
    let mut plan = plan;
    // The bench process holds both ends of every idle connection (client
    // and backend), a relay two sockets per connection plus the 1,024 it
    // keeps in reserve: all must fit.
    let fitting = (nofile.saturating_sub(1_100) / 2) as usize;
    plan.idle_connections = IDLE_CONNECTIONS.min(fitting);
    let mut report = BenchReport::begin(&plan, &args);
    netns::remove_stale("swbn");
    let ns = Netns::create(&netns::unique_name("swbn")).map_err(BenchError::from)?;
    // Enough ports and TIME_WAIT slots for a million short connections;
    // the fixed listen ports (9001-9003, 20000-21499) stay below the range.
    ns.sysctl("net.ipv4.ip_local_port_range", "25000 65000")
        .map_err(BenchError::from)?;
    ns.sysctl("net.ipv4.tcp_max_tw_buckets", "20000")
        .map_err(BenchError::from)?;
    let dir = std::env::temp_dir().join(ns.name());
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io {
        op: format!("create {}", dir.display()),
        source,
    })?;
    let work_dir = dir.clone();
    let outcome = ns
        .run_in(move || measure(plan, splitway_bin, work_dir))
        .map_err(BenchError::from);
    drop(ns);
    // Configs and the key of this run only; nothing else lives there.
    let _ = std::fs::remove_dir_all(&dir);
    let (samples, mut notes) = outcome??;
    if plan.idle_connections < IDLE_CONNECTIONS {
        notes.push(format!(
            "idle connections: {} instead of {IDLE_CONNECTIONS}: RLIMIT_NOFILE is {nofile} and cannot be raised here",
            plan.idle_connections
        ));
    }
    report.finish(samples, notes);
    println!("{}", report.render_table());
    let written = report.write_files(args.json.as_deref())?;
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (children
/// inherit it, the relays included) with prlimit(1), which keeps this crate
/// free of `unsafe`; returns the limit in force. Raising the hard limit needs
/// CAP_SYS_RESOURCE, which a container may not grant.
fn raise_nofile() -> Result<u64, LabError> {
    let pid = std::process::id();
    let (soft, hard) = procs::nofile_limits(pid).unwrap_or((1024, 1024));
    let wanted = hard.min(65_536);
    if soft >= wanted {
        return Ok(soft);
    }
    netns::run(std::process::Command::new("prlimit").args([
        "--pid",
        &pid.to_string(),
        &format!("--nofile={wanted}:{hard}"),
    ]))
    .map_err(|e| LabError::Peer {
        tool: "prlimit".into(),
        host: "local".into(),
        detail: e.to_string(),
    })?;
    Ok(procs::nofile_limits(pid).map_or(wanted, |(soft, _)| soft))
}

/// Front ports of the long-lived instances and of the fresh ones started
/// each round for start-up and idle-memory measurements.
fn base_port(method: Method, fresh: bool) -> u16 {
    let index = Method::EVERY.iter().position(|m| *m == method).unwrap_or(0) as u16;
    20_000 + index * 100 + if fresh { 1_000 } else { 0 }
}

fn measure(
    plan: Plan,
    splitway_bin: PathBuf,
    dir: PathBuf,
) -> Result<(Vec<Sample>, Vec<String>), BenchError> {
    let io_err = |op: &str| {
        let op = op.to_owned();
        move |source| BenchError::Io { op, source }
    };
    let backends = load::Backends::start(9001, 9002, 9003).map_err(io_err("backend servers"))?;
    let psk_file = dir.join("psk.key");
    let key = netns::run(std::process::Command::new(&splitway_bin).arg("keygen")).map_err(|e| {
        BenchError::Tool {
            tool: "splitway keygen".into(),
            detail: e.to_string(),
        }
    })?;
    std::fs::write(&psk_file, &key.stdout).map_err(io_err("write psk"))?;
    let launcher = Launcher {
        splitway_bin,
        dir,
        targets: Targets {
            sink: backends.sink,
            echo: backends.echo,
            conn: backends.conn,
        },
        psk_file,
        max_connections: plan.idle_connections + 20,
    };
    let ticks = procs::clock_ticks();
    let mut notes = Vec::new();
    let mut instances = Vec::new();
    // The footprint alone needs only the fresh instances started per round.
    if !plan.footprint_only {
        for method in plan.methods() {
            instances.push(launcher.start(method, base_port(method, false))?);
        }
    }
    if let Some(pid) = instances
        .iter()
        .find(|i| i.method == Method::Splitway1)
        .and_then(|i| i.pids().first().copied())
    {
        notes.push(format!(
            "relay RLIMIT_NOFILE (soft): {}",
            procs::nofile_limits(pid).map_or("unknown".into(), |(soft, _)| soft.to_string())
        ));
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    for round in 0..plan.rounds {
        let mut order: Vec<&Instance> = instances.iter().collect();
        let mut methods = Method::ALL;
        let shift = round as usize % methods.len();
        if !order.is_empty() {
            order.rotate_left(shift);
        }
        methods.rotate_left(shift);
        eprintln!(
            "round {}/{} ({:.0} s so far)",
            round + 1,
            plan.rounds,
            started.elapsed().as_secs_f64()
        );
        let mut push = |method: Method, metric: &str, value: f64| {
            samples.push(Sample {
                round,
                method: method.name().into(),
                metric: metric.into(),
                value,
            });
        };
        for method in methods {
            fresh_instance(&launcher, method, plan, &mut push)?;
        }
        if plan.footprint_only {
            continue;
        }
        for streams in [1usize, 8] {
            for inst in &order {
                bulk_test(inst, streams, plan, ticks, &mut push)?;
            }
        }
        for size in [64usize, 1024] {
            for inst in &order {
                let (count, latencies) = load::request_response(inst.echo, size, plan.test_time)
                    .map_err(tool_err(inst.method, "request/response"))?;
                let key = if size == 64 { "rr64" } else { "rr1k" };
                push(
                    inst.method,
                    &format!("{key}_tps"),
                    count as f64 / plan.test_time.as_secs_f64(),
                );
                push_percentiles(&mut push, inst.method, key, &latencies);
            }
        }
        for inst in &order {
            let (rate, latencies, failures) =
                load::connection_rate(inst.conn, plan.conn_threads, plan.test_time);
            push(inst.method, "conn_rate", rate);
            push(inst.method, "conn_failures", failures as f64);
            push_percentiles(&mut push, inst.method, "conn", &latencies);
        }
        for inst in &order {
            let (rate, latencies, failures) =
                load::fixed_rate(inst.conn, FIXED_RATE, plan.fixed_time);
            push(inst.method, "fixed_rate", rate);
            push(inst.method, "fixed_failures", failures as f64);
            push_percentiles(&mut push, inst.method, "fixed", &latencies);
        }
    }
    drop(instances);
    drop(backends);
    notes.push(format!(
        "measured in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok((samples, notes))
}

fn tool_err(method: Method, what: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |e| BenchError::Tool {
        tool: method.name().into(),
        detail: format!("{what}: {e}"),
    }
}

fn push_percentiles(
    push: &mut impl FnMut(Method, &str, f64),
    method: Method,
    key: &str,
    latencies_us: &[f64],
) {
    for (name, p) in [("p50", 50.0), ("p99", 99.0), ("p999", 99.9)] {
        if let Some(v) = stats::percentile(latencies_us, p) {
            push(method, &format!("{key}_{name}_us"), v);
        }
    }
}

/// A fresh instance: exec → listening time, idle RSS, then RSS per idle
/// proxied connection with `plan.idle_connections` open.
fn fresh_instance(
    launcher: &Launcher,
    method: Method,
    plan: Plan,
    push: &mut impl FnMut(Method, &str, f64),
) -> Result<(), BenchError> {
    if method == Method::Direct {
        return Ok(());
    }
    let inst = launcher.start(method, base_port(method, true))?;
    let pids = inst.pids();
    if let Some(startup) = inst.startup {
        push(method, "startup_ms", startup.as_secs_f64() * 1e3);
    }
    let idle = procs::sum_rss(&pids);
    push(method, "idle_rss_bytes", idle as f64);
    // RSS per active bulk connection: 8 streams through the fresh instance
    // (a warmed-up one reuses buffers it already holds), sampled half-way.
    const STREAMS: usize = 8;
    let sampler_pids = pids.clone();
    let bulk_time = plan.test_time / 2;
    let sampler = std::thread::spawn(move || {
        std::thread::sleep(bulk_time / 2);
        procs::sum_rss(&sampler_pids)
    });
    load::bulk(inst.sink, STREAMS, bulk_time).map_err(tool_err(method, "bulk"))?;
    let busy = sampler.join().unwrap_or(idle);
    push(
        method,
        "bulk8_rss_per_conn_bytes",
        busy.saturating_sub(idle) as f64 / STREAMS as f64,
    );
    let idle = procs::sum_rss(&pids);
    // socat forks a process per connection: 10,000 of them would measure
    // the machine, not socat.
    if method == Method::Socat {
        return Ok(());
    }
    let open = load::open_idle(inst.conn, plan.idle_connections)
        .map_err(tool_err(method, "idle connections"))?;
    let loaded = procs::sum_rss(&pids);
    push(
        method,
        "idle_conn_bytes",
        loaded.saturating_sub(idle) as f64 / open.len() as f64,
    );
    drop(open);
    Ok(())
}

fn bulk_test(
    inst: &Instance,
    streams: usize,
    plan: Plan,
    ticks: f64,
    push: &mut impl FnMut(Method, &str, f64),
) -> Result<(), BenchError> {
    let pids = inst.pids();
    let cpu_before = procs::sum_cpu(&pids);
    let result =
        load::bulk(inst.sink, streams, plan.test_time).map_err(tool_err(inst.method, "bulk"))?;
    let cpu = (procs::sum_cpu(&pids).saturating_sub(cpu_before)) as f64 / ticks;
    let key = if streams == 1 { "bulk1" } else { "bulk8" };
    let gb = result.bytes as f64 / 1e9;
    push(
        inst.method,
        &format!("{key}_gbps"),
        gb * 8.0 / result.elapsed.as_secs_f64(),
    );
    if inst.method != Method::Direct {
        push(inst.method, &format!("{key}_cpu_s_per_gb"), cpu / gb);
    }
    Ok(())
}
