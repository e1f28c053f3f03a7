//! `splitway relay`: load, validate, run until a signal, drain; SIGHUP
//! reloads the config file.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use splitway_relay::control::LogControl;
use splitway_relay::relay::RelayOptions;
use splitway_relay::{Config, Relay};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

pub fn run(
    path: &Path,
    check: bool,
    drain: Duration,
    log: Arc<dyn LogControl>,
) -> anyhow::Result<ExitCode> {
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
        // Shipped BPF congestion controls: tried for real, named by key.
        let problems = splitway_relay::congestion::check(&cfg);
        for p in &problems {
            eprintln!("{}: {p}", path.display());
        }
        if !problems.is_empty() {
            return Ok(ExitCode::FAILURE);
        }
        println!(
            "{}: valid ({} listeners, {} peers, {} routes)",
            path.display(),
            cfg.listeners.len(),
            cfg.peers.len(),
            cfg.routes.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Taken before any thread exists; the fds are ours from here on.
    let inherited = splitway_sys::activation::take_listen_fds()
        .context("adopting the listening sockets passed by the service manager")?;
    // Reloads re-read the same file even if the working directory changes.
    let config_path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    // Worker threads are created once, here; connections are tasks.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("splitway-worker")
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let relay = Relay::bind_with(
            cfg,
            RelayOptions {
                config_path: Some(config_path),
                inherited,
                log: Some(log),
            },
        )
        .await?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        let reloader = relay.reloader();
        // The reload reads a small file: done off the async workers.
        let reloads = tokio::spawn(async move {
            while hup.recv().await.is_some() {
                info!("SIGHUP: reloading the config");
                let reloader = reloader.clone();
                // The reloader logs the outcome (changes or every error).
                let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
            }
        });
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM"),
                _ = int.recv() => info!("SIGINT"),
            }
        };
        let result = relay.run(shutdown, drain).await;
        reloads.abort();
        result?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
