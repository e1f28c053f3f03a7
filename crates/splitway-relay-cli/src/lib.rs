//! splitway-relay-cli: the `splitway-relay` binary's command line (issue
//! #31, one binary per product): run a relay, `keygen`, `ctl`. Its
//! dependency tree holds no lab, bypass or agent code, so an idle relay
//! maps none of it: the systemd unit and the container image run it. The
//! multi-call `splitway` front flattens [`RelayCommand`] into its own
//! commands (`splitway relay` runs the same code in its own process).
//!
//! - [`cli`]: what every binary's command line shares (version lines, log
//!   format and live filter, `relay`'s arguments, error printing, `keygen`)
//! - [`relay_cmd`]: `relay`: start, signals, reload, drain
//! - [`ctl`]: `ctl`: the admin API's client

use std::process::ExitCode;

pub mod cli;
pub mod ctl;
pub mod relay_cmd;

pub use cli::{LogFormat, RelayArgs};

/// What `splitway-relay` runs.
#[derive(clap::Subcommand)]
pub enum RelayCommand {
    /// Run a relay (or validate its config with --check).
    #[command(long_about = cli::RELAY_LONG_ABOUT)]
    Relay(RelayArgs),
    /// Print a new random pre-shared key (hex) for relay-to-relay authentication.
    Keygen,
    Ctl(ctl::CtlArgs),
}

impl RelayCommand {
    /// A relay that runs (not `--check`): it logs why it stopped, errors
    /// included, as its last line.
    pub fn runs_a_relay(&self) -> bool {
        matches!(self, RelayCommand::Relay(a) if !a.check)
    }

    /// Commands that only print: they end quietly when their reader goes
    /// away (`splitway relay --check | head -1`).
    pub fn prints_only(&self) -> bool {
        !self.runs_a_relay()
    }

    /// Runs the command with its logs set up in `log_format`.
    pub fn run(self, log_format: LogFormat) -> ExitCode {
        let log = cli::init_logging(log_format);
        let json = matches!(log_format, LogFormat::Json);
        let running_relay = self.runs_a_relay();
        if self.prints_only()
            && let Err(e) = splitway_sys::rt::default_sigpipe()
        {
            tracing::warn!(error = %e, "a closed stdout will end this command with an error");
        }
        let result = match self {
            RelayCommand::Relay(RelayArgs {
                config,
                check,
                drain_timeout,
            }) => relay_cmd::run(&config, check, drain_timeout, log, json),
            RelayCommand::Keygen => cli::keygen(),
            RelayCommand::Ctl(args) => ctl::run(args, json),
        };
        exit_code(result, running_relay, json)
    }
}

/// The process's exit code for `result`, its error printed: logged as the
/// last line of a `running_relay`, as a JSON log line under `--log-format
/// json`, else on stderr.
pub fn exit_code(result: anyhow::Result<ExitCode>, running_relay: bool, json: bool) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            let causes = cli::causes(&e);
            if running_relay {
                tracing::error!("relay stopped: {causes}");
            } else if json {
                tracing::error!(error = %causes, "splitway failed");
            } else {
                eprintln!("splitway: {causes}");
            }
            ExitCode::FAILURE
        }
    }
}
