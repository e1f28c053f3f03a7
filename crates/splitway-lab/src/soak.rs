//! `splitway lab soak`: many concurrent split connections through a relay
//! pair for a long time, every byte verified, and the relays' descriptors
//! and memory compared before, during and after.
//!
//! Namespaces client — rc — rs — server joined by veth pairs (no emulated
//! delay). The client opens `--connections` SOCKS5 connections through rc
//! (rc dials rs, rs dials the server) and keeps every one busy until
//! `--duration` is over with exchanges of mixed sizes (bytes to MBs), both
//! directions at once: the client's bytes are checked by the server, the
//! server's by the client, each against a pattern derived from a
//! per-exchange seed. Then every connection closes, and the relays must
//! return to their baseline descriptors, and their memory must not grow
//! from one round to the next (`--rounds`). Exits non-zero on any error.

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
const ADMIN: &str = "127.0.0.1:9090";
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

/// `splitway lab soak` options.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Concurrent split connections, all open for the whole run.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// How long the connections keep exchanging data (e.g. 120s, 10m).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
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
    /// Also write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Internal: run only the soak's server (inside the server namespace,
    /// in its own process so that each side has its own descriptor limit).
    #[arg(long, hide = true)]
    pub serve: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?}: expected a number with s, m or h"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (s, m, h)")),
    };
    Ok(Duration::from_secs(secs))
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

/// One relay's figures over the run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RelayFigures {
    pub name: String,
    pub baseline: Resources,
    pub peak: Resources,
    pub after: Resources,
    /// After each round, every connection closed.
    pub after_rounds: Vec<Resources>,
    pub peak_connections_open: u64,
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
    if args.connections == 0 || args.max_size == 0 {
        return Err(LabError::Usage(
            "--connections and --max-size must be positive".into(),
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

/// The namespaces, relays and temp dir of one run; torn down on drop.
struct Rig {
    relays: Vec<(String, Child)>,
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
        for (_, child) in &mut self.relays {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, child) in &mut self.relays {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
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
    fn build(binary: &Path) -> Result<Rig, LabError> {
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
            // 6–32 MiB maxima exhaust the host's global tcp_mem: the stack
            // then drops segments and BBR stalls (docs/reliability.md, run
            // 7). Veth legs need little: 1 MiB is many BDPs here.
            ns.sysctl("net.ipv4.tcp_rmem", "4096 131072 1048576")
                .map_err(|e| sys("sysctl", e))?;
            ns.sysctl("net.ipv4.tcp_wmem", "4096 16384 1048576")
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
        let common = |name: &str| {
            format!(
                "name = \"{name}\"\npsk_file = \"{}\"\nadmin = \"{ADMIN}\"\n",
                psk_path.display()
            )
        };
        let rc_conf = format!(
            "{}\n[[listen]]\nmode = \"socks5\"\naddr = \"{RC_WEST}:{SOCKS_PORT}\"\nallow_clients = [\"10.0.1.0/24\"]\n\n\
             [[peer]]\nname = \"rs\"\naddr = \"{RS_WEST}:{PEER_PORT}\"\n\n\
             [[route]]\ndst = \"10.0.3.0/24\"\nvia = \"rs\"\n",
            common("rc")
        );
        let rs_conf = format!(
            "{}\n[[listen]]\nmode = \"peer\"\naddr = \"0.0.0.0:{PEER_PORT}\"\n\n\
             [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
            common("rs")
        );
        // rs first: rc's peer must be listening when rc comes up.
        for (name, conf) in [("rs", rs_conf), ("rc", rc_conf)] {
            let path = rig.dir.join(format!("{name}.toml"));
            fs::write(&path, conf).map_err(|e| LabError::io("write relay config", e))?;
            let log = fs::File::create(rig.dir.join(format!("{name}.log")))
                .map_err(|e| LabError::io("create relay log", e))?;
            let ns = if name == "rc" { &rig.rc } else { &rig.rs };
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
            rig.relays.push((name.to_owned(), child));
            rig.wait_ready(name)?;
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

    fn ns(&self, relay: &str) -> &Netns {
        if relay == "rc" { &self.rc } else { &self.rs }
    }

    fn pid(&self, relay: &str) -> u32 {
        self.relays
            .iter()
            .find(|(n, _)| n == relay)
            .map(|(_, c)| c.id())
            .expect("relay started")
    }

    fn status(&self, relay: &str) -> Option<serde_json::Value> {
        let out = self
            .ns(relay)
            .command("curl")
            .args(["-sS", "--fail", "--max-time", "5"])
            .arg(format!("http://{ADMIN}/status"))
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
        self.status(relay)?["connections_open"].as_u64()
    }

    fn wait_ready(&mut self, relay: &str) -> Result<(), LabError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.dir.join(format!("{relay}.log"));
            if let Some((_, child)) = self.relays.iter_mut().find(|(n, _)| n == relay)
                && let Ok(Some(status)) = child.try_wait()
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

/// Raises the open-file limits (soft and hard, with prlimit(1) as root) so
/// that this process (two sockets per connection: client and server end)
/// and the relays it starts (two per connection, plus pipes) fit.
fn raise_nofile(connections: usize) -> Result<u64, LabError> {
    let wanted = (connections as u64 * 2 + 4096).max(65_536);
    let pid = std::process::id().to_string();
    let out = Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={wanted}:{wanted}")])
        .stdin(Stdio::null())
        .output();
    if let Ok(out) = &out
        && !out.status.success()
    {
        tracing::warn!(
            "prlimit --nofile={wanted}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let (soft, hard) =
        splitway_sys::sock::raise_nofile_limit().map_err(|e| sys("raise RLIMIT_NOFILE", e))?;
    // Each relay holds two sockets per split connection plus splice pipes
    // while bytes are in flight; the relays inherit this limit.
    let relay_needs = connections as u64 * 2 + RELAY_FD_HEADROOM;
    if soft < relay_needs {
        return Err(LabError::Usage(format!(
            "open-file limit {soft} (hard {hard}, and raising the hard limit was refused) is too low: \
             each relay needs 2 descriptors per connection plus {RELAY_FD_HEADROOM} headroom, {relay_needs} for {connections} connections; \
             at most {} connections fit",
            soft.saturating_sub(RELAY_FD_HEADROOM) / 2
        )));
    }
    Ok(soft)
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
    raise_nofile(connections)?;
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
    let result = exchanges(id, stream, &args, &counters, until).await;
    counters.open.fetch_sub(1, Relaxed);
    if let Err(e) = result {
        counters.error(format!("connection {id}: {e}"));
    }
}

async fn exchanges(
    id: u64,
    stream: TcpStream,
    args: &SoakArgs,
    counters: &Counters,
    until: Instant,
) -> Result<(), String> {
    let mut rng = Rng(splitmix(id ^ 0xC0FF_EE00));
    let (mut r, mut w) = stream.into_split();
    // Spread the first exchanges over one pause.
    tokio::time::sleep(Duration::from_millis(rng.below(args.pause_ms + 1))).await;
    let mut n = 0u64;
    while Instant::now() < until {
        let up = rng.size(args.max_size);
        let down = rng.size(args.max_size);
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
        let pause = rng.below(2 * args.pause_ms + 1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
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

fn soak(args: &SoakArgs) -> Result<SoakReport, LabError> {
    let binary = splitway_binary()?;
    let nofile = raise_nofile(args.connections)?;
    println!(
        "soak: {} connections for {:?} through rc → rs (SOCKS5), open-file limit {nofile}",
        args.connections, args.duration
    );
    let mut rig = Rig::build(&binary)?;
    rig.start_server(&binary, args.connections)?;
    let mut report = SoakReport {
        connections_requested: args.connections,
        ..SoakReport::default()
    };
    let names = ["rc", "rs"];
    let mut figures: Vec<RelayFigures> = names
        .iter()
        .map(|n| -> Result<RelayFigures, LabError> {
            let baseline = rig.sample(n)?;
            Ok(RelayFigures {
                name: n.to_string(),
                baseline,
                peak: baseline,
                ..RelayFigures::default()
            })
        })
        .collect::<Result<_, _>>()?;

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
        // Sample the relays while the load runs.
        let mut last_print = Instant::now();
        while !load.is_finished() {
            for f in &mut figures {
                let now = rig.sample(&f.name)?;
                f.peak.fds = f.peak.fds.max(now.fds);
                f.peak.rss_bytes = f.peak.rss_bytes.max(now.rss_bytes);
                if let Some(open) = rig.connections_open(&f.name) {
                    f.peak_connections_open = f.peak_connections_open.max(open);
                }
            }
            if let Ok(round) = done_rx.try_recv() {
                after_round(&rig, &mut figures, &mut report, round)?;
                let _ = next_tx.send(());
            }
            if last_print.elapsed() >= Duration::from_secs(10) {
                last_print = Instant::now();
                println!(
                    "  {:>5.0} s: {} open, {} exchanges, {:.2} GB checked, {} errors; rc {} fds {:.0} MiB, rs {} fds {:.0} MiB",
                    started.elapsed().as_secs_f64(),
                    counters.open.load(Relaxed),
                    counters.exchanges.load(Relaxed),
                    counters.bytes.load(Relaxed) as f64 / 1e9,
                    counters.errors.load(Relaxed),
                    figures[0].peak.fds,
                    figures[0].peak.rss_bytes as f64 / 1048576.0,
                    figures[1].peak.fds,
                    figures[1].peak.rss_bytes as f64 / 1048576.0,
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
    }

    report.connections_made = counters.made.load(Relaxed);
    report.peak_concurrent = counters.peak_open.load(Relaxed);
    report.exchanges = counters.exchanges.load(Relaxed);
    report.bytes_checked = counters.bytes.load(Relaxed);
    report.errors = counters.errors.load(Relaxed);
    report.first_errors = counters.first_errors.lock().expect("errors lock").clone();
    report.relays = figures;
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
    if report.exchanges == 0 {
        report.failures.push("no exchange completed".into());
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
        "  duration {:.0} s (asked {:?}), pause {} ms mean, sizes up to {} B",
        r.duration_s, args.duration, args.pause_ms, args.max_size
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
    for f in &r.relays {
        let rounds: Vec<String> = f
            .after_rounds
            .iter()
            .map(|a| format!("{} fds {:.1} MiB", a.fds, mib(a.rss_bytes)))
            .collect();
        println!("  {} after each round: {}", f.name, rounds.join(", "));
    }
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
