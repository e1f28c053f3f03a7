//! What every splitway binary's command line shares: the version lines,
//! the log format and its live filter, `relay`'s arguments, how an error
//! and its causes are printed, and `keygen`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;

/// `splitway -V`: the version, commit and build date on one line.
pub static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use splitway_control::build;
    format!("{} ({} {})", build::VERSION, build::COMMIT, build::DATE)
});

/// `splitway --version`: the version line, then what this build holds.
pub static LONG_VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use splitway_control::build;
    let bpf = match splitway_sys::bpf::SKIPPED {
        Some(reason) => format!("none: {reason}"),
        None => splitway_sys::bpf::PROGRAMS.replace(',', ", "),
    };
    format!(
        "{}\ncommit: {}\nbuilt: {}\nBPF programs: {bpf}",
        build::VERSION,
        build::COMMIT,
        build::DATE,
    )
});

/// Log format on stderr.
#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub const RELAY_LONG_ABOUT: &str = "Run a relay from a TOML config file.\n\n\
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
pub struct RelayArgs {
    /// The relay's config file (TOML).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Validate the config and exit.
    #[arg(long)]
    pub check: bool,
    /// How long open connections may finish after a shutdown signal.
    #[arg(long, default_value = "30s", value_parser = splitway_control::params::duration_arg)]
    pub drain_timeout: Duration,
}

/// The log filter, changeable while the relay runs (`log.level`).
pub struct LogFilter {
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

pub fn init_logging(format: LogFormat) -> Arc<LogFilter> {
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

/// An error and its causes, each said once: many errors write their
/// source into their own message and also return it as `source()`, so
/// `{:#}` would say it twice (`cannot listen on …: Address in use (os
/// error 98): Address in use (os error 98)`).
pub fn causes(e: &anyhow::Error) -> String {
    let messages: Vec<String> = e.chain().map(ToString::to_string).collect();
    let mut said: Vec<&str> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let mut own = message.as_str();
        // What the next cause will say, dropped from this one's end.
        if let Some(next) = messages.get(i + 1)
            && let Some(head) = own.strip_suffix(next.as_str())
        {
            own = head.trim_end().trim_end_matches(':').trim_end();
        }
        if own.is_empty() || said.iter().any(|s| s.ends_with(own)) {
            continue;
        }
        said.push(own);
    }
    said.join(": ")
}

/// `keygen`: a new random pre-shared key, in hex, on stdout.
pub fn keygen() -> anyhow::Result<ExitCode> {
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
        .context("reading /dev/urandom")?;
    let psk = splitway_proto::auth::Psk::from_bytes(&key).context("building key")?;
    println!("{}", psk.to_hex());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::causes;

    /// As the relay's errors are: the source in the message and as source().
    #[derive(Debug)]
    struct Listen {
        source: std::io::Error,
    }

    impl std::fmt::Display for Listen {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot listen on 127.0.0.1:9090 (peer): {}", self.source)
        }
    }

    impl std::error::Error for Listen {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(98);
        let e = anyhow::Error::new(Listen { source: io }).context("starting the relay");
        assert_eq!(
            causes(&e),
            "starting the relay: cannot listen on 127.0.0.1:9090 (peer): Address already in use (os error 98)"
        );
        // A context that repeats its cause's message adds nothing.
        let e = anyhow::anyhow!("admin API: cannot listen on 127.0.0.1:9090")
            .context("admin API: cannot listen on 127.0.0.1:9090");
        assert_eq!(causes(&e), "admin API: cannot listen on 127.0.0.1:9090");
        // Causes that do not repeat each other are all kept.
        let e = anyhow::anyhow!("no such file").context("reading psk.key");
        assert_eq!(causes(&e), "reading psk.key: no such file");
    }

    /// The text of every `trace!`..`error!` call in `text`, to its closing
    /// parenthesis (strings and nesting respected).
    fn log_calls(text: &str) -> Vec<(usize, String)> {
        let mut calls = Vec::new();
        for level in ["trace!(", "debug!(", "info!(", "warn!(", "error!("] {
            for (start, _) in text.match_indices(level) {
                let before = text[..start].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
                let mut end = text.len();
                for (i, c) in text[start..].char_indices() {
                    match (in_string, c) {
                        (true, _) if escaped => escaped = false,
                        (true, '\\') => escaped = true,
                        (_, '"') => in_string = !in_string,
                        (false, '(') => depth += 1,
                        (false, ')') => {
                            depth -= 1;
                            if depth == 0 {
                                end = start + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let line = text[..start].matches('\n').count() + 1;
                calls.push((line, text[start..end].to_owned()));
            }
        }
        calls
    }

    /// Whether a log call formats something with Debug.
    fn uses_debug(call: &str) -> bool {
        call.contains(":?}")
            || call.contains(":#?}")
            || call.split([' ', '(', ',', '\n']).any(|w| {
                w.strip_prefix('?')
                    .is_some_and(|r| r.starts_with(|c: char| c.is_alphabetic() || c == '_'))
            })
    }

    /// Logs show values as an operator reads them: no `Some(…)`, no struct
    /// dumps, so no Debug formatting (`{:?}`, `{x:?}`, `?field`) in the log
    /// calls of the crates a relay runs.
    #[test]
    fn no_debug_formatting_in_relay_logs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut found = Vec::new();
        for krate in [
            "splitway",
            "splitway-relay-cli",
            "splitway-relay",
            "splitway-control",
            "splitway-sys",
        ] {
            let mut dirs = vec![root.join(krate).join("src")];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir).expect("read src dir") {
                    let path = entry.expect("dir entry").path();
                    if path.is_dir() {
                        dirs.push(path);
                        continue;
                    }
                    if path.extension().is_none_or(|e| e != "rs") {
                        continue;
                    }
                    let text = std::fs::read_to_string(&path).expect("read source");
                    // Unit tests (this one among them) are not what a relay runs.
                    let text = text
                        .split("#[cfg(test)]\nmod tests")
                        .next()
                        .unwrap_or_default();
                    for (line, call) in log_calls(text) {
                        let debug = uses_debug(&call);
                        if debug {
                            found.push(format!("{}:{line}: {call}", path.display()));
                        }
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "Debug formatting in logs:\n{}",
            found.join("\n")
        );
        // The scan finds what it looks for.
        let calls = log_calls("x; warn!(?state, \"a)\"); info!(\"{x:?}\"); info!(%y, \"z?\");");
        let flagged: Vec<bool> = calls.iter().map(|(_, c)| uses_debug(c)).collect();
        // In level order: the two info! calls, then the warn!.
        assert_eq!(flagged, [true, false, true]);
    }
}
