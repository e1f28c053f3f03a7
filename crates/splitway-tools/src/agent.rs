//! `splitway agent`: explicit capture on a client host. Redirects connect()s
//! to routed destinations to their relay and writes the original destination
//! into the SYN (a relay listener with `mode = "syn-option"` reads it).
//! The programs stay pinned (and attached) after the command exits.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use splitway_sys::bpf::agent_synopt::{self as agent, AgentRoute, DEFAULT_PIN_DIR, EnableOutcome};

#[derive(Args, Debug)]
#[command(
    about = "Client-host agent: redirect connect() to a relay, destination in the SYN",
    long_about = "Client-host agent: cgroup connect4/connect6 programs redirect an application's \
connect() to a destination inside one of --route's prefixes to that route's relay, and a \
sock_ops program writes the original destination into the SYN as a TCP option (kind 253, \
ExID 0x5357; docs/syn-option.md). Applications need no proxy settings. The relay listener \
must have mode = \"syn-option\".\n\n\
The programs are pinned under --pin-dir and stay attached after this command exits; \
`agent disable` detaches them. `agent enable` on an enabled agent replaces its routes."
)]
pub struct AgentArgs {
    /// bpffs directory holding the pinned programs and maps.
    #[arg(long, global = true, default_value = DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
    #[command(subcommand)]
    command: AgentCommand,
}

/// What the agent does after the relay refused a destination.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Fallback {
    /// Keep sending it to the relay.
    None,
    /// Connect directly for a minute.
    Direct,
}

#[derive(Subcommand, Debug)]
enum AgentCommand {
    /// Attach to a cgroup (v2) and pin; idempotent (replaces the routes).
    Enable {
        /// The cgroup v2 directory whose processes are redirected.
        #[arg(long)]
        cgroup: PathBuf,
        /// PREFIX=RELAY, e.g. 10.0.0.0/8=192.0.2.1:7000; IPv6 routes may add
        /// `#INDEX` (the relay's syn_option_prefixes index) for the compact
        /// option: `2001:db8::/48=[2001:db8::1]:7000#3`.
        #[arg(long = "route", required = true, value_parser = parse_route)]
        routes: Vec<AgentRoute>,
        /// Measure the SYN's free option space instead of writing the option
        /// (read it with `agent status`).
        #[arg(long)]
        probe: bool,
        /// Free option bytes in this host's SYNs. A route whose option
        /// (padded to 4 bytes) does not fit is not redirected: its connects
        /// go direct and count as fallback_direct. Default: computed from
        /// net.ipv4.tcp_timestamps, tcp_sack and tcp_window_scaling (20 with
        /// Linux's defaults); 40 never falls back.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=40))]
        option_space: Option<u32>,
        /// After a redirected connection is reset before it received a byte
        /// (the relay found no option: a middlebox stripped it or SYN cookies
        /// lost it; or it refused the destination), connect to that
        /// destination directly for a minute (counted as fallback_refused).
        /// Off: such connections keep going to the relay and fail.
        #[arg(long, value_enum, default_value_t = Fallback::None)]
        fallback: Fallback,
    },
    /// Routes and counters of the enabled agent (exit 3 when not enabled).
    Status,
    /// Detach and unpin (succeeds when already disabled).
    Disable,
}

/// `agent status` on a host without an enabled agent.
const EXIT_NOT_ENABLED: u8 = 3;

fn parse_route(s: &str) -> Result<AgentRoute, String> {
    let (prefix, relay) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected PREFIX=RELAY"))?;
    let (relay, index) = match relay.split_once('#') {
        Some((relay, index)) => (
            relay,
            Some(
                index
                    .parse::<u8>()
                    .ok()
                    .filter(|i| *i <= 127)
                    .ok_or_else(|| format!("`{index}`: prefix index is 0..=127"))?,
            ),
        ),
        None => (relay, None),
    };
    let (addr, len) = prefix
        .split_once('/')
        .ok_or_else(|| format!("`{prefix}`: expected ADDR/LEN"))?;
    let addr: IpAddr = addr
        .parse()
        .map_err(|e| format!("`{addr}`: not an IP address ({e})"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix_len = len
        .parse::<u8>()
        .ok()
        .filter(|l| *l <= max)
        .ok_or_else(|| format!("`{len}`: prefix length is 0..={max}"))?;
    let relay: SocketAddr = relay
        .parse()
        .map_err(|e| format!("`{relay}`: not a relay address HOST:PORT ({e})"))?;
    if relay.is_ipv4() != addr.is_ipv4() {
        return Err(format!(
            "`{s}`: the relay's address family differs from the prefix's"
        ));
    }
    if index.is_some() && addr.is_ipv4() {
        return Err(format!("`{s}`: only IPv6 routes take a prefix index"));
    }
    Ok(AgentRoute {
        prefix: addr,
        prefix_len,
        relay,
        v6_index: index,
    })
}

pub fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let pin_dir = &args.pin_dir;
    match args.command {
        AgentCommand::Enable {
            cgroup,
            routes,
            probe,
            option_space,
            fallback,
        } => {
            if !cgroup.join("cgroup.procs").exists() {
                bail!(
                    "{}: not a cgroup v2 directory (no cgroup.procs; cgroup2 is mounted where /proc/mounts says)",
                    cgroup.display()
                );
            }
            let option_space = match option_space {
                Some(n) => n,
                None => agent::syn_option_space()
                    .context("computing the SYN's free option space (or give --option-space)")?,
            };
            let outcome = agent::enable(
                pin_dir,
                &cgroup,
                &routes,
                probe,
                option_space,
                fallback == Fallback::Direct,
            )
            .with_context(|| format!("enabling the agent under {}", pin_dir.display()))?;
            match outcome {
                EnableOutcome::Attached => println!(
                    "agent enabled: {} route(s), cgroup {}, pinned in {}",
                    routes.len(),
                    cgroup.display(),
                    pin_dir.display()
                ),
                EnableOutcome::RoutesReplaced => println!(
                    "agent already enabled in {}: routes replaced ({} route(s))",
                    pin_dir.display(),
                    routes.len()
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        AgentCommand::Status => {
            let Some(status) = agent::status(pin_dir)
                .with_context(|| format!("reading the agent in {}", pin_dir.display()))?
            else {
                println!("agent not enabled ({})", pin_dir.display());
                return Ok(ExitCode::from(EXIT_NOT_ENABLED));
            };
            println!("agent enabled ({})", status.pin_dir.display());
            if status.probe {
                println!("mode: probe (measures option space, writes no option)");
            }
            for r in &status.routes {
                let index = r.v6_index.map(|i| format!(" #{i}")).unwrap_or_default();
                println!("route {}/{} -> {}{index}", r.prefix, r.prefix_len, r.relay);
            }
            let s = &status.stats;
            println!("redirected_v4 {}", s.redirected_v4);
            println!("redirected_v6 {}", s.redirected_v6);
            println!("options_written {}", s.options_written);
            println!("options_no_space {}", s.options_no_space);
            println!("options_store_failed {}", s.options_store_failed);
            println!("destinations_lost {}", s.lost);
            println!("probe_max_option_len {}", s.probe_max_len);
            println!("option_space {}", status.option_space);
            println!("fallback_direct {}", s.fallback_direct);
            println!(
                "fallback_after_refusal {}",
                if status.fallback_direct {
                    "direct"
                } else {
                    "none"
                }
            );
            println!("refusals_seen {}", s.refusals_seen);
            println!("fallback_refused {}", s.fallback_refused);
            Ok(ExitCode::SUCCESS)
        }
        AgentCommand::Disable => {
            if agent::disable(pin_dir)
                .with_context(|| format!("disabling the agent in {}", pin_dir.display()))?
            {
                println!("agent disabled ({})", pin_dir.display());
            } else {
                println!("agent was not enabled ({})", pin_dir.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
