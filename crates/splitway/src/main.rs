//! `splitway`: a split-TCP relay for long-haul networks.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

mod agent;
mod bypass;
mod ctl;
mod docgen;
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
    #[command(long_about = RELAY_LONG_ABOUT)]
    Relay(RelayArgs),
    /// Print a new random pre-shared key (hex) for relay-to-relay authentication.
    Keygen,
    /// Emulated WAN in network namespaces: every configuration measured against the model.
    Lab(Box<splitway_lab::cli::LabArgs>),
    Ctl(ctl::CtlArgs),
    Agent(agent::AgentArgs),
    Bypass(bypass::BypassArgs),
    /// Write the man pages and shell completions (`make deb` packages them).
    #[command(hide = true)]
    GenerateDocs(docgen::DocgenArgs),
}

const RELAY_ABOUT: &str = "Run a relay (or validate its config with --check).";
const RELAY_LONG_ABOUT: &str = "Run a relay from a TOML config file.\n\n\
With --check, validate the file and print every error (each naming its key), then exit: \
0 if valid, 78 (EX_CONFIG) if not; `splitway relay` itself also exits 78 on an invalid \
config, so a service manager can stop retrying (RestartPreventExitStatus=78). SIGINT/SIGTERM stop accepting and let open connections finish for \
up to --drain-timeout. SIGHUP re-reads the config file and applies what can change without \
a restart (routes, peers, pools, keys, limits, timeouts, tuning, client ACLs); an invalid \
file changes nothing and its errors are logged (`splitway ctl reload` does the same and \
prints the outcome). Listening sockets passed by systemd socket activation (LISTEN_FDS) are \
used for the [[listen]] entries with their addresses. Log verbosity follows RUST_LOG \
(default: info) and can be changed live: `splitway ctl set log.level debug`.";

/// `splitway relay`'s arguments.
#[derive(clap::Args)]
struct RelayArgs {
    /// The relay's config file (TOML).
    #[arg(long, short)]
    config: PathBuf,
    /// Validate the config and exit.
    #[arg(long)]
    check: bool,
    /// How long open connections may finish after a shutdown signal.
    #[arg(long, default_value = "30s", value_parser = splitway_control::params::duration_arg)]
    drain_timeout: Duration,
}

/// `splitway relay …` parsed on its own: what a service manager runs at
/// every start. `Cli` builds every subcommand's arguments before parsing
/// (lab, ctl, bypass: about 200 KB of code, run once, that an idle relay
/// would keep mapped); this builds only the relay's.
#[derive(Parser)]
#[command(
    name = "splitway relay",
    bin_name = "splitway relay",
    version,
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

/// The log filter, changeable while the relay runs (`log.level`).
struct LogFilter {
    handle: tracing_subscriber::reload::Handle<
        tracing_subscriber::EnvFilter,
        tracing_subscriber::Registry,
    >,
    current: std::sync::Mutex<String>,
}

impl splitway_relay::admin::LogControl for LogFilter {
    fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn check(&self, filter: &str) -> Result<(), String> {
        tracing_subscriber::EnvFilter::try_new(filter)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn set(&self, filter: &str) -> Result<(), String> {
        let parsed = tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| e.to_string())?;
        self.handle.reload(parsed).map_err(|e| e.to_string())?;
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = filter.to_owned();
        Ok(())
    }
}

fn init_logging(format: LogFormat) -> Arc<LogFilter> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let from_env = std::env::var(tracing_subscriber::EnvFilter::DEFAULT_ENV)
        .ok()
        .and_then(|text| {
            tracing_subscriber::EnvFilter::try_new(&text)
                .ok()
                .map(|f| (f, text))
        });
    let (filter, text) =
        from_env.unwrap_or_else(|| (tracing_subscriber::EnvFilter::new("info"), "info".into()));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (text_layer, json_layer) = match format {
        LogFormat::Text => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(ansi),
            ),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            ),
        ),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(text_layer)
        .with(json_layer)
        .init();
    Arc::new(LogFilter {
        handle,
        current: std::sync::Mutex::new(text),
    })
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let relay_only = args.nth(1).is_some_and(|a| a == "relay");
    let (log_format, command) = if relay_only {
        let cli = RelayCli::parse_from(std::iter::once("splitway relay".into()).chain(args));
        (cli.log_format, Command::Relay(cli.relay))
    } else {
        let cli = Cli::parse();
        (cli.log_format, cli.command)
    };
    let log = init_logging(log_format);
    let result = match command {
        Command::Relay(RelayArgs {
            config,
            check,
            drain_timeout,
        }) => relay_cmd::run(&config, check, drain_timeout, log),
        Command::Keygen => keygen(),
        Command::Ctl(args) => ctl::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Bypass(args) => bypass::run(args),
        Command::GenerateDocs(args) => docgen::run(&args).map(|()| ExitCode::SUCCESS),
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
