//! `splitway-lab`: the lab as a binary of its own (issue #31), the same
//! command as `splitway lab`. It runs relays and agents with the
//! `splitway` binary beside it (or `SPLITWAY_BIN`).

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(name = "splitway-lab", version)]
struct Cli {
    #[command(flatten)]
    lab: splitway_lab::cli::LabArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match splitway_lab::cli::run(cli.lab) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            eprintln!("splitway-lab: {text}");
            ExitCode::FAILURE
        }
    }
}
