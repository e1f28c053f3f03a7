//! `splitway-tools bypass` (and `splitway bypass`): co-located TCP bypass (sock_ops + sockhash + sk_msg
//! redirect), in the manner of tcp_splice's tcp-splice-ctl. See docs/bypass.md.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use splitway_sys::bpf::bypass::{self, DisableOutcome, EnableOutcome, Policy};

#[derive(Args, Debug)]
#[command(
    about = "Co-located TCP bypass: pair same-host sockets in the kernel (BPF sk_msg redirect)",
    long_about = "Co-located TCP bypass: a cgroup sock_ops program pairs the two ends of \
same-host TCP connections (loopback, or namespaces over veth) and an sk_msg program moves \
each send straight into the peer's receive queue. Both ends must be in the cgroup.\n\n\
The links and maps are pinned under /sys/fs/bpf/splitway/bypass/, so they outlive the \
command. All three commands are idempotent. disable never drops a byte: sockets already \
paired keep their path until they close (status lists them as draining).\n\n\
A send is redirected only when the peer's application has read everything sent before it; \
otherwise it goes over TCP (in order, with TCP's backpressure), and a connection that streams \
leaves the sockhash for plain TCP.\n\n\
Limits measured on this kernel are in docs/bypass.md: do not pair traffic whose reader \
relies on FIONREAD, reads with blocking calls while another thread writes, or reads with \
recv and then splice(2) (HAProxy; a splitway relay notices and stops splicing); use --ports \
to pair only the services known to be safe."
)]
pub struct BypassArgs {
    #[command(subcommand)]
    command: BypassCommand,
}

#[derive(Subcommand, Debug)]
enum BypassCommand {
    /// Attach to a cgroup v2 directory (or update the policy in place).
    Enable {
        /// cgroup v2 directory; both ends of a connection must be under it.
        #[arg(long)]
        cgroup: PathBuf,
        /// Pair only connections whose both addresses are loopback.
        #[arg(long)]
        loopback_only: bool,
        /// Pair only connections with either port in this list.
        #[arg(long, value_delimiter = ',', required_unless_present = "any_port")]
        ports: Vec<u16>,
        /// Pair every port. Not the default: on this kernel a paired socket
        /// misreports FIONREAD and breaks blocking readers with a writer
        /// thread and recv-then-splice readers (docs/bypass.md), so pairing
        /// is opt-in per service.
        #[arg(long, conflicts_with = "ports")]
        any_port: bool,
    },
    /// Policy, paired sockets, bytes redirected, fallbacks.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Detach and remove the pins (paired sockets drain first).
    Disable,
}

pub fn run(args: BypassArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BypassCommand::Enable {
            cgroup,
            loopback_only,
            ports,
            any_port: _,
        } => {
            let mut ports = ports;
            ports.sort_unstable();
            ports.dedup();
            let policy = Policy {
                loopback_only,
                ports,
            };
            let outcome = bypass::enable(&cgroup, &policy)
                .with_context(|| format!("bypass enable on {}", cgroup.display()))?;
            let what = match outcome {
                EnableOutcome::Enabled => "enabled",
                EnableOutcome::AlreadyEnabled => "already enabled",
                EnableOutcome::PolicyUpdated => "policy updated",
            };
            println!(
                "bypass: {what} on {} ({})",
                cgroup.display(),
                describe(&policy)
            );
            Ok(ExitCode::SUCCESS)
        }
        BypassCommand::Status { json } => {
            let st = bypass::status().context("bypass status")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
                return Ok(ExitCode::SUCCESS);
            }
            if st.enabled {
                println!(
                    "bypass: enabled on {} ({})",
                    st.cgroup.as_deref().unwrap_or("(unknown cgroup)"),
                    st.policy.as_ref().map(describe).unwrap_or_default()
                );
            } else {
                println!("bypass: disabled");
            }
            let c = &st.counters;
            println!("paired sockets:        {}", st.paired_sockets);
            println!("sockets paired (total): {}", c.sockets_paired);
            println!(
                "redirected:            {} bytes in {} sends",
                c.bytes_redirected, c.messages_redirected
            );
            println!(
                "over TCP:              {} bytes in {} sends (the reader had not read all before \
                 them), {} sends with no paired peer",
                c.bytes_tcp, c.messages_tcp, c.sends_without_peer
            );
            println!("reads counted:         {}", c.reads_counted);
            println!(
                "streams unpaired:      {} (back to plain TCP after 1 MiB over TCP)",
                c.unpaired_streams
            );
            println!(
                "not paired:            {} excluded by policy, {} early data, {} insert failures; \
                 {} sends to a closed peer",
                c.excluded_by_policy, c.excluded_early_data, c.insert_failed, c.redirect_misses
            );
            for d in &st.draining {
                println!(
                    "draining: {} paired sockets in {} (kept until they close)",
                    d.paired_sockets,
                    d.pin.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        BypassCommand::Disable => {
            match bypass::disable().context("bypass disable")? {
                DisableOutcome::NotEnabled => println!("bypass: not enabled"),
                DisableOutcome::Disabled => println!("bypass: disabled"),
                DisableOutcome::Draining(list) => {
                    let n: usize = list.iter().map(|d| d.paired_sockets).sum();
                    println!(
                        "bypass: disabled for new connections; {n} paired sockets keep their \
                         path until they close (run disable or status again to release them)"
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn describe(p: &Policy) -> String {
    let scope = if p.loopback_only {
        "loopback only"
    } else {
        "loopback and routable"
    };
    if p.ports.is_empty() {
        format!("{scope}, any port")
    } else {
        let ports: Vec<String> = p.ports.iter().map(u16::to_string).collect();
        format!("{scope}, ports {}", ports.join(","))
    }
}
