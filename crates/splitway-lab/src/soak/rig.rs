//! The soak's namespaces and relay processes, and the open-file sums they need.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use splitway_sys::netns::{self, Netns};

use crate::runner::LabError;
use crate::testbed::chain;
use crate::testbed::config::{
    self as testbed, ListenMode, RawAccel, RawListener, RawPeer, RawRoute,
};

use super::spec::*;

pub(super) struct RelayProcess {
    /// `rc1`, `rc2`, `rs1`, ...
    pub(super) name: String,
    pub(super) host: &'static str,
    pub(super) admin: String,
    pub(super) child: Child,
}

/// The namespaces, relays and temp dir of one run; torn down on drop.
pub(super) struct Rig {
    pub(super) relays: Vec<RelayProcess>,
    pub(super) server_process: Option<Child>,
    pub(super) client: Netns,
    pub(super) rc: Netns,
    pub(super) rs: Netns,
    pub(super) server: Netns,
    pub(super) dir: PathBuf,
    /// Keep the temp dir (relay configs and logs) for a failed run.
    pub(super) keep: bool,
    /// The bpf filesystem mounted for the relays (None: the mount failed).
    bpffs: Option<PathBuf>,
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
        if let Some(bpffs) = &self.bpffs {
            let _ = Command::new("umount").arg("-l").arg(bpffs).status();
        }
        if self.keep {
            println!("relay configs and logs kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

pub(super) fn sys(what: &str, e: splitway_sys::SysError) -> LabError {
    LabError::Peer {
        tool: what.into(),
        host: "soak namespaces".into(),
        detail: e.to_string(),
    }
}

impl Rig {
    pub(super) fn build(binary: &Path, processes: usize) -> Result<Rig, LabError> {
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
            bpffs: None,
        };
        // rs's two processes share a peer port: they take 0-RTT Hellos
        // only with the host-wide strike register, pinned in a bpf
        // filesystem they both see. `ip netns exec` gives each its own
        // /sys, so they get one of the rig's own (docs/protocol.md §3).
        let bpffs = rig.dir.join("bpffs");
        let mounted = fs::create_dir_all(&bpffs).is_ok()
            && Command::new("mount")
                .args(["-t", "bpf", "bpf"])
                .arg(&bpffs)
                .status()
                .is_ok_and(|s| s.success());
        if mounted {
            rig.bpffs = Some(bpffs);
        } else {
            println!(
                "no bpf filesystem for the relays: rs refuses 0-RTT Hellos, rc uses the challenge"
            );
        }
        // The testbed's chain: client 10.0.1.1, rc 10.0.1.2 / 10.0.12.1,
        // rs 10.0.12.2 / 10.0.3.1, server 10.0.3.2 (the constants above).
        chain::wire(&[&rig.client, &rig.rc, &rig.rs, &rig.server]).map_err(|e| LabError::Peer {
            tool: "testbed chain".into(),
            host: "soak namespaces".into(),
            detail: e.to_string(),
        })?;
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
        let rc_conf = |admin: &str| {
            let mut cfg = testbed::relay("rc", admin, Some(&psk_path));
            let mut socks = RawListener::new(ListenMode::Socks5, format!("{RC_WEST}:{SOCKS_PORT}"));
            socks.reuse_port = Some(true);
            socks.allow_clients = vec!["10.0.1.0/24".into()];
            cfg.listen.push(socks);
            cfg.peer
                .push(RawPeer::new("rs", format!("{RS_WEST}:{PEER_PORT}")));
            cfg.route.push(RawRoute::new("10.0.3.0/24", "rs"));
            // No pool: its idle legs count as open on rs, and each round
            // must end with none open (the pool has its own tests).
            cfg.accel = Some(RawAccel {
                pool: Some(false),
                ..RawAccel::default()
            });
            cfg.to_toml()
        };
        let rs_conf = |admin: &str| {
            let mut cfg = testbed::relay("rs", admin, Some(&psk_path));
            let mut peer = RawListener::new(ListenMode::Peer, format!("0.0.0.0:{PEER_PORT}"));
            peer.reuse_port = Some(true);
            cfg.listen.push(peer);
            cfg.route.push(RawRoute::new("0.0.0.0/0", "direct"));
            cfg.to_toml()
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
    pub(super) fn start_server(
        &mut self,
        binary: &Path,
        connections: usize,
    ) -> Result<(), LabError> {
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

    pub(super) fn relay(&self, name: &str) -> &RelayProcess {
        self.relays
            .iter()
            .find(|r| r.name == name)
            .expect("relay started")
    }

    pub(super) fn pid(&self, relay: &str) -> u32 {
        self.relay(relay).child.id()
    }

    pub(super) fn status(&self, relay: &str) -> Option<splitway_api::Status> {
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

    pub(super) fn connections_open(&self, relay: &str) -> Option<u64> {
        Some(self.status(relay)?.connections_open)
    }

    pub(super) fn wait_ready(&mut self, relay: &str) -> Result<(), LabError> {
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

    pub(super) fn sample(&self, relay: &str) -> Result<Resources, LabError> {
        resources(self.pid(relay)).ok_or_else(|| LabError::Peer {
            tool: "splitway relay".into(),
            host: relay.into(),
            detail: "process gone (crashed?)".into(),
        })
    }
}

/// After a round's clients closed: waits until both relays report no open
/// connection, lets deferred frees run, and records their figures.
pub(super) fn after_round(
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
pub(super) fn raise_nofile(
    connections: usize,
    relay_processes: Option<usize>,
) -> Result<u64, LabError> {
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
pub(super) fn relay_share(connections: usize, processes: usize) -> u64 {
    let even = (connections as u64).div_ceil(processes as u64);
    if processes == 1 {
        even
    } else {
        (even * (100 + REUSEPORT_SKEW_PERCENT)).div_ceil(100)
    }
}

pub(super) fn relay_fds_needed(connections: usize, processes: usize) -> u64 {
    relay_share(connections, processes) * 2 + RELAY_FD_HEADROOM
}
