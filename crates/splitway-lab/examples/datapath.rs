//! The data-path study (issue #5 item 2, docs/data-path.md): one proxied
//! connection pair forwarded by splitway's own epoll forwarder
//! (`splitway_relay::forward::forward` with `data_path` auto / splice /
//! copy) against the io_uring forwarder of `splitway_sys::uring` (linked
//! splice, recv/send with provided buffers), side by side in one run on
//! loopback, methods interleaved per round (order rotated each round).
//!
//! `cargo run --release -p splitway-lab --example datapath -- [--rounds N] [--secs S]
//! [--methods a,b] [--tests bulk1,bulk8,rr64,rr1k]`
//!
//! Every forwarder is a child process (this binary, `serve METHOD`) on one
//! thread, so its CPU (utime+stime of every thread, io-wq workers
//! included) is measured from /proc alone. Load generators and backends are
//! those of `splitway lab bench`. Raw samples go to
//! bench-results/datapath-<time>-<commit>.json.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use splitway_lab::bench::load::{self, Access, Backends};
use splitway_lab::bench::stats::{median, median_of_ratios};
use splitway_sys::uring::{UringConfig, UringEvent, UringForwarder, UringMode};

const METHODS: &[&str] = &[
    "direct",
    "epoll-auto",
    "epoll-splice",
    "epoll-copy",
    "uring-splice",
    "uring-recvsend",
    "uring-recvsend-nodefer",
];
const TESTS: &[&str] = &["bulk1", "bulk8", "rr64", "rr1k", "idle"];
/// Run unless `--tests` names them.
const DEFAULT_TESTS: &[&str] = &["bulk1", "bulk8", "rr64", "rr1k"];
/// Connections held open by the `idle` test.
const IDLE_CONNS: usize = 1000;
/// Ratios are taken against splitway's default data path.
const BASELINE: &str = "epoll-auto";

#[derive(Serialize, Clone)]
struct Sample {
    round: u32,
    method: String,
    test: String,
    /// Gbit/s for bulk, transactions/s for request/response.
    value: f64,
    bytes: u64,
    /// CPU seconds of the forwarder process during the test.
    cpu_s: Option<f64>,
    cpu_s_per_gb: Option<f64>,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    forwarder_rss_kib: Option<u64>,
    forwarder_threads: Option<u64>,
    /// `idle`: descriptors the forwarder holds per idle connection.
    fds_per_conn: Option<f64>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        if let Err(e) = serve(&args[1..]) {
            eprintln!("datapath serve: {e}");
            std::process::exit(1);
        }
        return;
    }
    let arg = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = arg("--rounds", 5) as u32;
    let secs = Duration::from_secs(arg("--secs", 2));
    let list = |name: &str, all: &[&'static str]| -> Vec<&'static str> {
        match args
            .iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
        {
            Some(v) => all
                .iter()
                .copied()
                .filter(|m| v.split(',').any(|x| x == *m))
                .collect(),
            None if name == "--tests" => DEFAULT_TESTS.to_vec(),
            None => all.to_vec(),
        }
    };
    let methods = list("--methods", METHODS);
    let tests = list("--tests", TESTS);
    if let Err(e) = study(&methods, &tests, rounds, secs) {
        eprintln!("datapath: {e}");
        std::process::exit(1);
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn proc_field(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// utime+stime of the whole thread group, in seconds.
fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ, the unit of /proc stat times, is 100 on Linux x86-64.
    Some(ticks as f64 / 100.0)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

struct Forwarder {
    child: Child,
    sink: SocketAddr,
    echo: SocketAddr,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_forwarder(method: &str, b: &Backends) -> std::io::Result<Forwarder> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", method, &b.sink.to_string(), &b.echo.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line)?;
    let ports: Vec<u16> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|p| p.parse().ok())
        .collect();
    if !line.starts_with("ready") || ports.len() != 2 {
        let _ = child.kill();
        return Err(std::io::Error::other(format!(
            "{method}: forwarder did not start: {line:?}"
        )));
    }
    Ok(Forwarder {
        child,
        sink: ([127, 0, 0, 1], ports[0]).into(),
        echo: ([127, 0, 0, 1], ports[1]).into(),
    })
}

fn study(
    methods: &[&str],
    tests: &[&str],
    rounds: u32,
    secs: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let started = std::time::SystemTime::now();
    let load_start = loadavg();
    let backends = Backends::start(0, 0, 0)?;
    let mut samples: Vec<Sample> = Vec::new();
    for round in 0..rounds {
        let n = methods.len();
        for k in 0..n {
            let method = methods[(k + round as usize) % n];
            let fw = if method == "direct" {
                None
            } else {
                Some(spawn_forwarder(method, &backends)?)
            };
            let (sink, echo) = match &fw {
                Some(f) => (f.sink, f.echo),
                None => (backends.sink, backends.echo),
            };
            let pid = fw.as_ref().map(|f| f.child.id());
            for test in tests {
                let cpu0 = pid.and_then(cpu_s);
                let mut s = Sample {
                    round,
                    method: method.into(),
                    test: (*test).into(),
                    value: 0.0,
                    bytes: 0,
                    cpu_s: None,
                    cpu_s_per_gb: None,
                    p50_us: None,
                    p99_us: None,
                    forwarder_rss_kib: None,
                    forwarder_threads: None,
                    fds_per_conn: None,
                };
                match *test {
                    "bulk1" | "bulk8" => {
                        let streams = if *test == "bulk1" { 1 } else { 8 };
                        let r = load::bulk(Access::Plain(sink), streams, secs)?;
                        s.bytes = r.bytes;
                        s.value = r.bytes as f64 * 8.0 / r.elapsed.as_secs_f64() / 1e9;
                    }
                    "idle" => {
                        // Bytes of forwarder RSS per idle proxied connection
                        // (one 64 B exchange each, then silence).
                        let Some(pid) = pid else { continue };
                        let (rss0, fds0) = (proc_field(pid, "VmRSS:"), fd_count(pid));
                        let conns = load::open_idle(Access::Plain(echo), IDLE_CONNS)?;
                        let (rss1, fds1) = (proc_field(pid, "VmRSS:"), fd_count(pid));
                        if let (Some(a), Some(b)) = (rss0, rss1) {
                            s.value = (b.saturating_sub(a) * 1024) as f64 / IDLE_CONNS as f64;
                        }
                        s.fds_per_conn = Some((fds1 - fds0) as f64 / IDLE_CONNS as f64);
                        s.forwarder_threads = proc_field(pid, "Threads:");
                        drop(conns);
                    }
                    _ => {
                        let size = if *test == "rr64" { 64 } else { 1024 };
                        let (count, mut lat) =
                            load::request_response(Access::Plain(echo), size, secs)?;
                        s.bytes = count * size as u64 * 2;
                        s.value = count as f64 / secs.as_secs_f64();
                        lat.sort_by(|a, b| a.total_cmp(b));
                        s.p50_us = splitway_lab::bench::stats::percentile(&lat, 50.0);
                        s.p99_us = splitway_lab::bench::stats::percentile(&lat, 99.0);
                    }
                }
                if let (Some(pid), Some(c0)) = (pid, cpu0) {
                    s.cpu_s = cpu_s(pid).map(|c1| c1 - c0);
                    if s.bytes > 0 {
                        s.cpu_s_per_gb = s.cpu_s.map(|c| c / (s.bytes as f64 / 1e9));
                    }
                    s.forwarder_rss_kib = proc_field(pid, "VmRSS:");
                    if s.forwarder_threads.is_none() {
                        s.forwarder_threads = proc_field(pid, "Threads:");
                    }
                }
                eprintln!(
                    "round {round} {method:>15} {test:>5}: {:>10.2} cpu/GB {:?}",
                    s.value, s.cpu_s_per_gb
                );
                samples.push(s);
            }
        }
    }
    let load_end = loadavg();
    let ts = chrono_like(started);
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();

    // Summary: median value, median per-round ratio to the baseline, median CPU/GB.
    let mut summary = Vec::new();
    println!(
        "{:<15} {:>6} {:>12} {:>10} {:>10} {:>10}",
        "method", "test", "median", "x auto", "x direct", "cpu-s/GB"
    );
    for test in tests {
        for method in methods {
            let pick = |m: &str, r: u32| {
                samples
                    .iter()
                    .find(|s| s.method == m && s.test == *test && s.round == r)
                    .map(|s| s.value)
            };
            let values: Vec<f64> = (0..rounds).filter_map(|r| pick(method, r)).collect();
            let vs_base: Vec<_> = (0..rounds)
                .map(|r| (pick(method, r), pick(BASELINE, r)))
                .collect();
            let vs_direct: Vec<_> = (0..rounds)
                .map(|r| (pick(method, r), pick("direct", r)))
                .collect();
            let cpu: Vec<f64> = samples
                .iter()
                .filter(|s| s.method == *method && s.test == *test)
                .filter_map(|s| s.cpu_s_per_gb)
                .collect();
            let row = serde_json::json!({
                "method": method, "test": test,
                "median": median(&values),
                "ratio_to_epoll_auto": median_of_ratios(&vs_base),
                "ratio_to_direct": median_of_ratios(&vs_direct),
                "cpu_s_per_gb": median(&cpu),
                "per_round_ratio_to_epoll_auto": vs_base.iter().map(|(a, b)| match (a, b) { (Some(a), Some(b)) => Some(a / b), _ => None }).collect::<Vec<_>>(),
            });
            let f = |v: Option<f64>, p: usize| v.map_or("-".into(), |v| format!("{v:.p$}"));
            println!(
                "{:<15} {:>6} {:>12} {:>10} {:>10} {:>10}",
                method,
                test,
                f(median(&values), 2),
                f(median_of_ratios(&vs_base), 2),
                f(median_of_ratios(&vs_direct), 2),
                f(median(&cpu), 3)
            );
            summary.push(row);
        }
    }
    let out = serde_json::json!({
        "study": "data-path (issue #5 item 2)",
        "started_unix": started.duration_since(std::time::UNIX_EPOCH)?.as_secs(),
        "commit": commit,
        "rounds": rounds,
        "secs_per_test": secs.as_secs_f64(),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "summary": summary,
        "samples": samples,
    });
    std::fs::create_dir_all(splitway_lab::bench::RESULTS_DIR)?;
    let path = format!(
        "{}/datapath-{ts}-{}.json",
        splitway_lab::bench::RESULTS_DIR,
        &commit[..commit.len().min(8)]
    );
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!("load average start {load_start}, end {load_end}; raw: {path}");
    Ok(())
}

/// YYYYMMDDTHHMMSSZ without a date crate.
fn chrono_like(t: std::time::SystemTime) -> String {
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!(
                "@{}",
                t.duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
            ),
            "+%Y%m%dT%H%M%SZ",
        ])
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// Child: forward 127.0.0.1:P1 → sink and 127.0.0.1:P2 → echo with METHOD.
fn serve(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let method = args.first().ok_or("serve METHOD SINK ECHO")?.clone();
    let targets: Vec<SocketAddr> = args[1..]
        .iter()
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let listeners = [
        TcpListener::bind("127.0.0.1:0")?,
        TcpListener::bind("127.0.0.1:0")?,
    ];
    println!(
        "ready {} {}",
        listeners[0].local_addr()?.port(),
        listeners[1].local_addr()?.port()
    );
    match method.as_str() {
        "uring-splice" | "uring-recvsend" | "uring-recvsend-nodefer" => {
            let mode = if method == "uring-splice" {
                UringMode::SpliceLinked
            } else {
                UringMode::RecvSend
            };
            let mut fw = UringForwarder::new(UringConfig {
                mode,
                defer_taskrun: method != "uring-recvsend-nodefer",
                ..UringConfig::default()
            })?;
            for l in listeners {
                fw.add_listener(OwnedFd::from(l))?;
            }
            let mut events = Vec::new();
            loop {
                fw.turn(&mut events)?;
                for e in events.drain(..) {
                    match e {
                        UringEvent::Accepted { listener, stream } => {
                            let out = TcpStream::connect(targets[listener])?;
                            out.set_nodelay(true)?;
                            socket2::SockRef::from(&stream).set_nodelay(true)?;
                            fw.add_pair(stream, OwnedFd::from(out))?;
                        }
                        UringEvent::AcceptFailed { source, .. } => return Err(source.into()),
                        UringEvent::Finished(o) => {
                            if let splitway_sys::uring::PairEnd::Failed { side, source } = o.end {
                                eprintln!("pair {} failed on {side:?}: {source}", o.id);
                            }
                        }
                    }
                }
            }
        }
        _ => {
            use splitway_relay::config::DataPath;
            let data_path = match method.as_str() {
                "epoll-auto" => DataPath::Auto,
                "epoll-splice" => DataPath::Splice,
                "epoll-copy" => DataPath::Copy,
                other => return Err(format!("unknown method {other}").into()),
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let metrics = Arc::new(splitway_relay::metrics::Metrics::new());
                let mut tasks = Vec::new();
                for (l, target) in listeners.into_iter().zip(targets) {
                    l.set_nonblocking(true)?;
                    let l = tokio::net::TcpListener::from_std(l)?;
                    let metrics = metrics.clone();
                    tasks.push(tokio::spawn(async move {
                        loop {
                            let (inbound, _) = l.accept().await?;
                            let metrics = metrics.clone();
                            tokio::spawn(async move {
                                let Ok(outbound) = tokio::net::TcpStream::connect(target).await
                                else {
                                    return;
                                };
                                let _ = inbound.set_nodelay(true);
                                let _ = outbound.set_nodelay(true);
                                let opts = splitway_relay::forward::Options {
                                    data_path,
                                    idle: Duration::from_secs(3600),
                                    own_prefix: 0,
                                    inbound_armed: false,
                                };
                                splitway_relay::forward::forward(
                                    &inbound,
                                    &outbound,
                                    Vec::new(),
                                    splitway_relay::forward::no_preamble(Vec::new()),
                                    opts,
                                    &metrics,
                                    &splitway_relay::forward::Counters::default(),
                                )
                                .await;
                            });
                        }
                        #[expect(unreachable_code, reason = "names the async block's error type after its endless accept loop")]
                        Ok::<(), std::io::Error>(())
                    }));
                }
                for t in tasks {
                    t.await??;
                }
                Ok::<(), Box<dyn std::error::Error>>(())
            })
        }
    }
}
