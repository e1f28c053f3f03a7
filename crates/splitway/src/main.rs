//! `splitway`: a split-TCP relay for long-haul networks, every product
//! behind one command (a multi-call front). The relay's own commands come
//! from `splitway-relay-cli`, whose `splitway-relay` binary is what the
//! systemd unit and the container image run: it maps no lab, bypass or
//! agent code (issue #31).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use splitway_relay_cli::cli::{LONG_VERSION, RELAY_ABOUT, RELAY_LONG_ABOUT, VERSION};
use splitway_relay_cli::{LogFormat, RelayArgs, RelayCommand};

mod agent;
mod bypass;
mod docgen;

#[derive(Parser)]
#[command(
    name = "splitway",
    version = VERSION.as_str(),
    long_version = LONG_VERSION.as_str(),
    about = "Split-TCP relay for long-haul networks",
    long_about = "splitway cuts long-haul TCP connections into legs at relays placed near \
clients and near servers, so every leg runs its own short control loop. A relay captures \
connections transparently (TPROXY) or explicitly (SOCKS5, HTTP CONNECT), carries them over \
authenticated relay-to-relay legs according to its routing table, and forwards bytes with \
splice(2)."
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Relay(RelayCommand),
    #[command(flatten)]
    Tools(ToolCommand),
}

/// The lab and the host tools: what the relay binary leaves out.
#[derive(Subcommand)]
enum ToolCommand {
    /// Emulated WAN in network namespaces: every configuration measured against the model.
    Lab(Box<splitway_lab::cli::LabArgs>),
    Agent(agent::AgentArgs),
    Bypass(bypass::BypassArgs),
    /// Write the man pages and shell completions (`make deb` packages them).
    #[command(hide = true)]
    GenerateDocs(docgen::DocgenArgs),
}

/// `splitway relay …` parsed on its own: `Cli` builds every subcommand's
/// arguments before parsing (lab, ctl, bypass: about 200 KB of code, run
/// once, that an idle relay would keep mapped); this builds only the
/// relay's.
#[derive(Parser)]
#[command(
    name = "splitway relay",
    bin_name = "splitway relay",
    version = VERSION.as_str(),
    long_version = LONG_VERSION.as_str(),
    about = RELAY_ABOUT,
    long_about = RELAY_LONG_ABOUT
)]
struct RelayCli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(flatten)]
    relay: RelayArgs,
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == "relay") {
        let cli = RelayCli::parse_from(std::iter::once("splitway relay".into()).chain(args));
        return RelayCommand::Relay(cli.relay).run(cli.log_format);
    }
    let cli = Cli::parse();
    let log_format = cli.log_format;
    match cli.command {
        Command::Relay(command) => command.run(log_format),
        Command::Tools(command) => {
            let _log = splitway_relay_cli::cli::init_logging(log_format);
            let result = match command {
                ToolCommand::Agent(args) => agent::run(args),
                ToolCommand::Bypass(args) => bypass::run(args),
                ToolCommand::GenerateDocs(args) => docgen::run(&args).map(|()| ExitCode::SUCCESS),
                ToolCommand::Lab(args) => splitway_lab::cli::run(*args)
                    .map(|()| ExitCode::SUCCESS)
                    .map_err(anyhow::Error::from),
            };
            splitway_relay_cli::exit_code(result, false, matches!(log_format, LogFormat::Json))
        }
    }
}
