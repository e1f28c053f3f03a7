//! `splitway relay`: load, validate, run until a signal, drain.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use splitway_relay::{Config, Relay};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

pub fn run(path: &Path, check: bool, drain: Duration) -> anyhow::Result<ExitCode> {
    let cfg = match Config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprint!("{errors}");
            return Ok(ExitCode::FAILURE);
        }
    };
    for w in cfg.warnings() {
        warn!("{w}");
        if check {
            eprintln!("warning: {w}");
        }
    }
    if check {
        println!(
            "{}: valid ({} listeners, {} peers, {} routes)",
            path.display(),
            cfg.listeners.len(),
            cfg.peers.len(),
            cfg.routes.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Worker threads are created once, here; connections are tasks.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("splitway-worker")
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let relay = Relay::bind(cfg).await?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM"),
                _ = int.recv() => info!("SIGINT"),
            }
        };
        relay.run(shutdown, drain).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
