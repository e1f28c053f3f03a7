//! `splitway`: a split-TCP relay for long-haul networks, every product
//! behind one command (a multi-call front). Each product is also a binary
//! of its own (issue #31): `splitway-relay` (relay, keygen, ctl; what the
//! systemd unit and the container image run, with no lab, bypass or agent
//! code), `splitway-lab`, and `splitway-tools` (agent, bypass).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use splitway_relay_cli::cli::{LONG_VERSION, VERSION};
use splitway_relay_cli::{LogFormat, RelayCommand};
use splitway_tools::cli::HostCommand;

mod docgen;

#[derive(Parser)]
#[command(
    name = "splitway",
    // `splitway relay --version` too.
    propagate_version = true,
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
    #[command(flatten)]
    Host(HostCommand),
    /// Write the man pages and shell completions (`make deb` packages them).
    #[command(hide = true)]
    GenerateDocs(docgen::DocgenArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    match cli.command {
        Command::Relay(command) => command.run(log_format),
        Command::Tools(command) => {
            let _log = splitway_relay_cli::cli::init_logging(log_format);
            let result = match command {
                ToolCommand::Host(command) => command.run(),
                ToolCommand::GenerateDocs(args) => docgen::run(&args).map(|()| ExitCode::SUCCESS),
                ToolCommand::Lab(args) => splitway_lab::cli::run(*args)
                    .map(|()| ExitCode::SUCCESS)
                    .map_err(anyhow::Error::from),
            };
            splitway_relay_cli::exit_code(result, false, matches!(log_format, LogFormat::Json))
        }
    }
}
