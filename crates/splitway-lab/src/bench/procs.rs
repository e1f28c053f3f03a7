//! The proxies under test as child processes, and what /proc says about
//! them (CPU time, RSS, fd limit).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::error::BenchError;
use super::load::{self, Access};
use crate::testbed::config::{
    self as testbed, ListenMode, RawConfig, RawListener, RawPeer, RawRoute,
};

/// The methods compared, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Direct,
    Haproxy,
    Socat,
    Splitway1,
    Splitway2,
    /// The same relays with one accept socket per listener instead of one
    /// per worker thread (`lab bench --accept-compare`).
    Splitway1OneAccept,
    Splitway2OneAccept,
}

impl Method {
    pub const ALL: [Method; 5] = [
        Method::Direct,
        Method::Haproxy,
        Method::Socat,
        Method::Splitway1,
        Method::Splitway2,
    ];

    /// `ALL` and the variants only some runs measure.
    pub const EVERY: [Method; 7] = [
        Method::Direct,
        Method::Haproxy,
        Method::Socat,
        Method::Splitway1,
        Method::Splitway2,
        Method::Splitway1OneAccept,
        Method::Splitway2OneAccept,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Direct => "direct",
            Method::Haproxy => "haproxy",
            Method::Socat => "socat",
            Method::Splitway1 => "splitway-1",
            Method::Splitway2 => "splitway-2",
            Method::Splitway1OneAccept => "splitway-1-one-accept",
            Method::Splitway2OneAccept => "splitway-2-one-accept",
        }
    }

    /// This variant's `[[listen]] accept_sockets` (absent: one per worker).
    fn accept_sockets(self) -> Option<usize> {
        match self {
            Method::Splitway1OneAccept | Method::Splitway2OneAccept => Some(1),
            _ => None,
        }
    }

    /// A loopback listener on `port` with this variant's accept sockets.
    fn listener(self, mode: ListenMode, port: u16) -> RawListener {
        let mut l = RawListener::new(mode, format!("127.0.0.1:{port}"));
        l.accept_sockets = self.accept_sockets();
        l
    }

    pub fn label(self) -> &'static str {
        match self {
            Method::Direct => "direct TCP",
            Method::Haproxy => "HAProxy 2.6 TCP, splice",
            Method::Socat => "socat (fork)",
            Method::Splitway1 => "splitway, one relay",
            Method::Splitway2 => "splitway, relay pair",
            Method::Splitway1OneAccept => "splitway, one relay, one accept socket",
            Method::Splitway2OneAccept => "splitway, relay pair, one accept socket",
        }
    }
}

/// Backend ports (one per traffic kind) as seen by the methods.
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    pub sink: SocketAddr,
    pub echo: SocketAddr,
    pub conn: SocketAddr,
}

/// A running instance of a method: its processes and how to reach each
/// backend through it.
pub struct Instance {
    pub method: Method,
    children: Vec<Child>,
    pub sink: Access,
    pub echo: Access,
    pub conn: Access,
    /// Where clients connect first (for the exec → listening time).
    pub front: Option<SocketAddr>,
    /// Exec of the first process to the last front listener answering.
    pub startup: Option<Duration>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Instance {
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

/// Everything needed to start instances.
pub struct Launcher {
    pub splitway_bin: PathBuf,
    pub dir: PathBuf,
    pub targets: Targets,
    pub psk_file: PathBuf,
    /// HAProxy's maxconn per proxy and overall.
    pub max_connections: usize,
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Launcher {
    /// Starts `method` with its front ports from `base` upwards and waits
    /// until every front listener answers.
    pub fn start(&self, method: Method, base: u16) -> Result<Instance, BenchError> {
        let t = self.targets;
        let mut inst = Instance {
            method,
            children: Vec::new(),
            sink: Access::Plain(t.sink),
            echo: Access::Plain(t.echo),
            conn: Access::Plain(t.conn),
            front: None,
            startup: None,
        };
        let spawned = Instant::now();
        let fronts: Vec<SocketAddr> = match method {
            Method::Direct => return Ok(inst),
            Method::Haproxy => {
                let cfg = self.dir.join(format!("haproxy-{base}.cfg"));
                write(&cfg, &haproxy_config(base, t, self.max_connections))?;
                inst.children.push(spawn(
                    "haproxy",
                    Command::new("haproxy").arg("-db").arg("-f").arg(&cfg),
                )?);
                plain_fronts(&mut inst, base)
            }
            Method::Socat => {
                for (i, target) in [t.sink, t.echo, t.conn].into_iter().enumerate() {
                    let listen = format!(
                        "TCP4-LISTEN:{},bind=127.0.0.1,fork,reuseaddr,backlog=4096",
                        base + i as u16
                    );
                    let connect = format!("TCP4:{target},nodelay");
                    inst.children.push(spawn(
                        "socat",
                        Command::new("socat").arg(listen).arg(connect),
                    )?);
                }
                plain_fronts(&mut inst, base)
            }
            Method::Splitway1 | Method::Splitway1OneAccept => {
                for (file, cfg) in self.relay_configs(method, base) {
                    let path = self.dir.join(file);
                    write(&path, &cfg.to_toml())?;
                    inst.children.push(self.spawn_relay(&path)?);
                }
                connect_fronts(&mut inst, addr(base))
            }
            Method::Splitway2 | Method::Splitway2OneAccept => {
                // rs first: rc's peer must be listening when rc comes up.
                for (file, cfg) in self.relay_configs(method, base) {
                    let path = self.dir.join(file);
                    write(&path, &cfg.to_toml())?;
                    inst.children.push(self.spawn_relay(&path)?);
                }
                let mut fronts = vec![addr(base + 1)];
                fronts.extend(connect_fronts(&mut inst, addr(base)));
                fronts
            }
        };
        for front in &fronts {
            match load::wait_listening(*front, spawned, Duration::from_secs(10)) {
                Some(elapsed) => inst.startup = Some(elapsed),
                None => {
                    return Err(BenchError::Tool {
                        tool: method.name().into(),
                        detail: format!("not listening on {front} after 10 s"),
                    });
                }
            }
        }
        inst.front = fronts.last().copied();
        // The whole request path must work before anything is measured.
        load::open_idle(inst.conn, 1).map_err(|e| BenchError::Tool {
            tool: method.name().into(),
            detail: format!("first request through it failed: {e}"),
        })?;
        Ok(inst)
    }

    /// The relay's connection cap, sized like HAProxy's maxconn to the fd
    /// limit the relays inherit.
    /// A splitway method's relay configs and file names, the relay nearest
    /// the backends first: one relay (`bench1`), or `rs` on `base + 1` and
    /// `rc` dialing it. Admin ports from `base + 50`: an admin listener
    /// because `admin = "off"` currently makes the relay drain at once (its
    /// drain channel closes).
    fn relay_configs(&self, method: Method, base: u16) -> Vec<(String, RawConfig)> {
        let psk = Some(self.psk_file.as_path());
        let front = method.listener(ListenMode::HttpConnect, base);
        if matches!(method, Method::Splitway1 | Method::Splitway1OneAccept) {
            let mut relay = self.relay("bench1", base + 50, None);
            relay.listen.push(front);
            relay.route.push(RawRoute::new("127.0.0.0/8", "direct"));
            return vec![(format!("splitway1-{base}.toml"), relay)];
        }
        let rs_port = base + 1;
        let mut rs = self.relay("rs", base + 51, psk);
        rs.listen.push(method.listener(ListenMode::Peer, rs_port));
        rs.route.push(RawRoute::new("0.0.0.0/0", "direct"));
        let mut rc = self.relay("rc", base + 50, psk);
        rc.listen.push(front);
        rc.peer
            .push(RawPeer::new("rs", format!("127.0.0.1:{rs_port}")));
        rc.route.push(RawRoute::new("127.0.0.0/8", "rs"));
        vec![
            (format!("splitway-rs-{base}.toml"), rs),
            (format!("splitway-rc-{base}.toml"), rc),
        ]
    }

    /// A bench relay: loopback admin on `admin_port`, the run's limits.
    fn relay(&self, name: &str, admin_port: u16, psk_file: Option<&Path>) -> RawConfig {
        let mut cfg = testbed::relay(name, &format!("127.0.0.1:{admin_port}"), psk_file);
        cfg.limits = Some(testbed::max_connections(self.max_connections));
        cfg
    }

    fn spawn_relay(&self, cfg: &Path) -> Result<Child, BenchError> {
        spawn(
            "splitway relay",
            Command::new(&self.splitway_bin)
                .arg("relay")
                .arg("--config")
                .arg(cfg)
                .env("RUST_LOG", "warn"),
        )
    }
}

fn plain_fronts(inst: &mut Instance, base: u16) -> Vec<SocketAddr> {
    let fronts = vec![addr(base), addr(base + 1), addr(base + 2)];
    inst.sink = Access::Plain(fronts[0]);
    inst.echo = Access::Plain(fronts[1]);
    inst.conn = Access::Plain(fronts[2]);
    fronts
}

fn connect_fronts(inst: &mut Instance, proxy: SocketAddr) -> Vec<SocketAddr> {
    let via = |a: Access| match a {
        Access::Plain(target) => Access::HttpConnect { proxy, target },
        other => other,
    };
    inst.sink = via(inst.sink);
    inst.echo = via(inst.echo);
    inst.conn = via(inst.conn);
    vec![proxy]
}

/// `maxpipes 64`: HAProxy reserves two fds per pipe up front (default
/// maxconn/4 pipes), which would not fit next to 10,000 connections under a
/// 20,000 fd limit; the bench never splices more than 8 streams at once.
fn haproxy_config(base: u16, t: Targets, max_connections: usize) -> String {
    let mut cfg = format!(
        "global\n  maxconn {max_connections}\n  tune.pipesize 262144\n  maxpipes 64\n\ndefaults\n  mode tcp\n  \
         timeout connect 5s\n  timeout client 5m\n  timeout server 5m\n  \
         option splice-request\n  option splice-response\n  maxconn {max_connections}\n",
    );
    for (i, target) in [t.sink, t.echo, t.conn].into_iter().enumerate() {
        cfg.push_str(&format!(
            "\nlisten p{i}\n  bind 127.0.0.1:{}\n  server s{i} {target}\n",
            base + i as u16
        ));
    }
    cfg
}

fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Io {
        op: format!("write {}", path.display()),
        source,
    })
}

fn spawn(tool: &str, cmd: &mut Command) -> Result<Child, BenchError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| BenchError::Tool {
            tool: tool.into(),
            detail: format!("cannot start: {e}"),
        })
}

/// Clock ticks per second for /proc/<pid>/stat times.
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Fields 14.. of /proc/<pid>/stat as numbers: utime, stime, cutime, cstime.
fn stat_times(pid: u32) -> Option<[u64; 4]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14.
    let get = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    Some([get(14)?, get(15)?, get(16)?, get(17)?])
}

/// utime+stime+cutime+cstime of `pid` in ticks (children count once reaped).
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_times(pid).map(|t| t.iter().sum())
}

/// utime+stime of `pid` alone.
fn own_cpu_ticks(pid: u32) -> Option<u64> {
    stat_times(pid).map(|t| t[0] + t[1])
}

/// Resident set size of `pid` in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The soft and hard "Max open files" of `pid`.
pub fn nofile_limits(pid: u32) -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line.split_whitespace().skip(3);
    let soft = fields.next()?.parse().ok()?;
    let hard = fields.next()?.parse().ok()?;
    Some((soft, hard))
}

/// Direct children of `pid` (socat's per-connection forks).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// `pids` and their live children.
fn with_children(pids: &[u32]) -> Vec<u32> {
    let mut all = pids.to_vec();
    for pid in pids {
        all.extend(children(*pid));
    }
    all
}

/// CPU ticks of `pids`, their live children and their reaped children.
pub fn sum_cpu(pids: &[u32]) -> u64 {
    let live_children: u64 = pids
        .iter()
        .flat_map(|p| children(*p))
        .filter_map(own_cpu_ticks)
        .sum();
    pids.iter().filter_map(|p| cpu_ticks(*p)).sum::<u64>() + live_children
}

/// RSS of `pids` and their live children.
pub fn sum_rss(pids: &[u32]) -> u64 {
    with_children(pids)
        .iter()
        .filter_map(|p| rss_bytes(*p))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves the one key file the configs name; reads nothing else.
    struct KeyOnly(PathBuf);

    impl splitway_relay::config::Source for KeyOnly {
        fn read(&self, path: &Path, _: u64, _: &str) -> std::io::Result<Vec<u8>> {
            assert_eq!(path, self.0, "only the key file is read");
            Ok([b'a'; 64].to_vec())
        }

        fn congestion_controls(&self) -> Vec<String> {
            Vec::new()
        }
    }

    /// Every splitway method's configs are valid relay configs, with the
    /// run's limit and the variant's accept sockets.
    #[test]
    fn every_splitway_method_writes_valid_relay_configs() {
        let launcher = Launcher {
            splitway_bin: PathBuf::from("splitway"),
            dir: PathBuf::from("/nonexistent"),
            targets: Targets {
                sink: addr(9001),
                echo: addr(9002),
                conn: addr(9003),
            },
            psk_file: PathBuf::from("/nonexistent/psk.key"),
            max_connections: 1234,
        };
        let source = KeyOnly(launcher.psk_file.clone());
        for method in [
            Method::Splitway1,
            Method::Splitway2,
            Method::Splitway1OneAccept,
            Method::Splitway2OneAccept,
        ] {
            let configs = launcher.relay_configs(method, 20_000);
            let hops = if matches!(method, Method::Splitway1 | Method::Splitway1OneAccept) {
                1
            } else {
                2
            };
            assert_eq!(configs.len(), hops, "{method:?}");
            for (file, raw) in configs {
                let text = raw.to_toml();
                let cfg = splitway_relay::Config::parse_with(&text, Path::new("."), &source)
                    .unwrap_or_else(|e| panic!("{method:?} {file}:\n{text}\n{e:#?}"));
                assert_eq!(cfg.limits.max_connections, 1234);
                assert_eq!(cfg.listeners[0].accept_sockets, method.accept_sockets());
            }
        }
    }
}
