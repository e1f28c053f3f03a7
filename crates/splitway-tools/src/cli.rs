//! The `splitway-tools` command line: its binary parses it, the `splitway`
//! front mounts its commands, and `splitway generate-docs` renders its man
//! page from it.

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
    command: HostCommand,
}

/// The host tools' commands, here and flattened into the `splitway` front.
#[derive(Subcommand)]
pub enum HostCommand {
    Agent(agent::AgentArgs),
    Bypass(bypass::BypassArgs),
}

impl HostCommand {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            HostCommand::Agent(args) => agent::run(args),
            HostCommand::Bypass(args) => bypass::run(args),
        }
    }
}

/// Runs the parsed command; errors go to stderr with the binary's name.
pub fn run(cli: Cli) -> ExitCode {
    cli.command.run().unwrap_or_else(|e| {
        eprintln!("splitway-tools: {e:#}");
        ExitCode::FAILURE
    })
}
