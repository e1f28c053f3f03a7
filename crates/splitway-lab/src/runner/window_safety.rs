//! `splitway lab window-safety` (issue #29, item 4): learned relay-leg
//! windows held to what they must not break, measured side by side with
//! the kernel's default in one run.
//!
//! One chain, client - rc - rs - server, whose relay hop is the bottleneck
//! (50 Mbit/s, 100 ms, a queue of one BDP). Two configurations: `default`
//! (the README's minimal config: relay legs learn their window) and
//! `split+es+pool` (the same relays with CUBIC named on every leg: the
//! kernel's behaviour). For each:
//!
//! - **Fairness.** An end-to-end bulk flow (server to client, kernel CUBIC,
//!   not relayed: port 5201 is not intercepted) runs alone for 5 s, then a
//!   download through the relays starts, from the window learned on the
//!   idle path. Each flow's bytes are timed at its receiver on one clock;
//!   the relay download's share of both is taken over the 30 s after its
//!   first 2 s (its unvalidated phase is two RTTs, 0.2 s).
//! - **Capacity drop.** After two 10 MB downloads on the idle path (the
//!   window learned at 50 Mbit/s), the relay hop drops to 25 Mbit/s and
//!   three 10 MB downloads follow: their times, and the window learned
//!   after each (from rs's `/status`; rs sends the downloads).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{
    LabError, NETNS_PREFIX, Proc, Setup, TempDir, curl, relay_status, setup_config, start_nginx,
    watch_signals, write_objects,
};
use crate::model::Config;
use crate::report::{git_commit, kernel_release, load_average, utc_now_iso8601};
use crate::scenario::{Chain, Scenario};
use crate::topology::{EmuOptions, Topology};

const SCENARIO: &str = r#"
name = "window-safety"
description = "learned relay-leg windows against a competing CUBIC flow and a capacity drop"
configs = ["default", "split+es+pool"]
[workload]
sizes = ["10MB"]
reps = 3
timeout_s = 60
[[chain]]
name = "relay hop 50 Mbit/s, 100 ms"
hosts = ["client", "rc", "rs", "server"]
[[chain.link]]
rtt_ms = 10
rate_mbit = 1000
[[chain.link]]
rtt_ms = 100
rate_mbit = 50
queue_packets = 417
[[chain.link]]
rtt_ms = 10
rate_mbit = 1000
"#;

/// The relay hop: link 1 of the chain.
const RELAY_HOP: usize = 1;
const DROPPED_MBIT: f64 = 25.0;
const BULK_PORT: u16 = 5201;
const DOWNLOAD: u64 = 10_000_000;
/// Served sparse: read as zeros, costs no disk.
const BIG_OBJECT: &str = "big.bin";
const BIG_SIZE: u64 = 1 << 30;
const E2E_ALONE: Duration = Duration::from_secs(5);
const SKIP: Duration = Duration::from_secs(2);
const MEASURE: Duration = Duration::from_secs(30);
const DOWNLOADS_AFTER_DROP: usize = 3;
/// The relay hop's BDP after the drop, in 1448-byte segments: 25 Mbit/s
/// at 100 ms. A learned BDP within a quarter of it has converged.
const DROPPED_BDP_SEGMENTS: u64 = 216;
/// What the relay hop holds after the drop: its BDP plus its queue (417).
/// A jump at or under it fits the path without a loss.
const DROPPED_PATH_SEGMENTS: u64 = DROPPED_BDP_SEGMENTS + 417;

#[derive(Debug, Serialize)]
pub struct WindowSafetyReport {
    pub date: String,
    pub commit: String,
    pub kernel: String,
    pub load_average_start: String,
    pub load_average_end: String,
    pub relay_hop: String,
    pub reps: u32,
    pub configs: Vec<ConfigResult>,
}

#[derive(Debug, Serialize)]
pub struct ConfigResult {
    pub config: String,
    pub fairness: Vec<FairnessRep>,
    pub capacity_drop: Vec<DropRep>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct FairnessRep {
    pub relay_mbit: f64,
    pub e2e_mbit: f64,
    /// The relay download's share of what both flows carried.
    pub relay_share: f64,
    /// The e2e flow alone, before the download started.
    pub e2e_alone_mbit: f64,
    /// The relay download's share in each 10 s of the measured 30 s: how
    /// far the two flows still were from converging.
    pub relay_share_by_10s: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct DropRep {
    /// The window learned at 50 Mbit/s, before the drop.
    pub learned_before: Option<Learned>,
    /// 10 MB download times after the drop, in order.
    pub download_ms: Vec<f64>,
    /// The window learned after each of those downloads.
    pub learned_after: Vec<Option<Learned>>,
}

/// What rs saved for its legs to rc, in segments (its `/status`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Learned {
    /// What the next leg jumps to.
    pub jump: u64,
    /// The saving connection's highest delivery rate times its min RTT.
    pub bdp: u64,
    /// The saving connection's final cwnd.
    pub cwnd: u64,
}

impl Learned {
    fn converged(self) -> bool {
        self.bdp.abs_diff(DROPPED_BDP_SEGMENTS) <= DROPPED_BDP_SEGMENTS / 4
            && self.jump <= DROPPED_PATH_SEGMENTS
    }
}

impl std::fmt::Display for Learned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "jump {} (BDP {}, cwnd {})",
            self.jump, self.bdp, self.cwnd
        )
    }
}

/// Byte counts at a receiver: (time since the run's start, total so far).
struct Trace(Vec<(Duration, u64)>);

impl Trace {
    /// Bytes received in [from, to].
    fn bytes_between(&self, from: Duration, to: Duration) -> u64 {
        let at = |t: Duration| {
            self.0
                .iter()
                .take_while(|(when, _)| *when <= t)
                .last()
                .map_or(0, |(_, n)| *n)
        };
        at(to).saturating_sub(at(from))
    }
}

fn mbit(bytes: u64, over: Duration) -> f64 {
    bytes as f64 * 8.0 / over.as_secs_f64() / 1e6
}

/// Reads `stream` until `stop`, EOF or an error, timing every read.
fn receive(mut stream: TcpStream, t0: Instant, stop: Instant) -> Trace {
    let mut trace = Vec::with_capacity(8192);
    let mut total = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    while Instant::now() < stop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                trace.push((t0.elapsed(), total));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    Trace(trace)
}

/// The competing end-to-end flow: the server sends zeros with kernel
/// CUBIC until `stop`; returns the client's receiving end.
fn start_bulk(
    topo: &Topology,
    server: Ipv4Addr,
    stop: Arc<AtomicBool>,
) -> Result<(TcpStream, std::thread::JoinHandle<()>), LabError> {
    let listen = SocketAddr::from((Ipv4Addr::UNSPECIFIED, BULK_PORT));
    let listener = topo
        .server()
        .netns()
        .run_in(move || TcpListener::bind(listen))
        .map_err(|e| LabError::peer("bulk sender", "server", e.to_string()))?
        .map_err(|e| LabError::peer("bulk sender", "server", e.to_string()))?;
    let to = SocketAddr::from((server, BULK_PORT));
    let client = topo
        .client()
        .netns()
        .run_in(move || TcpStream::connect_timeout(&to, Duration::from_secs(5)))
        .map_err(|e| LabError::peer("bulk receiver", "client", e.to_string()))?
        .map_err(|e| LabError::peer("bulk receiver", "client", e.to_string()))?;
    let (mut sender, _) = listener
        .accept()
        .map_err(|e| LabError::peer("bulk sender", "server", e.to_string()))?;
    splitway_sys::sock::set_congestion(&sender, "cubic")
        .map_err(|e| LabError::peer("bulk sender", "server", e.to_string()))?;
    let thread = std::thread::spawn(move || {
        let zeros = vec![0u8; 256 * 1024];
        while !stop.load(Ordering::Relaxed) {
            if sender.write_all(&zeros).is_err() {
                break;
            }
        }
    });
    Ok((client, thread))
}

/// A GET of the big object through the relays (port 80 is intercepted),
/// its response headers skipped by the byte count (a few hundred bytes).
fn start_download(topo: &Topology, server: Ipv4Addr) -> Result<TcpStream, LabError> {
    let to = SocketAddr::from((server, super::HTTP_PORT));
    let mut stream = topo
        .client()
        .netns()
        .run_in(move || TcpStream::connect_timeout(&to, Duration::from_secs(5)))
        .map_err(|e| LabError::peer("download", "client", e.to_string()))?
        .map_err(|e| LabError::peer("download", "client", e.to_string()))?;
    write!(
        stream,
        "GET /{BIG_OBJECT} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| LabError::peer("download", "client", e.to_string()))?;
    Ok(stream)
}

/// The object a fairness download fetches, in `www`: sparse, so it costs
/// no disk, and larger than any repetition carries.
pub(super) fn write_big_object(www: &Path) -> Result<(), LabError> {
    std::fs::File::create(www.join(BIG_OBJECT))
        .and_then(|f| f.set_len(BIG_SIZE))
        .map_err(|e| LabError::io("create the sparse bulk object", e))
}

/// One fairness repetition: the end-to-end CUBIC flow alone for 5 s, then
/// a download through the relays beside it; shares over 30 s.
pub(super) fn fairness_rep(topo: &Topology, server: Ipv4Addr) -> Result<FairnessRep, LabError> {
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let end = t0 + E2E_ALONE + SKIP + MEASURE + Duration::from_secs(1);
    let (bulk, sender) = start_bulk(topo, server, stop.clone())?;
    let bulk_rx = std::thread::spawn(move || receive(bulk, t0, end));
    std::thread::sleep(E2E_ALONE.saturating_sub(t0.elapsed()));
    let started = t0.elapsed();
    let download = start_download(topo, server);
    let relay = download.map(|d| receive(d, t0, end));
    stop.store(true, Ordering::Relaxed);
    let bulk = bulk_rx
        .join()
        .map_err(|_| LabError::Usage("bulk receiver panicked".into()))?;
    let _ = sender.join();
    let relay = relay?;
    let (from, to) = (started + SKIP, started + SKIP + MEASURE);
    let relay_bytes = relay.bytes_between(from, to);
    let e2e_bytes = bulk.bytes_between(from, to);
    if relay_bytes + e2e_bytes == 0 {
        return Err(LabError::Usage("neither flow carried a byte".into()));
    }
    let share = |a: Duration, b: Duration| {
        let (r, e) = (relay.bytes_between(a, b), bulk.bytes_between(a, b));
        r as f64 / (r + e).max(1) as f64
    };
    let tenth = |k: u32| from + Duration::from_secs(10) * k;
    Ok(FairnessRep {
        relay_share_by_10s: (0..3).map(|k| share(tenth(k), tenth(k + 1))).collect(),
        relay_mbit: mbit(relay_bytes, MEASURE),
        e2e_mbit: mbit(e2e_bytes, MEASURE),
        relay_share: relay_bytes as f64 / (relay_bytes + e2e_bytes) as f64,
        e2e_alone_mbit: mbit(
            bulk.bytes_between(Duration::from_secs(1), started),
            started.saturating_sub(Duration::from_secs(1)),
        ),
    })
}

/// What rs saved for its legs to rc (keyed by rc's address).
fn learned_toward_rc(topo: &Topology) -> Result<Option<Learned>, LabError> {
    let relays = topo.relays();
    let rc = relays[0]
        .right_addr()
        .ok_or_else(|| LabError::Usage("rc has no relay-side link".into()))?
        .to_string();
    let status = relay_status(&relays[1])?;
    Ok(status.learned_windows.and_then(|l| {
        l.peers
            .iter()
            .find(|w| w.addr == rc && w.current)
            .map(|w| Learned {
                jump: w.jump_segments,
                bdp: w.bdp_segments,
                cwnd: w.cwnd_segments,
            })
    }))
}

fn drop_rep(
    topo: &mut Topology,
    setup: &super::Setup,
    timeout: Duration,
) -> Result<DropRep, LabError> {
    let full = topo
        .link_spec(RELAY_HOP)
        .cloned()
        .ok_or_else(|| LabError::Usage("no relay hop".into()))?;
    let download = |topo: &Topology| {
        curl(setup, topo.client(), DOWNLOAD, timeout)
            .and_then(|s| s.check(DOWNLOAD).map(|()| s.total_s * 1e3))
            .map_err(|e| LabError::peer("download", "client", e))
    };
    for _ in 0..2 {
        download(topo)?;
    }
    let learned_before = learned_toward_rc(topo)?;
    topo.set_link_drained(RELAY_HOP, full.clone().with_rate(DROPPED_MBIT))?;
    let mut rep = DropRep {
        learned_before,
        download_ms: Vec::new(),
        learned_after: Vec::new(),
    };
    let outcome = (0..DOWNLOADS_AFTER_DROP).try_for_each(|_| {
        rep.download_ms.push(download(topo)?);
        rep.learned_after.push(learned_toward_rc(topo)?);
        Ok::<(), LabError>(())
    });
    topo.set_link_drained(RELAY_HOP, full)?;
    outcome.map(|()| rep)
}

fn run_config(
    config: Config,
    scenario: &Scenario,
    reps: u32,
    work: &Path,
) -> Result<ConfigResult, LabError> {
    let mut bench = Bench::start(config, &scenario.chains[0], work)?;
    let mut result = ConfigResult {
        config: config.name().to_owned(),
        fairness: Vec::new(),
        capacity_drop: Vec::new(),
        error: None,
    };
    let outcome = (|| {
        for rep in 0..reps {
            eprintln!("{config}: fairness {}/{reps}", rep + 1);
            // Learn on the idle path first, as a relay pair in use has.
            bench.warm_up(DOWNLOAD, scenario.timeout)?;
            result
                .fairness
                .push(fairness_rep(&bench.topo, bench.server)?);
            eprintln!("{config}: capacity drop {}/{reps}", rep + 1);
            result
                .capacity_drop
                .push(drop_rep(&mut bench.topo, &bench.setup, scenario.timeout)?);
            if super::interrupted() {
                return Err(LabError::Interrupted);
            }
        }
        Ok(())
    })();
    result.error = settle(outcome)?;
    Ok(result)
}

/// One configuration's relays up on a freshly built chain whose end hosts
/// run the model's algorithm, nginx serving the objects: what a
/// side-by-side run (this one, `loss_fairness`) measures on. Field order
/// is drop order: the relays, then nginx, then the namespaces.
pub(super) struct Bench {
    pub(super) setup: Setup,
    _nginx: Proc,
    pub(super) topo: Topology,
    pub(super) server: Ipv4Addr,
}

impl Bench {
    pub(super) fn start(config: Config, chain: &Chain, work: &Path) -> Result<Bench, LabError> {
        let topo = Topology::build_with(&chain.spec, NETNS_PREFIX, &EmuOptions::default())?;
        super::end_hosts_on_model_congestion(&topo)?;
        let server = topo
            .server()
            .left_addr()
            .ok_or_else(|| LabError::Usage("the server has no link".into()))?;
        let nginx = start_nginx(topo.server(), work)?;
        let setup = setup_config(
            config,
            &topo,
            std::net::IpAddr::V4(server),
            work,
            chain,
            super::Families::V4,
        )?;
        Ok(Bench {
            setup,
            _nginx: nginx,
            topo,
            server,
        })
    }

    /// Two downloads of `size` through the relays, alone on the path.
    pub(super) fn warm_up(&self, size: u64, timeout: Duration) -> Result<(), LabError> {
        for _ in 0..2 {
            curl(&self.setup, self.topo.client(), size, timeout)
                .and_then(|s| s.check(size))
                .map_err(|e| LabError::peer("download", "client", e))?;
        }
        Ok(())
    }
}

/// How a configuration's repetitions ended: an interruption goes on up,
/// any other error becomes the result's note.
pub(super) fn settle(outcome: Result<(), LabError>) -> Result<Option<String>, LabError> {
    match outcome {
        Ok(()) => Ok(None),
        Err(LabError::Interrupted) => Err(LabError::Interrupted),
        Err(e) => Ok(Some(e.to_string())),
    }
}

/// Writes `report` as JSON to `path`, if given.
pub(super) fn write_json(path: Option<&Path>, report: &impl Serialize) -> Result<(), LabError> {
    let Some(path) = path else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(report)
        .map_err(|e| LabError::Usage(format!("serialise the report: {e}")))?;
    std::fs::write(path, text).map_err(|e| LabError::io(format!("write {}", path.display()), e))
}

/// Runs both configurations `reps` times; prints the table and writes the
/// report to `json` if given.
pub fn run(reps: u32, json: Option<&Path>) -> Result<WindowSafetyReport, LabError> {
    if !super::is_root() {
        return Err(LabError::NotRoot);
    }
    let scenario = Scenario::parse(SCENARIO, "built-in:window-safety")?;
    watch_signals();
    let work = TempDir::create()?;
    write_objects(&work.path.join("www"), &[DOWNLOAD, super::WARM_UP_SIZE])?;
    write_big_object(&work.path.join("www"))?;
    let mut report = WindowSafetyReport {
        date: utc_now_iso8601(),
        commit: git_commit(),
        kernel: kernel_release(),
        load_average_start: load_average(),
        load_average_end: String::new(),
        relay_hop: "50 Mbit/s, 100 ms RTT, queue 417 packets (1 BDP); drop to 25 Mbit/s".into(),
        reps,
        configs: Vec::new(),
    };
    for config in [Config::Default, Config::SplitEsPool] {
        report
            .configs
            .push(run_config(config, &scenario, reps, &work.path)?);
    }
    report.load_average_end = load_average();
    print!("{}", render(&report));
    write_json(json, &report)?;
    Ok(report)
}

/// The median; `None` when empty. Not `bench::stats::median`: `bench`
/// imports `runner`, and the lint refuses the circle back.
pub(super) fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn render(report: &WindowSafetyReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "window-safety {} ({}, kernel {}, load {} -> {}): relay hop {}",
        report.date,
        report.commit,
        report.kernel,
        report.load_average_start,
        report.load_average_end,
        report.relay_hop
    );
    let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let mut first_after_drop = Vec::new();
    for c in &report.configs {
        let shares: Vec<f64> = c.fairness.iter().map(|r| r.relay_share).collect();
        let by_10s: Vec<String> = (0..3)
            .map(|k| {
                let shares: Vec<f64> = c
                    .fairness
                    .iter()
                    .filter_map(|r| r.relay_share_by_10s.get(k).copied())
                    .collect();
                f(median(&shares), 3)
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<14} fairness: relay share median {} (reps {:?}; by 10 s {by_10s:?}), relay {} / e2e {} Mbit/s",
            c.config,
            f(median(&shares), 3),
            shares.iter().map(|s| format!("{s:.3}")).collect::<Vec<_>>(),
            f(
                median(&c.fairness.iter().map(|r| r.relay_mbit).collect::<Vec<_>>()),
                1
            ),
            f(
                median(&c.fairness.iter().map(|r| r.e2e_mbit).collect::<Vec<_>>()),
                1
            ),
        );
        for k in 0..DOWNLOADS_AFTER_DROP {
            let times: Vec<f64> = c
                .capacity_drop
                .iter()
                .filter_map(|r| r.download_ms.get(k).copied())
                .collect();
            let learned: Vec<String> = c
                .capacity_drop
                .iter()
                .map(|r| {
                    r.learned_after
                        .get(k)
                        .copied()
                        .flatten()
                        .map_or("-".into(), |w| w.to_string())
                })
                .collect();
            if k == 0 {
                first_after_drop.push(median(&times));
            }
            let _ = writeln!(
                out,
                "{:<14} after drop, download {}: median {} ms (reps {:?}), learned after: {:?}",
                "",
                k + 1,
                f(median(&times), 0),
                times.iter().map(|t| format!("{t:.0}")).collect::<Vec<_>>(),
                learned
            );
        }
        let before: Vec<String> = c
            .capacity_drop
            .iter()
            .map(|r| r.learned_before.map_or("-".into(), |w| w.to_string()))
            .collect();
        let _ = writeln!(out, "{:<14} learned before the drop: {before:?}", "");
        let converged: Vec<String> = c
            .capacity_drop
            .iter()
            .map(|r| {
                r.learned_after
                    .iter()
                    .position(|w| w.is_some_and(Learned::converged))
                    .map_or("-".into(), |k| (k + 1).to_string())
            })
            .collect();
        if c.capacity_drop.iter().any(|r| r.learned_before.is_some()) {
            let _ = writeln!(
                out,
                "{:<14} learned BDP within 25 % of the dropped path's {DROPPED_BDP_SEGMENTS} segments, and the jump at most the {DROPPED_PATH_SEGMENTS} it holds, after connection: {converged:?}",
                ""
            );
        }
        if let Some(e) = &c.error {
            let _ = writeln!(out, "{:<14} FAILED: {e}", "");
        }
    }
    if let [Some(learned), Some(kernel)] = first_after_drop[..] {
        let _ = writeln!(
            out,
            "first download after the drop: default / kernel = {:.3}",
            learned / kernel
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_scenario_parses() {
        let s = Scenario::parse(SCENARIO, "built-in:window-safety").expect("parses");
        assert_eq!(s.chains.len(), 1);
        assert_eq!(s.chains[0].spec.links[RELAY_HOP].rate_mbit, Some(50.0));
    }

    #[test]
    fn bytes_between_counts_what_arrived_in_the_window() {
        let s = Duration::from_secs;
        let trace = Trace(vec![(s(1), 100), (s(2), 300), (s(3), 600), (s(4), 1000)]);
        assert_eq!(trace.bytes_between(s(2), s(4)), 700);
        assert_eq!(trace.bytes_between(Duration::ZERO, s(1)), 100);
        assert_eq!(trace.bytes_between(s(5), s(6)), 0);
    }
}
