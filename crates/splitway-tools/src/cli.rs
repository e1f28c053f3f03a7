//! The `splitway-tools` command line: its binary parses it, and
//! `splitway generate-docs` renders its man page from it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{agent, bypass};

#[derive(Parser)]
#[command(
    name = "splitway-tools",
    version,
    about = "splitway's host tools: the SYN-option agent and the co-located bypass"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Agent(agent::AgentArgs),
    Bypass(bypass::BypassArgs),
}

/// Runs the parsed command; errors go to stderr with the binary's name.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Agent(args) => agent::run(args),
        Command::Bypass(args) => bypass::run(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("splitway-tools: {e:#}");
        ExitCode::FAILURE
    })
}
