//! `splitway-tools`: the host tools, `agent` and `bypass`, without the
//! relay or the lab (issue #31).

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    splitway_tools::cli::run(splitway_tools::cli::Cli::parse())
}
