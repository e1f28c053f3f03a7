//! `splitway-relay`: a splitway relay, its key generator and its admin
//! client, and nothing else (no lab, bypass or agent code): what the
//! systemd unit and the container image run.

use std::process::ExitCode;

use clap::Parser;
use splitway_relay_cli::{LogFormat, RelayCommand, cli};

#[derive(Parser)]
#[command(
    name = "splitway-relay",
    // `splitway relay --version` too.
    propagate_version = true,
    version = cli::VERSION.as_str(),
    long_version = cli::LONG_VERSION.as_str(),
    about = "A splitway relay: split-TCP for long-haul networks (relay, keygen, ctl)"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: RelayCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.command.run(cli.log_format)
}
