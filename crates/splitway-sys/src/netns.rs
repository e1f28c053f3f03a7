//! Network namespaces for the lab and the integration tests.
//!
//! Namespaces are created through `ip netns` (so they are visible to every
//! tool) and always removed by `Drop`, which also kills whatever still runs
//! inside. Names carry a caller-chosen prefix plus the pid, so parallel runs
//! never collide and a crashed run's leftovers can be found and removed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::SysError;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique, short name: `{prefix}-{pid36}-{n}`. The dashes delimit the
/// prefix, so cleaning up prefix "sw" never touches "swlt-…" of another run.
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", radix36(std::process::id()))
}

fn radix36(mut v: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii digits")
}

/// Runs a command, returning its output, or an error carrying stderr when it
/// exits non-zero.
pub fn run(cmd: &mut Command) -> Result<Output, SysError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| SysError::Command {
            cmd: shown.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(SysError::Command {
            cmd: shown,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(out)
}

/// `ip ARGS...` in the current namespace.
pub fn ip(args: &[&str]) -> Result<Output, SysError> {
    run(Command::new("ip").args(args))
}

/// An owned network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace and brings its loopback up.
    pub fn create(name: &str) -> Result<Self, SysError> {
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_owned(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A `Command` that runs `program` inside this namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `program args` inside the namespace, failing on non-zero exit.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<Output, SysError> {
        run(self.command(program).args(args))
    }

    /// `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<Output, SysError> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// `sysctl -w KEY=VALUE` inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), SysError> {
        self.exec("sysctl", &["-q", "-w", &format!("{key}={value}")])
            .map(|_| ())
    }

    /// The namespace's `TcpExt` counters (`nstat`'s `TcpExt*`), by name. Read
    /// from a thread inside it: `/proc/net` follows `/proc/self`, the
    /// process's namespace, not the thread's.
    pub fn tcp_ext(&self) -> Result<std::collections::HashMap<String, u64>, SysError> {
        let text = self
            .run_in(|| std::fs::read_to_string("/proc/thread-self/net/netstat"))?
            .map_err(|e| SysError::io("read /proc/thread-self/net/netstat", e))?;
        Ok(parse_tcp_ext(&text))
    }

    /// Runs `f` on a fresh thread whose network namespace is this one.
    /// Sockets created inside `f` stay in this namespace for their lifetime,
    /// wherever they are used afterwards.
    pub fn run_in<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, SysError> {
        run_in_named(&self.name, f)
    }

    /// Kills every process still running inside the namespace.
    pub fn kill_all(&self) {
        if let Ok(out) = ip(&["netns", "pids", &self.name]) {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill(2) takes plain integers; signalling a pid
                    // that already exited fails harmlessly with ESRCH.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.kill_all();
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            tracing::warn!(netns = %self.name, error = %e, "failed to delete namespace");
        }
    }
}

/// Runs `f` on a fresh thread inside the existing namespace `name` (one
/// `ip netns` created, not owned here), like [`Netns::run_in`].
pub fn run_in_named<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SysError> {
    let path = format!("/var/run/netns/{}", name);
    let file = File::open(&path).map_err(|e| SysError::io(format!("open {path}"), e))?;
    let handle = std::thread::spawn(move || -> Result<T, SysError> {
        // SAFETY: setns only changes the calling thread's network
        // namespace; the fd is valid for the duration of the call because
        // `file` is owned by this closure.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(SysError::io("setns", std::io::Error::last_os_error()));
        }
        Ok(f())
    });
    handle
        .join()
        .map_err(|_| SysError::Internal("thread inside namespace panicked".into()))?
}

/// Removes namespaces left behind by earlier runs: every namespace whose name
/// starts with `prefix` and whose embedded pid is no longer alive.
pub fn remove_stale(prefix: &str) {
    let Ok(out) = ip(&["netns", "list"]) else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(pid_part), Some(n), None) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if n.parse::<u32>().is_err() {
            continue;
        }
        let alive = u32::from_str_radix(pid_part, 36)
            .map(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .unwrap_or(false);
        if !alive {
            drop(Netns {
                name: name.to_owned(),
            });
        }
    }
}

/// Creates a veth pair between two namespaces, moving each end into its
/// namespace and bringing both up. Interface names must be ≤ 15 bytes.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<(), SysError> {
    ip(&[
        "link",
        "add",
        a_if,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_delimited() {
        let a = unique_name("swx");
        let b = unique_name("swx");
        assert_ne!(a, b);
        assert!(a.starts_with("swx-"), "{a}");
        assert_eq!(a.matches('-').count(), 2, "{a}");
    }
}

/// `TcpExt:` name and value lines of `/proc/net/netstat`, paired up.
fn parse_tcp_ext(netstat: &str) -> std::collections::HashMap<String, u64> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return Default::default();
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .skip(1)
        .filter_map(|(n, v)| Some((n.to_owned(), v.parse().ok()?)))
        .collect()
}

#[cfg(test)]
mod tcp_ext_tests {
    #[test]
    fn pairs_names_with_values_of_the_tcpext_lines_only() {
        let text =
            "TcpExt: SyncookiesSent TCPFastOpenPassive\nTcpExt: 0 3\nIpExt: InNoRoutes\nIpExt: 9\n";
        let c = super::parse_tcp_ext(text);
        assert_eq!(c.get("TCPFastOpenPassive"), Some(&3));
        assert_eq!(c.get("SyncookiesSent"), Some(&0));
        assert_eq!(c.len(), 2);
    }
}
