//! What a config asks of this host, tested rather than assumed: the
//! interfaces `intercept` and `watch` name exist (in this network
//! namespace), each listening address is free, and the programs the
//! config's features run (`nft` for interception, `ip` for Turbo-Start's
//! routes) start. `relay --check` reports all of
//! them; a start refuses a missing interface before it installs anything
//! (the ports and programs fail the start by themselves when binding and
//! installing).

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};

use crate::config::Config;

/// One thing the host lacks for the config, named by the key that asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIssue {
    pub key: String,
    pub message: String,
    /// Worth saying but no reason to refuse the file: a port held by a
    /// running splitway, likely this relay (`--check` before a reload).
    pub warning: bool,
}

impl fmt::Display for HostIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.warning {
            f.write_str("warning: ")?;
        }
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The failure a start reports for missing interfaces, every one of them.
#[derive(Debug, Clone, thiserror::Error)]
#[error("this host lacks what the config names: {}", list(.0))]
pub struct HostIssues(pub Vec<HostIssue>);

fn list(issues: &[HostIssue]) -> String {
    issues
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything `relay --check` tests on this host. `inherited`: addresses
/// of listening sockets passed by socket activation, which hold their ports
/// for this relay.
pub fn check(cfg: &Config, inherited: &[SocketAddr]) -> Vec<HostIssue> {
    let mut issues = interfaces(cfg, &present_interfaces());
    issues.extend(ports(cfg, inherited));
    issues.extend(programs(cfg));
    issues
}

/// The interfaces of this network namespace (`/proc/thread-self/net/dev` follows
/// the namespace of the reading thread, unlike `/sys/class/net`, which
/// shows that of whoever mounted sysfs).
pub fn present_interfaces() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap_or_default();
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_owned()))
        .collect()
}

/// Each interface `intercept` or `watch` names that `present` lacks, with
/// what to write instead.
pub fn interfaces(cfg: &Config, present: &[String]) -> Vec<HostIssue> {
    let mut issues = Vec::new();
    let mut candidates: Vec<&str> = present
        .iter()
        .map(String::as_str)
        .filter(|n| *n != "lo")
        .collect();
    candidates.sort_unstable();
    let hint = match candidates.as_slice() {
        [] => "this host has only lo: name the interface clients arrive on".to_owned(),
        [one] => format!("this host has `{one}`: name it instead"),
        many => format!(
            "this host has {}: name the one clients reach it on",
            many.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    for (i, l) in cfg.listeners.iter().enumerate() {
        let named = l
            .intercept
            .iter()
            .flat_map(|x| x.interfaces.iter().enumerate())
            .map(|(j, n)| (format!("listen[{i}].intercept.interfaces[{j}]"), n))
            .chain(
                l.watch
                    .iter()
                    .enumerate()
                    .map(|(j, n)| (format!("listen[{i}].watch[{j}]"), n)),
            );
        for (key, name) in named {
            if !present.iter().any(|p| p == name) {
                issues.push(HostIssue {
                    key,
                    message: format!(
                        "no interface `{name}` here, so nothing would be intercepted ({hint})"
                    ),
                    warning: false,
                });
            }
        }
    }
    issues
}

/// Each listening address another program holds (or this host cannot
/// bind), with the holder when `/proc` tells. Skipped: addresses passed by
/// socket activation and `reuse_port` listeners (shared by design).
pub fn ports(cfg: &Config, inherited: &[SocketAddr]) -> Vec<HostIssue> {
    let mut issues = Vec::new();
    let mut addrs: Vec<(String, SocketAddr)> = cfg
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.reuse_port && !inherited.contains(&l.addr))
        .map(|(i, l)| (format!("listen[{i}].addr"), l.addr))
        .collect();
    let own_http = [("admin", cfg.admin), ("metrics", cfg.metrics)];
    for (key, addr) in own_http {
        if let Some(addr) = addr
            && !inherited.contains(&addr)
        {
            addrs.push((key.to_owned(), addr));
        }
    }
    for (key, addr) in addrs {
        let Err(e) = bind_test(addr) else { continue };
        let mut warning = false;
        let message = match e.kind() {
            std::io::ErrorKind::AddrInUse => match holder(addr) {
                Some(h) if h.comm == "splitway" => {
                    warning = true;
                    format!(
                        "{addr} is in use by splitway (pid {}): a relay with this config may already run (a restart frees it); otherwise stop it or change the address",
                        h.pid
                    )
                }
                // systemd's socket unit holds it for the relay it starts.
                Some(h) if h.pid == 1 => {
                    warning = true;
                    format!(
                        "{addr} is held by {} (pid 1): fine if a splitway .socket unit passes it to this relay (socket activation); otherwise change the address",
                        h.comm
                    )
                }
                Some(h) => format!(
                    "{addr} is in use by {} (pid {}): stop it or change the address",
                    h.comm, h.pid
                ),
                None => {
                    format!("{addr} is in use by another program: stop it or change the address")
                }
            },
            std::io::ErrorKind::AddrNotAvailable => {
                format!("{addr} is not an address of this host")
            }
            _ => format!("cannot listen on {addr}: {e}"),
        };
        issues.push(HostIssue {
            key,
            message,
            warning,
        });
    }
    issues
}

/// Binds and drops a listening socket on `addr`, as the relay would
/// (SO_REUSEADDR: a port whose old connections wait in TIME_WAIT is free).
fn bind_test(addr: SocketAddr) -> std::io::Result<()> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1)
}

/// The process holding a listening socket.
struct Holder {
    pid: u32,
    comm: String,
}

/// Who listens on `addr`'s port (on its address or the wildcard): the
/// socket's inode from `/proc/self/net/tcp{,6}`, then the process with an
/// fd on it. `None` when not found (another user's process, without root).
fn holder(addr: SocketAddr) -> Option<Holder> {
    let inodes = listening_inodes(addr);
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok());
            if inode.is_some_and(|i| inodes.contains(&i)) {
                let comm = std::fs::read_to_string(entry.path().join("comm"))
                    .map_or_else(|_| "unknown".to_owned(), |c| c.trim().to_owned());
                return Some(Holder { pid, comm });
            }
        }
    }
    None
}

/// Inodes of the listening sockets on `addr`'s port, on its address or a
/// wildcard of either family.
fn listening_inodes(addr: SocketAddr) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for file in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st ... inode (field 10)
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            const LISTEN: &str = "0A";
            if *state != LISTEN {
                continue;
            }
            let Some((ip_hex, port_hex)) = local.split_once(':') else {
                continue;
            };
            if u16::from_str_radix(port_hex, 16).ok() != Some(addr.port()) {
                continue;
            }
            let ip = proc_net_ip(ip_hex);
            if ip.is_none_or(|ip| {
                ip.is_unspecified() || ip == addr.ip() || addr.ip().is_unspecified()
            }) && let Ok(inode) = inode.parse()
            {
                inodes.insert(inode);
            }
        }
    }
    inodes
}

/// An address as `/proc/net/tcp{,6}` writes it: 32-bit words in host order.
fn proc_net_ip(hex: &str) -> Option<IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// The programs the config's features run, started once each
/// (`--version`), each reported at the key that needs it: `nft` for an
/// `intercept` listener, `iptables` and `ip6tables` for strict mode too,
/// and `ip` for Turbo-Start's routes. TPROXY's policy route is rtnetlink
/// messages, not `ip` (`splitway_sys::rtnl`).
pub fn programs(cfg: &Config) -> Vec<HostIssue> {
    needed_programs(cfg)
        .into_iter()
        .filter_map(|(key, program, arg, package)| {
            let ran = Command::new(program)
                .arg(arg)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let problem = match ran {
                Ok(s) if s.success() => return None,
                Ok(s) => format!("`{program} {arg}` failed ({s})"),
                Err(e) => format!("cannot run `{program}`: {e}"),
            };
            Some(HostIssue {
                key,
                message: format!("{problem}: it is needed here (Debian: apt install {package})"),
                warning: false,
            })
        })
        .collect()
}

/// What [`programs`] runs: (key, program, its version argument, Debian
/// package).
fn needed_programs(cfg: &Config) -> Vec<(String, &'static str, &'static str, &'static str)> {
    let mut needed = Vec::new();
    if let Some(i) = cfg.listeners.iter().position(|l| l.intercept.is_some()) {
        let key = format!("listen[{i}].intercept");
        needed.push((key.clone(), "nft", "--version", "nftables"));
        if cfg.accel.strict {
            needed.push((key.clone(), "iptables", "--version", "iptables"));
            needed.push((key, "ip6tables", "--version", "iptables"));
        }
    }
    if cfg.accel.turbo.is_some() {
        needed.push(("accel.turbo".to_owned(), "ip", "-V", "iproute2"));
    }
    needed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(intercept: &str) -> Config {
        Config::parse_str(&format!(
            "name = \"rc\"\nadmin = \"off\"\n[[listen]]\nmode = \"tproxy\"\naddr = \"0.0.0.0:7000\"\n{intercept}\n"
        ))
        .unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn programs_of(cfg: &Config) -> Vec<(String, &'static str)> {
        needed_programs(cfg)
            .into_iter()
            .map(|(key, program, _, _)| (key, program))
            .collect()
    }

    #[test]
    fn each_program_is_needed_by_what_runs_it() {
        let key = || "listen[0].intercept".to_owned();
        // Interception's policy route is rtnetlink: `nft` only.
        let mut cfg = config("intercept = { interfaces = [\"eth0\"], ports = [80] }");
        assert_eq!(programs_of(&cfg), [(key(), "nft")]);
        cfg.accel.strict = true;
        assert_eq!(
            programs_of(&cfg),
            [(key(), "nft"), (key(), "iptables"), (key(), "ip6tables")]
        );
        // Turbo-Start's routes are `ip route` runs, with or without interception.
        let mut cfg = config("");
        assert!(programs_of(&cfg).is_empty());
        cfg.accel.turbo = Some(crate::config::Turbo {
            initcwnd: 40,
            initrwnd: 40,
            buffer: 65536,
        });
        assert_eq!(programs_of(&cfg), [("accel.turbo".to_owned(), "ip")]);
    }

    #[test]
    fn a_missing_interface_is_named_with_what_the_host_has() {
        let cfg = config("intercept = { interfaces = [\"eth0\", \"ens3\"], ports = [80] }");
        let present = ["lo".to_owned(), "ens3".to_owned()];
        let issues = interfaces(&cfg, &present);
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].key, "listen[0].intercept.interfaces[0]");
        assert_eq!(
            issues[0].message,
            "no interface `eth0` here, so nothing would be intercepted (this host has `ens3`: name it instead)"
        );
        assert!(interfaces(&cfg, &["eth0".into(), "ens3".into()]).is_empty());
    }

    #[test]
    fn this_namespace_has_lo() {
        assert!(present_interfaces().iter().any(|n| n == "lo"));
    }

    #[test]
    fn a_held_port_names_its_holder() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let cfg = Config::parse_str(&format!(
            "name = \"rc\"\nadmin = \"off\"\n[[listen]]\nmode = \"socks5\"\naddr = \"{addr}\"\n"
        ))
        .unwrap();
        let issues = ports(&cfg, &[]);
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].key, "listen[0].addr");
        let me = std::process::id();
        assert!(
            issues[0].message.contains(&format!("(pid {me})")),
            "{issues:?}"
        );
        // Passed by socket activation: this relay's own.
        assert!(ports(&cfg, &[addr]).is_empty());
        // The metrics-only address is checked like the admin API's.
        let metrics = Config::parse_str(&format!(
            "name = \"rc\"\nadmin = \"off\"\nmetrics = \"{addr}\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:0\"\n"
        ))
        .unwrap();
        let issues = ports(&metrics, &[]);
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].key, "metrics");
        drop(held);
        assert!(ports(&cfg, &[]).is_empty());
        assert!(ports(&metrics, &[]).is_empty());
    }

    #[test]
    fn proc_net_addresses_read_back() {
        // 127.0.0.1 as /proc/net/tcp writes it on a little-endian host.
        let lo = if cfg!(target_endian = "little") {
            "0100007F"
        } else {
            "7F000001"
        };
        assert_eq!(proc_net_ip(lo), Some("127.0.0.1".parse().unwrap()));
    }
}
