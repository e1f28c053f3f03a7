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

const PREFIX: &str = "sws";
const CLIENT: &str = "10.0.1.1";
const RC_WEST: &str = "10.0.1.2";
const RC_EAST: &str = "10.0.2.1";
const RS_WEST: &str = "10.0.2.2";
const RS_EAST: &str = "10.0.3.1";
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
struct RelayProcess {
    /// `rc1`, `rc2`, `rs1`, ...
    name: String,
    host: &'static str,
    admin: String,
    child: Child,
}

/// The namespaces, relays and temp dir of one run; torn down on drop.
struct Rig {
    relays: Vec<RelayProcess>,
    server_process: Option<Child>,
    client: Netns,
    rc: Netns,
    rs: Netns,
    server: Netns,
    dir: PathBuf,
    /// Keep the temp dir (relay configs and logs) for a failed run.
    keep: bool,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(mut server) = self.server_process.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        for relay in &mut self.relays {
            let _ = Command::new("kill")
                .args(["-TERM", &relay.child.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for relay in &mut self.relays {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = relay.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = relay.child.kill();
            let _ = relay.child.wait();
        }
        if self.keep {
            println!("relay configs and logs kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn sys(what: &str, e: splitway_sys::SysError) -> LabError {
    LabError::Peer {
        tool: what.into(),
        host: "soak namespaces".into(),
        detail: e.to_string(),
    }
}

impl Rig {
    fn build(binary: &Path, processes: usize) -> Result<Rig, LabError> {
        netns::remove_stale(PREFIX);
        let create = || {
            let name = netns::unique_name(PREFIX);
            Netns::create(&name).map_err(|e| sys("create namespace", e))
        };
        let dir = std::env::temp_dir().join(format!("{PREFIX}-{}", std::process::id()));
        fs::create_dir_all(&dir).map_err(|e| LabError::io("create soak temp dir", e))?;
        let mut rig = Rig {
            relays: Vec::new(),
            server_process: None,
            client: create()?,
            rc: create()?,
            rs: create()?,
            server: create()?,
            dir,
            keep: false,
        };
        let links = [
            (&rig.client, CLIENT, &rig.rc, RC_WEST),
            (&rig.rc, RC_EAST, &rig.rs, RS_WEST),
            (&rig.rs, RS_EAST, &rig.server, SERVER),
        ];
        for (a, a_ip, b, b_ip) in links {
            netns::veth(a, "east", b, "west").map_err(|e| sys("veth", e))?;
            a.ip(&["addr", "add", &format!("{a_ip}/24"), "dev", "east"])
                .map_err(|e| sys("ip addr", e))?;
            b.ip(&["addr", "add", &format!("{b_ip}/24"), "dev", "west"])
                .map_err(|e| sys("ip addr", e))?;
        }
        // Every leg is between direct neighbours: no routes needed. Each
        // round opens --connections legs per hop between the same two
        // addresses, and the closing side keeps each port in TIME_WAIT
        // for 60 s; connect() prefers even ports, so without reuse the
        // third round of 9,800 ran out of ports and setups stalled past
        // the relay's handshake timeout.
        for ns in [&rig.client, &rig.rc, &rig.rs, &rig.server] {
            ns.sysctl("net.ipv4.ip_local_port_range", "1024 65535")
                .map_err(|e| sys("sysctl", e))?;
            ns.sysctl("net.ipv4.tcp_tw_reuse", "1")
                .map_err(|e| sys("sysctl", e))?;
            ns.sysctl("net.core.somaxconn", "8192")
                .map_err(|e| sys("sysctl", e))?;
            // Tens of thousands of sockets autotuning toward the default
            // 6–32 MiB maxima exhausted the host's global tcp_mem: the
            // stack then dropped segments and BBR stalled
            // (docs/reliability.md, runs 7 and 8). With the bulk slots this
            // bounds the soak's own socket memory.
            ns.sysctl(
                "net.ipv4.tcp_rmem",
                &format!("4096 65536 {SOCKET_BUFFER_MAX}"),
            )
            .map_err(|e| sys("sysctl", e))?;
            ns.sysctl(
                "net.ipv4.tcp_wmem",
                &format!("4096 16384 {SOCKET_BUFFER_MAX}"),
            )
            .map_err(|e| sys("sysctl", e))?;
            // Loss-based reno (a namespace default can only be reno or
            // bbr here): without fq, BBR paces with its internal timer and
            // its model collapsed to kbit/s on the drops of run 7; on a
            // zero-delay veth the choice costs no throughput, and reno
            // recovers from any loss within a few round trips of µs.
            ns.sysctl("net.ipv4.tcp_congestion_control", "reno")
                .map_err(|e| sys("sysctl", e))?;
        }

        let psk: String = {
            let mut bytes = [0u8; 32];
            let mut f =
                fs::File::open("/dev/urandom").map_err(|e| LabError::io("open /dev/urandom", e))?;
            std::io::Read::read_exact(&mut f, &mut bytes)
                .map_err(|e| LabError::io("read /dev/urandom", e))?;
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        };
        let psk_path = rig.dir.join("psk.key");
        fs::write(&psk_path, format!("{psk}\n")).map_err(|e| LabError::io("write psk", e))?;
        let common = |host: &str, admin: &str| {
            format!(
                "name = \"{host}\"\npsk_file = \"{}\"\nadmin = \"{admin}\"\n",
                psk_path.display()
            )
        };
        let rc_conf = |admin: &str| {
            format!(
                "{}\n[[listen]]\nmode = \"socks5\"\naddr = \"{RC_WEST}:{SOCKS_PORT}\"\nreuse_port = true\n\
                 allow_clients = [\"10.0.1.0/24\"]\n\n\
                 [[peer]]\nname = \"rs\"\naddr = \"{RS_WEST}:{PEER_PORT}\"\n\n\
                 [[route]]\ndst = \"10.0.3.0/24\"\nvia = \"rs\"\n",
                common("rc", admin)
            )
        };
        let rs_conf = |admin: &str| {
            format!(
                "{}\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:{PEER_PORT}\"\nreuse_port = true\n\n\
                 [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
                common("rs", admin)
            )
        };
        // rs first: rc's peer must be listening when rc comes up. Every
        // process of a host shares its listener; each has its own admin.
        let mut plan = Vec::new();
        for (host, conf) in [
            ("rs", &rs_conf as &dyn Fn(&str) -> String),
            ("rc", &rc_conf),
        ] {
            for i in 0..processes {
                let admin = format!("127.0.0.1:{}", ADMIN_BASE_PORT + i as u16);
                plan.push((host, format!("{host}{}", i + 1), conf(&admin), admin));
            }
        }
        for (host, name, conf, admin) in plan {
            let path = rig.dir.join(format!("{name}.toml"));
            fs::write(&path, conf).map_err(|e| LabError::io("write relay config", e))?;
            let log = fs::File::create(rig.dir.join(format!("{name}.log")))
                .map_err(|e| LabError::io("create relay log", e))?;
            let ns = if host == "rc" { &rig.rc } else { &rig.rs };
            let child = ns
                .command(&binary.display().to_string())
                .args(["relay", "--config"])
                .arg(&path)
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdin(Stdio::null())
                .stdout(
                    log.try_clone()
                        .map_err(|e| LabError::io("dup relay log", e))?,
                )
                .stderr(log)
                .spawn()
                .map_err(|e| LabError::io("spawn splitway relay", e))?;
            rig.relays.push(RelayProcess {
                name: name.clone(),
                host,
                admin,
                child,
            });
            rig.wait_ready(&name)?;
        }
        Ok(rig)
    }

    /// Starts `splitway lab soak --serve` in the server namespace and waits
    /// for its `ready`.
    fn start_server(&mut self, binary: &Path, connections: usize) -> Result<(), LabError> {
        let mut child = self
            .server
            .command(&binary.display().to_string())
            .args(["lab", "soak", "--serve", "--connections"])
            .arg(connections.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| LabError::io("spawn the soak server", e))?;
        let stdout = child.stdout.take().expect("piped stdout");
        self.server_process = Some(child);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .map_err(|e| LabError::io("read the soak server's ready line", e))?;
        if line.trim() != "ready" {
            return Err(LabError::Peer {
                tool: "soak server".into(),
                host: "server namespace".into(),
                detail: format!("did not start (said {line:?})"),
            });
        }
        Ok(())
    }

    fn relay(&self, name: &str) -> &RelayProcess {
        self.relays
            .iter()
            .find(|r| r.name == name)
            .expect("relay started")
    }

    fn pid(&self, relay: &str) -> u32 {
        self.relay(relay).child.id()
    }

    fn status(&self, relay: &str) -> Option<splitway_api::Status> {
        let relay = self.relay(relay);
        let ns = if relay.host == "rc" {
            &self.rc
        } else {
            &self.rs
        };
        let out = ns
            .command("curl")
            .args(["-sS", "--fail", "--max-time", "5"])
            .arg(format!("http://{}/status", relay.admin))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    fn connections_open(&self, relay: &str) -> Option<u64> {
        Some(self.status(relay)?.connections_open)
    }

    fn wait_ready(&mut self, relay: &str) -> Result<(), LabError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.dir.join(format!("{relay}.log"));
            if let Some(r) = self.relays.iter_mut().find(|r| r.name == relay)
                && let Ok(Some(status)) = r.child.try_wait()
            {
                return Err(LabError::Peer {
                    tool: "splitway relay".into(),
                    host: relay.into(),
                    detail: format!(
                        "exited during startup with {status}: {}",
                        fs::read_to_string(&log).unwrap_or_default()
                    ),
                });
            }
            if self.status(relay).is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LabError::Peer {
                    tool: "splitway relay".into(),
                    host: relay.into(),
                    detail: "admin API not answering after 20 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn sample(&self, relay: &str) -> Result<Resources, LabError> {
        resources(self.pid(relay)).ok_or_else(|| LabError::Peer {
            tool: "splitway relay".into(),
            host: relay.into(),
            detail: "process gone (crashed?)".into(),
        })
    }
}

/// After a round's clients closed: waits until both relays report no open
/// connection, lets deferred frees run, and records their figures.
fn after_round(
    rig: &Rig,
    figures: &mut [RelayFigures],
    report: &mut SoakReport,
    round: u32,
) -> Result<(), LabError> {
    let settle = Instant::now() + Duration::from_secs(30);
    for f in figures.iter() {
        loop {
            match rig.connections_open(&f.name) {
                Some(0) => break,
                Some(open) if Instant::now() > settle => {
                    report.failures.push(format!(
                        "{}: {open} connections still open 30 s after every client of round {} closed",
                        f.name,
                        round + 1
                    ));
                    break;
                }
                None => {
                    report.failures.push(format!(
                        "{}: admin API not answering after round {}",
                        f.name,
                        round + 1
                    ));
                    break;
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
    // The relays return free heap to the kernel on their 2 s idle tick
    // after the last connection closed; sample after it.
    std::thread::sleep(Duration::from_secs(5));
    for f in figures.iter_mut() {
        let now = rig.sample(&f.name)?;
        println!(
            "  after round {}: {} {} fds, RSS {:.1} MiB",
            round + 1,
            f.name,
            now.fds,
            now.rss_bytes as f64 / 1048576.0
        );
        f.after_rounds.push(now);
    }
    Ok(())
}

/// Raises the open-file limit (soft to hard; the hard one too where
/// allowed, with prlimit(1) as root) and checks that every process fits:
/// each generator process (client side, server side) holds one socket per
/// connection; with `relay_processes`, each relay process holds two per
/// connection it carries, plus splice pipes. The relays inherit the limit.
fn raise_nofile(connections: usize, relay_processes: Option<usize>) -> Result<u64, LabError> {
    let wanted = (connections as u64 * 2 + 4096).max(65_536);
    let pid = std::process::id().to_string();
    let out = Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={wanted}:{wanted}")])
        .stdin(Stdio::null())
        .output();
    if let Ok(out) = &out
        && !out.status.success()
    {
        tracing::debug!(
            "prlimit --nofile={wanted}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let (soft, hard) =
        splitway_sys::sock::raise_nofile_limit().map_err(|e| sys("raise RLIMIT_NOFILE", e))?;
    let generator_needs = connections as u64 + GENERATOR_FD_HEADROOM;
    if soft < generator_needs {
        return Err(LabError::Usage(format!(
            "open-file limit {soft} (hard {hard}) is too low: each generator process needs one descriptor \
             per connection plus {GENERATOR_FD_HEADROOM}, {generator_needs} for {connections} connections"
        )));
    }
    if let Some(processes) = relay_processes {
        let needs = relay_fds_needed(connections, processes);
        if soft < needs {
            let mut fit = processes;
            while fit < connections && relay_fds_needed(connections, fit) > soft {
                fit += 1;
            }
            return Err(LabError::Usage(format!(
                "open-file limit {soft} (hard {hard}) is too low: with {processes} relay processes per host \
                 each may carry up to {} connections ({REUSEPORT_SKEW_PERCENT} % over an even share), \
                 2 descriptors each plus {RELAY_FD_HEADROOM} headroom = {needs}; use --relay-processes {fit}",
                relay_share(connections, processes)
            )));
        }
    }
    Ok(soft)
}

/// Connections one relay process may get: an even share plus the
/// SO_REUSEPORT hash's unevenness.
fn relay_share(connections: usize, processes: usize) -> u64 {
    let even = (connections as u64).div_ceil(processes as u64);
    if processes == 1 {
        even
    } else {
        (even * (100 + REUSEPORT_SKEW_PERCENT)).div_ceil(100)
    }
}

fn relay_fds_needed(connections: usize, processes: usize) -> u64 {
    relay_share(connections, processes) * 2 + RELAY_FD_HEADROOM
}

// ---------------------------------------------------------------------------
// Data: a pattern anyone can regenerate from (seed, offset)
// ---------------------------------------------------------------------------

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern of `seed` from byte `offset` (a multiple of 8).
fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    debug_assert_eq!(offset % 8, 0);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = splitmix(seed ^ (offset / 8 + i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
}

const BUF: usize = 64 * 1024;

async fn send_pattern(
    w: &mut (impl AsyncWriteExt + Unpin),
    seed: u64,
    len: u64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; BUF];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(BUF as u64) as usize;
        fill(seed, off, &mut buf[..n]);
        w.write_all(&buf[..n]).await?;
        off += n as u64;
    }
    Ok(())
}

/// Reads exactly `len` bytes and checks them; `Ok(false)` on a mismatch.
async fn recv_pattern(
    r: &mut (impl AsyncReadExt + Unpin),
    seed: u64,
    len: u64,
) -> std::io::Result<bool> {
    let mut buf = vec![0u8; BUF];
    let mut want = vec![0u8; BUF];
    let mut off = 0u64;
    let mut ok = true;
    while off < len {
        let n = (len - off).min(BUF as u64) as usize;
        r.read_exact(&mut buf[..n]).await?;
        fill(seed, off, &mut want[..n]);
        ok &= buf[..n] == want[..n];
        off += n as u64;
    }
    Ok(ok)
}

/// Exchange header: upload length, download length, seed.
const HEADER: usize = 24;
/// Server's verdict after an exchange: 1 if the upload matched, then its length.
const TRAILER: usize = 9;

fn download_seed(seed: u64) -> u64 {
    seed ^ 0x5EED_D0D0_5EED_D0D0
}

async fn serve(listener: TcpListener, stop: Arc<AtomicBool>) {
    while !stop.load(Relaxed) {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors or similar: the client counts the
                // failed connection; do not spin.
                tracing::warn!("soak server accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        tokio::spawn(serve_one(stream));
    }
}

/// Answers exchanges until the client closes; a failure just ends the
/// connection: the client sees it and counts it.
async fn serve_one(stream: TcpStream) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut r, mut w) = stream.into_split();
    loop {
        let mut h = [0u8; HEADER];
        // EOF before a header: the client is done.
        match r.read(&mut h[..1]).await? {
            0 => return w.shutdown().await,
            _ => r.read_exact(&mut h[1..]).await?,
        };
        let up = u64::from_be_bytes(h[0..8].try_into().expect("8"));
        let down = u64::from_be_bytes(h[8..16].try_into().expect("8"));
        let seed = u64::from_be_bytes(h[16..24].try_into().expect("8"));
        let (ok, ()) = tokio::try_join!(
            recv_pattern(&mut r, seed, up),
            send_pattern(&mut w, download_seed(seed), down)
        )?;
        let mut t = [0u8; TRAILER];
        t[0] = u8::from(ok);
        t[1..].copy_from_slice(&up.to_be_bytes());
        w.write_all(&t).await?;
    }
}

/// `--serve`: binds the soak server where it runs (the server namespace),
/// prints `ready`, and serves until killed.
fn serve_process(connections: usize) -> Result<(), LabError> {
    raise_nofile(connections, None)?;
    let addr: SocketAddr = format!("{SERVER}:{SERVER_PORT}").parse().expect("addr");
    let listener = (|| -> std::io::Result<std::net::TcpListener> {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        s.listen(8192)?;
        s.set_nonblocking(true)?;
        Ok(s.into())
    })()
    .map_err(|e| LabError::io(format!("bind the soak server on {addr}"), e))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| LabError::io("tokio runtime", e))?;
    rt.block_on(async move {
        let listener =
            TcpListener::from_std(listener).map_err(|e| LabError::io("soak server listener", e))?;
        println!("ready");
        serve(listener, Arc::new(AtomicBool::new(false))).await;
        Ok(())
    })
}

/// Load counters shared by every connection task.
#[derive(Default)]
struct Counters {
    made: AtomicU64,
    open: AtomicU64,
    peak_open: AtomicU64,
    exchanges: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    setup_errors: AtomicU64,
    first_errors: std::sync::Mutex<Vec<String>>,
}

impl Counters {
    fn error(&self, what: String) {
        self.errors.fetch_add(1, Relaxed);
        let mut first = self.first_errors.lock().expect("errors lock");
        if first.len() < 10 {
            first.push(what);
        }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// Mostly small, some medium, a few large (up to `max`).
    fn size(&mut self, max: u64) -> u64 {
        match self.below(100) {
            0..60 => self.below(2048.min(max) + 1),
            60..92 => 2048 + self.below((256 * 1024u64).min(max).saturating_sub(2048) + 1),
            _ => self.below(max + 1),
        }
    }
}

async fn socks_connect(dst: SocketAddrV4) -> std::io::Result<TcpStream> {
    let proxy: SocketAddr = format!("{RC_WEST}:{SOCKS_PORT}").parse().expect("addr");
    let mut s = TcpStream::connect(proxy).await?;
    s.set_nodelay(true)?;
    s.write_all(&[5, 1, 0]).await?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await?;
    if choice != [5, 0] {
        return Err(std::io::Error::other(format!(
            "SOCKS method reply {choice:?}"
        )));
    }
    let mut req = vec![5, 1, 0, 1];
    req.extend_from_slice(&dst.ip().octets());
    req.extend_from_slice(&dst.port().to_be_bytes());
    s.write_all(&req).await?;
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await?;
    if reply[1] != 0 {
        return Err(std::io::Error::other(format!(
            "SOCKS reply code {}",
            reply[1]
        )));
    }
    Ok(s)
}

/// One connection: set up (bounded concurrency), exchange until `until`,
/// close cleanly. Errors are counted, never retried.
async fn client_conn(
    id: u64,
    args: Arc<SoakArgs>,
    setup: Arc<Semaphore>,
    bulk: Arc<Semaphore>,
    counters: Arc<Counters>,
    mut go: tokio::sync::watch::Receiver<Option<Instant>>,
) {
    let dst = SocketAddrV4::new(SERVER.parse::<Ipv4Addr>().expect("ip"), SERVER_PORT);
    let stream = {
        let _permit = setup.acquire().await.expect("semaphore");
        match socks_connect(dst).await {
            Ok(s) => s,
            Err(e) => {
                counters.setup_errors.fetch_add(1, Relaxed);
                counters.error(format!("connection {id}: setup: {e}"));
                return;
            }
        }
    };
    counters.made.fetch_add(1, Relaxed);
    let open = counters.open.fetch_add(1, Relaxed) + 1;
    counters.peak_open.fetch_max(open, Relaxed);
    // Every connection is open before any exchanges data: the peak is
    // all of them at once.
    let until = match go.wait_for(Option::is_some).await {
        Ok(until) => until.expect("checked by wait_for"),
        Err(_) => Instant::now(),
    };
    // A connection still busy this long after the round's end is stalled
    // (run 7's last connections trickled for 10+ minutes): fail, not wait.
    let drain_deadline = tokio::time::Instant::from_std(until + DRAIN_LIMIT);
    let result = tokio::time::timeout_at(
        drain_deadline,
        exchanges(id, stream, &args, &bulk, &counters, until),
    )
    .await
    .unwrap_or_else(|_| {
        Err(format!(
            "still exchanging or closing {DRAIN_LIMIT:?} after the round ended (stalled)"
        ))
    });
    counters.open.fetch_sub(1, Relaxed);
    if let Err(e) = result {
        counters.error(format!("connection {id}: {e}"));
    }
}

/// Exchanges on one connection until `until`: the first always (so every
/// connection carries checked bytes both ways), then more after random
/// pauses. A larger exchange first waits for a bulk slot; one that gets
/// no slot before `until` is not started.
async fn exchanges(
    id: u64,
    stream: TcpStream,
    args: &SoakArgs,
    bulk: &Semaphore,
    counters: &Counters,
    until: Instant,
) -> Result<(), String> {
    let mut rng = Rng(splitmix(id ^ 0xC0FF_EE00));
    let (mut r, mut w) = stream.into_split();
    // Spread the first exchanges over one pause.
    tokio::time::sleep(Duration::from_millis(rng.below(args.pause_ms + 1))).await;
    let mut n = 0u64;
    loop {
        let up = rng.size(args.max_size);
        let down = rng.size(args.max_size);
        let slot = if up + down <= SMALL_EXCHANGE {
            None
        } else if n == 0 {
            Some(bulk.acquire().await.expect("bulk semaphore never closed"))
        } else {
            match tokio::time::timeout_at(tokio::time::Instant::from_std(until), bulk.acquire())
                .await
            {
                Ok(slot) => Some(slot.expect("bulk semaphore never closed")),
                Err(_) => break,
            }
        };
        let seed = splitmix(id << 32 | n);
        let mut h = [0u8; HEADER];
        h[0..8].copy_from_slice(&up.to_be_bytes());
        h[8..16].copy_from_slice(&down.to_be_bytes());
        h[16..24].copy_from_slice(&seed.to_be_bytes());
        let sending = async {
            w.write_all(&h).await?;
            send_pattern(&mut w, seed, up).await
        };
        let receiving = async {
            let ok = recv_pattern(&mut r, download_seed(seed), down).await?;
            let mut t = [0u8; TRAILER];
            r.read_exact(&mut t).await?;
            Ok::<_, std::io::Error>((ok, t))
        };
        let ((), (down_ok, t)) = tokio::try_join!(sending, receiving)
            .map_err(|e| format!("exchange {n} ({up} B up, {down} B down): {e}"))?;
        let server_got = u64::from_be_bytes(t[1..].try_into().expect("8"));
        if !down_ok {
            return Err(format!(
                "exchange {n}: the download ({down} B) differs from what the server sent"
            ));
        }
        if t[0] != 1 || server_got != up {
            return Err(format!(
                "exchange {n}: the server found the upload ({up} B) corrupt or short (verdict {}, {server_got} B)",
                t[0]
            ));
        }
        counters.exchanges.fetch_add(1, Relaxed);
        counters.bytes.fetch_add(up + down, Relaxed);
        n += 1;
        drop(slot);
        if Instant::now() >= until {
            break;
        }
        let pause = rng.below(2 * args.pause_ms + 1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if Instant::now() >= until {
            break;
        }
    }
    // Clean close: our EOF, then the server's.
    w.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    let mut rest = [0u8; 1];
    match r.read(&mut rest).await {
        Ok(0) => Ok(()),
        Ok(_) => Err("data after the last exchange".into()),
        Err(e) => Err(format!("closing: {e}")),
    }
}

/// `/proc/net/sockstat`'s TCP line: (mem pages, sockets allocated). Both
/// are global to the kernel, whatever namespace reads them.
fn tcp_sockstat() -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("TCP:"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let field = |key: &str| -> Option<u64> {
        let i = words.iter().position(|w| *w == key)?;
        words.get(i + 1)?.parse().ok()
    };
    Some((field("mem")?, field("alloc")?))
}

fn tcp_mem_limits() -> [u64; 3] {
    let text = fs::read_to_string("/proc/sys/net/ipv4/tcp_mem").unwrap_or_default();
    let mut v = text.split_whitespace().filter_map(|w| w.parse().ok());
    [
        v.next().unwrap_or(0),
        v.next().unwrap_or(0),
        v.next().unwrap_or(0),
    ]
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The namespace's TcpExt memory counters, read inside it.
fn namespace_counters(label: &str, ns: &Netns) -> NamespaceCounters {
    let mut c = NamespaceCounters {
        namespace: label.into(),
        ..NamespaceCounters::default()
    };
    let Ok(counters) = ns.tcp_ext() else {
        return c;
    };
    let get = |name: &str| counters.get(name).copied().unwrap_or(0);
    c.memory_pressures = get("TCPMemoryPressures");
    c.rcvq_drops = get("TCPRcvQDrop");
    c.prune_called = get("PruneCalled");
    c.abort_on_memory = get("TCPAbortOnMemory");
    c
}

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

fn print_report(r: &SoakReport, args: &SoakArgs) {
    let mib = |b: u64| b as f64 / 1048576.0;
    println!("\nsoak results");
    println!(
        "  connections: {} per round × {} rounds, {} made, {} open at once at peak; longest ramp {:.1} s",
        r.connections_requested, args.rounds, r.connections_made, r.peak_concurrent, r.ramp_s
    );
    println!(
        "  duration {:.0} s (asked {:?}), pause {} ms mean, sizes up to {} B, {} bulk slots",
        r.duration_s, args.duration, args.pause_ms, args.max_size, args.bulk_slots
    );
    println!(
        "  exchanges {}, bytes checked {} ({:.2} GB), errors {}",
        r.exchanges,
        r.bytes_checked,
        r.bytes_checked as f64 / 1e9,
        r.errors
    );
    for e in &r.first_errors {
        println!("    error: {e}");
    }
    println!("  relay  fds base/peak/after      RSS MiB base/peak/after   peak connections_open");
    for f in &r.relays {
        println!(
            "  {:<5}  {:>6} / {:>6} / {:>6}   {:>7.1} / {:>7.1} / {:>7.1}   {}",
            f.name,
            f.baseline.fds,
            f.peak.fds,
            f.after.fds,
            mib(f.baseline.rss_bytes),
            mib(f.peak.rss_bytes),
            mib(f.after.rss_bytes),
            f.peak_connections_open
        );
    }
    for h in &r.hosts {
        println!(
            "  {:<5}  {:>6} / {:>6} / {:>6}   {:>7.1} / {:>7.1} / {:>7.1}   (host, {} processes; peak = largest simultaneous sum)",
            h.name,
            h.baseline.fds,
            h.peak.fds,
            h.after.fds,
            mib(h.baseline.rss_bytes),
            mib(h.peak.rss_bytes),
            mib(h.after.rss_bytes),
            h.processes
        );
    }
    for f in &r.relays {
        let rounds: Vec<String> = f
            .after_rounds
            .iter()
            .map(|a| format!("{} fds {:.1} MiB", a.fds, mib(a.rss_bytes)))
            .collect();
        println!("  {} after each round: {}", f.name, rounds.join(", "));
    }
    let m = &r.tcp_memory;
    println!(
        "  host TCP memory (pages): before {}, peak {} ({:.0} % of the pressure threshold {}; {} sockets allocated then)",
        m.baseline_pages,
        m.peak_pages,
        if m.tcp_mem[1] > 0 {
            100.0 * m.peak_pages as f64 / m.tcp_mem[1] as f64
        } else {
            0.0
        },
        m.tcp_mem[1],
        m.sockets_at_peak
    );
    for c in &r.namespaces {
        println!(
            "  {:<6} TCPMemoryPressures {}, TCPRcvQDrop {}, PruneCalled {}, TCPAbortOnMemory {}",
            c.namespace, c.memory_pressures, c.rcvq_drops, c.prune_called, c.abort_on_memory
        );
    }
    println!(
        "  load average: {} at start, {} at end",
        r.loadavg_start, r.loadavg_end
    );
    for n in &r.notes {
        println!("  note: {n}");
    }
    if r.failures.is_empty() {
        println!("  PASS");
    } else {
        for f in &r.failures {
            println!("  FAIL: {f}");
        }
    }
}
