//! `splitway`: a split-TCP relay for long-haul networks.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

mod ctl;
mod relay_cmd;

#[derive(Parser)]
#[command(
    name = "splitway",
    version,
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

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a relay (or validate its config with --check).
    #[command(long_about = "Run a relay from a TOML config file.\n\n\
With --check, validate the file and print every error (each naming its key), then exit: \
0 if valid, 1 if not. SIGINT/SIGTERM stop accepting and let open connections finish for \
up to --drain-timeout. Log verbosity follows RUST_LOG (default: info).")]
    Relay {
        /// The relay's config file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// Validate the config and exit.
        #[arg(long)]
        check: bool,
        /// How long open connections may finish after a shutdown signal.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        drain_timeout: Duration,
    },
    /// Print a new random pre-shared key (hex) for relay-to-relay authentication.
    Keygen,
    /// Emulated WAN in network namespaces: every configuration measured against the model.
    Lab(Box<splitway_lab::cli::LabArgs>),
    Ctl(ctl::CtlArgs),
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    splitway_relay::config::parse_duration(s).ok_or_else(|| format!("`{s}` is not a duration"))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Relay {
            config,
            check,
            drain_timeout,
        } => relay_cmd::run(&config, check, drain_timeout),
        Command::Keygen => keygen(),
        Command::Ctl(args) => ctl::run(args),
        Command::Lab(args) => splitway_lab::cli::run(*args)
            .map(|()| ExitCode::SUCCESS)
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("splitway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn keygen() -> anyhow::Result<ExitCode> {
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
        .context("reading /dev/urandom")?;
    let psk = splitway_proto::auth::Psk::from_bytes(&key).context("building key")?;
    println!("{}", psk.to_hex());
    Ok(ExitCode::SUCCESS)
}
