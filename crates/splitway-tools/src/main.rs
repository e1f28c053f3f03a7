//! `splitway-tools`: the host tools, `agent` and `bypass`, without the
//! relay or the lab (issue #31).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use splitway_tools::{agent, bypass};

#[derive(Parser)]
#[command(
    name = "splitway-tools",
    version,
    about = "splitway's host tools: the SYN-option agent and the co-located bypass"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Agent(agent::AgentArgs),
    Bypass(bypass::BypassArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Agent(args) => agent::run(args),
        Command::Bypass(args) => bypass::run(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("splitway-tools: {e:#}");
        ExitCode::FAILURE
    })
}
