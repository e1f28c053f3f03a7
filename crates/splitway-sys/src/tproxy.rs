//! TPROXY interception installed by the relay itself (`intercept = {...}`):
//! an nftables table redirecting the chosen interfaces and ports to the
//! relay's transparent listener, plus the fwmark policy route that delivers
//! the redirected packets locally. Everything is removed again on drop.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use crate::SysError;
use crate::netns::run;
use crate::rtnl::{Family, Rtnl};

/// Firewall mark and routing table used for intercepted packets ("SW").
/// Distinct from the mark 1 / table 100 of hand-written setups.
pub const FWMARK: u32 = 0x5357;
pub const ROUTE_TABLE: u32 = 0x5357;

/// What to intercept and where to send it.
#[derive(Debug, Clone)]
pub struct InterceptSpec {
    /// nft table name; one per relay so two relays never clash.
    pub table: String,
    pub interfaces: Vec<String>,
    pub ports: Vec<u16>,
    /// The transparent listener's address; only its port and family matter.
    pub listener: SocketAddr,
    /// An IPv6-only `[::]` listener (another one serves IPv4 on the port).
    pub v6_only: bool,
}

/// Installed rules; dropping this removes them.
#[derive(Debug)]
pub struct Interception {
    table: String,
    families: Vec<&'static str>,
}

impl InterceptSpec {
    /// The IP families the listener serves: a `[::]` listener is dual-stack.
    fn families(&self) -> Vec<&'static str> {
        match self.listener {
            SocketAddr::V4(_) => vec!["ip"],
            SocketAddr::V6(a) if a.ip().is_unspecified() && !self.v6_only => vec!["ip", "ip6"],
            SocketAddr::V6(_) => vec!["ip6"],
        }
    }

    /// The nftables script (also shown by `--check` so an operator can
    /// install the same rules by hand).
    pub fn ruleset(&self) -> String {
        let port = self.listener.port();
        let ifaces = self
            .interfaces
            .iter()
            .map(|i| format!("\"{i}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let ports = self
            .ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let mut s = format!(
            "table inet {t} {{\n  chain prerouting {{\n    type filter hook prerouting priority mangle; policy accept;\n    {established}\n",
            t = self.table,
            established = established_rule(),
        );
        for fam in self.families() {
            let nfproto = if fam == "ip" { "ipv4" } else { "ipv6" };
            s.push_str(&format!(
                "    meta nfproto {nfproto} iifname {{ {ifaces} }} meta l4proto tcp th dport {{ {ports} }} tproxy {fam} to :{port} meta mark set {FWMARK:#x} accept\n"
            ));
        }
        s.push_str("  }\n}\n");
        s
    }

    /// Installs the table and policy routes. On failure nothing is left.
    pub fn install(&self) -> Result<Interception, SysError> {
        self.start()?.finish()
    }

    /// [`InterceptSpec::install`] in two halves: this spawns `nft` with the
    /// table and returns while it runs (tens of ms the caller can spend on
    /// other start-up work); [`PendingInterception::finish`] waits for it
    /// and adds the policy route.
    pub fn start(&self) -> Result<PendingInterception, SysError> {
        let installed = Interception {
            table: self.table.clone(),
            families: self.families(),
        };
        // A table left by a crashed run would make `add table` merge rules:
        // one transaction declares the table (a no-op if it is there),
        // deletes it and writes it anew. One `nft` run, not two: each
        // costs a few ms of the relay's start.
        let nft = nft_spawn(&format!(
            "add table inet {t}\ndelete table inet {t}\n{rules}",
            t = self.table,
            rules = self.ruleset()
        ))?;
        Ok(PendingInterception {
            nft: Some(nft),
            installed: Some(installed),
        })
    }
}

/// An interception whose `nft` transaction is still running. Dropped
/// without [`PendingInterception::finish`], it waits for `nft` and then
/// removes what was installed.
#[derive(Debug)]
pub struct PendingInterception {
    nft: Option<Child>,
    installed: Option<Interception>,
}

impl PendingInterception {
    /// Waits for the table, then adds the policy route. On failure nothing
    /// is left.
    pub fn finish(mut self) -> Result<Interception, SysError> {
        if let Some(nft) = self.nft.take() {
            nft_wait(nft)?;
        }
        let installed = self.installed.take().expect("finished once");
        // The policy route over rtnetlink, not three `ip` runs per family
        // (about 7 ms each). Idempotent: an identical rule from a previous
        // run is reused; the route is replaced.
        let mut rtnl = Rtnl::open()?;
        for fam in &installed.families {
            let family = rtnl_family(fam);
            rtnl.add_fwmark_rule(family, FWMARK, ROUTE_TABLE)?;
            rtnl.replace_local_default(family, ROUTE_TABLE)?;
        }
        Ok(installed)
    }
}

impl Drop for PendingInterception {
    fn drop(&mut self) {
        // Removing the table while `nft` may still be adding it could leave it.
        if let Some(nft) = self.nft.take()
            && let Err(e) = nft_wait(nft)
        {
            tracing::warn!(error = %e, "nft, left running by a start that failed, failed too");
        }
    }
}

/// The rtnetlink family of an nft family name (`ip` or `ip6`).
fn rtnl_family(fam: &str) -> Family {
    if fam == "ip" { Family::V4 } else { Family::V6 }
}

fn nft_script(script: &str) -> Result<(), SysError> {
    nft_wait(nft_spawn(script)?)
}

/// `nft -f -` reading `script`, running: the script is written and its
/// stdin closed before this returns (a ruleset fits the pipe's buffer).
fn nft_spawn(script: &str) -> Result<Child, SysError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| SysError::Command {
            cmd: "nft -f -".into(),
            detail: e.to_string(),
        })?;
    let written = child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(script.as_bytes());
    if let Err(e) = written {
        let _ = child.wait();
        return Err(SysError::io("write nft script", e));
    }
    Ok(child)
}

fn nft_wait(child: Child) -> Result<(), SysError> {
    let out = child
        .wait_with_output()
        .map_err(|e| SysError::io("wait for nft", e))?;
    if !out.status.success() {
        return Err(SysError::Command {
            cmd: "nft -f -".into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// The rule that delivers packets of connections a transparent socket
/// already holds. SYNs are left to the tproxy rule: `socket transparent`
/// also matches a TIME_WAIT socket, so a client SYN reusing the 4-tuple of
/// a connection the relay closed first would be delivered to that
/// TIME_WAIT socket and answered with an ACK, and the client would
/// retransmit after a second. The tproxy rule handles exactly this case
/// (the kernel's `nf_tproxy_handle_time_wait4/6`: the SYN goes to the
/// listener and the TIME_WAIT socket is retired). `tcp flags` masks out
/// ECE/CWR, so an ECN-setup SYN counts as a SYN.
fn established_rule() -> String {
    format!(
        "meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn socket transparent 1 meta mark set {FWMARK:#x} accept"
    )
}

impl Interception {
    /// Stops redirecting new connections while those already accepted keep
    /// reaching their sockets (a drain): only the rule for established
    /// transparent sockets stays, with the policy route it needs. New SYNs
    /// are routed on to their destination as if the relay were not there.
    pub fn stop_new(&self) -> Result<(), SysError> {
        nft_script(&self.established_only_ruleset())
    }

    /// One nft transaction: the chain is emptied and refilled atomically.
    fn established_only_ruleset(&self) -> String {
        format!(
            "flush chain inet {t} prerouting\nadd rule inet {t} prerouting {rule}\n",
            t = self.table,
            rule = established_rule()
        )
    }
}

impl Drop for Interception {
    fn drop(&mut self) {
        if let Err(e) = run(Command::new("nft").args(["delete", "table", "inet", &self.table])) {
            tracing::warn!(table = %self.table, error = %e, "failed to remove nft table");
        }
        let mut rtnl = match Rtnl::open() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "failed to remove the TPROXY policy route");
                return;
            }
        };
        for fam in &self.families {
            let family = rtnl_family(fam);
            // As `ip rule del` and `ip route flush` were: errors ignored
            // (another relay in the namespace may have removed them).
            let _ = rtnl.del_fwmark_rule(family, FWMARK, ROUTE_TABLE);
            let _ = rtnl.flush_table(family, ROUTE_TABLE);
        }
    }
}

/// Mark a strict-mode verdict puts on a SYN whose server refused: the
/// strict nft table answers it with a TCP reset ("SX").
pub const REFUSED_MARK: u32 = 0x5358;

/// Strict mode's rules for one intercepting listener: intercepted SYNs go
/// to an NFQUEUE before TPROXY sees them, and SYNs released with
/// [`REFUSED_MARK`] are answered with a reset.
///
/// The queue rule sits in iptables' `raw` table (the kernel has no native
/// nft `queue`): raw PREROUTING runs before the mangle-priority TPROXY
/// table, and an accept verdict continues with the next hooks, so the
/// released SYN then meets TPROXY untouched (no repeat, no mark needed).
/// The reject rule is nft, one priority ahead of TPROXY.
#[derive(Debug, Clone)]
pub struct StrictSpec {
    /// iptables chain and nft table name (≤ 28 characters).
    pub name: String,
    pub interfaces: Vec<String>,
    pub ports: Vec<u16>,
    pub queue: u16,
    /// Whether IPv4 / IPv6 SYNs are intercepted.
    pub v4: bool,
    pub v6: bool,
}

/// Installed strict rules; dropping this removes them.
#[derive(Debug)]
pub struct StrictRules {
    name: String,
    tools: Vec<&'static str>,
}

impl StrictSpec {
    fn tools(&self) -> Vec<&'static str> {
        let mut t = Vec::new();
        if self.v4 {
            t.push("iptables");
        }
        if self.v6 {
            t.push("ip6tables");
        }
        t
    }

    /// The iptables rules (arguments after the tool name), for one family.
    pub fn queue_rules(&self) -> Vec<Vec<String>> {
        let ports = self
            .ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        self.interfaces
            .iter()
            .map(|i| {
                [
                    "-t",
                    "raw",
                    "-A",
                    &self.name,
                    "-i",
                    i,
                    "-p",
                    "tcp",
                    "--syn",
                    "-m",
                    "multiport",
                    "--dports",
                    &ports,
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    &self.queue.to_string(),
                    // Without a reader (the relay died) SYNs pass to TPROXY
                    // instead of being dropped.
                    "--queue-bypass",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            })
            .collect()
    }

    /// The nft table answering refused SYNs with a reset.
    pub fn reject_ruleset(&self) -> String {
        format!(
            "table inet {t} {{\n  chain prerouting {{\n    type filter hook prerouting priority mangle - 1; policy accept;\n    meta l4proto tcp meta mark {REFUSED_MARK:#x} reject with tcp reset\n  }}\n}}\n",
            t = self.name
        )
    }

    /// Installs the queue and reject rules. On failure nothing is left.
    pub fn install(&self) -> Result<StrictRules, SysError> {
        let installed = StrictRules {
            name: self.name.clone(),
            tools: self.tools(),
        };
        // Leftovers of a crashed run would duplicate rules.
        installed.remove();
        nft_script(&self.reject_ruleset())?;
        for tool in &installed.tools {
            run(Command::new(tool).args(["-t", "raw", "-N", &self.name]))?;
            for rule in self.queue_rules() {
                run(Command::new(tool).args(&rule))?;
            }
            run(Command::new(tool).args(["-t", "raw", "-I", "PREROUTING", "-j", &self.name]))?;
        }
        Ok(installed)
    }
}

impl StrictRules {
    /// Removes everything this relay's strict mode installed, reporting
    /// what could not be removed (an absent rule is not an error).
    fn remove(&self) -> Vec<SysError> {
        let mut failed = Vec::new();
        for tool in &self.tools {
            let exists = run(Command::new(tool).args(["-t", "raw", "-S", &self.name])).is_ok();
            if !exists {
                continue;
            }
            // The jump may be there more than once after a crash loop.
            while run(Command::new(tool).args(["-t", "raw", "-C", "PREROUTING", "-j", &self.name]))
                .is_ok()
            {
                if let Err(e) = run(Command::new(tool).args([
                    "-t",
                    "raw",
                    "-D",
                    "PREROUTING",
                    "-j",
                    &self.name,
                ])) {
                    failed.push(e);
                    break;
                }
            }
            for op in ["-F", "-X"] {
                if let Err(e) = run(Command::new(tool).args(["-t", "raw", op, &self.name])) {
                    failed.push(e);
                }
            }
        }
        let listed = run(Command::new("nft").args(["list", "table", "inet", &self.name]));
        if listed.is_ok()
            && let Err(e) = run(Command::new("nft").args(["delete", "table", "inet", &self.name]))
        {
            failed.push(e);
        }
        failed
    }
}

impl Drop for StrictRules {
    fn drop(&mut self) {
        for e in self.remove() {
            tracing::warn!(name = %self.name, error = %e, "failed to remove strict-mode rule");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_keeps_only_the_established_socket_rule() {
        let interception = Interception {
            table: "splitway_rc_0".into(),
            families: vec!["ip"],
        };
        let script = interception.established_only_ruleset();
        assert_eq!(
            script,
            "flush chain inet splitway_rc_0 prerouting\n\
             add rule inet splitway_rc_0 prerouting meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn socket transparent 1 meta mark set 0x5357 accept\n"
        );
        assert!(!script.contains("tproxy"));
        // Dropping this test value would run nft: forget it instead.
        std::mem::forget(interception);
    }

    #[test]
    fn ruleset_for_dual_stack_listener_has_both_families() {
        let spec = InterceptSpec {
            table: "splitway_rc".into(),
            interfaces: vec!["eth0".into(), "eth1".into()],
            ports: vec![80, 443],
            listener: "[::]:7000".parse().unwrap(),
            v6_only: false,
        };
        let r = spec.ruleset();
        assert!(r.contains("tproxy ip to :7000"), "{r}");
        assert!(r.contains("tproxy ip6 to :7000"), "{r}");
        assert!(r.contains("iifname { \"eth0\", \"eth1\" }"), "{r}");
        assert!(r.contains("th dport { 80, 443 }"), "{r}");
    }

    #[test]
    fn strict_rules_queue_syns_with_bypass() {
        let spec = StrictSpec {
            name: "swstrict_0_abcd".into(),
            interfaces: vec!["eth0".into()],
            ports: vec![80, 443],
            queue: 7,
            v4: true,
            v6: false,
        };
        let rules = spec.queue_rules();
        assert_eq!(rules.len(), 1);
        let r = rules[0].join(" ");
        assert_eq!(
            r,
            "-t raw -A swstrict_0_abcd -i eth0 -p tcp --syn -m multiport --dports 80,443 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
        assert!(
            spec.reject_ruleset()
                .contains("meta mark 0x5358 reject with tcp reset")
        );
        assert_eq!(spec.tools(), vec!["iptables"]);
    }

    #[test]
    fn ruleset_for_ipv4_listener_has_only_ipv4() {
        let spec = InterceptSpec {
            table: "t".into(),
            interfaces: vec!["eth0".into()],
            ports: vec![80],
            listener: "0.0.0.0:7000".parse().unwrap(),
            v6_only: false,
        };
        let r = spec.ruleset();
        assert!(r.contains("tproxy ip to :7000"));
        assert!(!r.contains("tproxy ip6"));
    }
}
