//! `splitway relay`: load, validate, run until a signal, drain; SIGHUP
//! reloads the config file.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use splitway_relay::admin::LogControl;
use splitway_relay::error::RelayError;
use splitway_relay::relay::RelayOptions;
use splitway_relay::{Config, Relay};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

/// sysexits.h `EX_CONFIG`: the config is wrong (systemd's
/// `RestartPreventExitStatus=78` then stops retrying a broken file).
pub const EX_CONFIG: u8 = 78;

pub fn run(
    path: &Path,
    check: bool,
    drain: Duration,
    log: Arc<dyn LogControl>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let cfg = match Config::load(path) {
        Ok(c) => c,
        // `--check` answers a person; a start logs, as JSON if asked.
        Err(errors) if check || !json => {
            eprint!("{errors}");
            if !check {
                error!("relay stopped: the config is invalid");
            }
            return Ok(ExitCode::from(EX_CONFIG));
        }
        Err(errors) => {
            for i in &errors.issues {
                error!(
                    file = %errors.path,
                    line = i.at.map(|a| a.line),
                    column = i.at.map(|a| a.column),
                    key = %i.key,
                    "{}",
                    i.message
                );
            }
            error!("relay stopped: the config is invalid");
            return Ok(ExitCode::from(EX_CONFIG));
        }
    };
    for w in cfg.warnings() {
        warn!("{w}");
        if check {
            eprintln!("warning: {w}");
        }
    }
    // `source = "client"` routes: refuse what cannot work, show the policy
    // routing replies need (the relay does not install host-wide rules).
    let client_sourced: Vec<_> = cfg
        .routes
        .iter()
        .filter(|r| r.reveal.client_source)
        .collect();
    if !client_sourced.is_empty() {
        let mut failed = false;
        for r in &client_sourced {
            if let Err(e) = splitway_relay::transparent::probe(r.dst.addr().is_ipv6()) {
                eprintln!("route {}: source = \"client\": {e}", r.dst);
                failed = true;
            }
        }
        if failed {
            return Ok(ExitCode::FAILURE);
        }
        let rules = splitway_relay::transparent::policy_routing();
        let missing: Vec<_> = client_sourced
            .iter()
            .map(|r| r.dst.addr().is_ipv6())
            .filter(|&v6| !splitway_relay::transparent::policy_rule_installed(v6))
            .map(|v6| if v6 { "IPv6" } else { "IPv4" })
            .collect();
        if check {
            println!("{rules}");
        } else {
            info!(
                "routes with source = \"client\" need this policy routing on this host:\n{rules}"
            );
        }
        // Not fatal: the operator may install it after the relay starts.
        for family in missing {
            warn!(
                "source = \"client\": the {family} policy rule is not installed yet; replies to client-sourced legs will not reach this relay"
            );
            if check {
                eprintln!(
                    "warning: source = \"client\": the {family} policy rule is not installed yet; replies to client-sourced legs will not reach this relay"
                );
            }
        }
    }
    if check {
        // Shipped BPF congestion controls: tried for real, named by key.
        // A named algorithm this host cannot run is the file's to change.
        let problems = splitway_relay::congestion::check(&cfg.congestion_keys());
        for p in &problems {
            eprintln!("{}: {p}", path.display());
        }
        // What the file asks of this host: interfaces, free ports, the
        // programs interception runs.
        let host = splitway_relay::preflight::check(&cfg, &[]);
        for issue in &host {
            eprintln!("{}: {issue}", path.display());
        }
        if !problems.is_empty() || host.iter().any(|i| !i.warning) {
            return Ok(ExitCode::from(EX_CONFIG));
        }
        println!(
            "{}: valid ({} listeners, {} peers, {} routes)",
            path.display(),
            cfg.listeners.len(),
            cfg.peers.len(),
            cfg.routes.len()
        );
        println!(
            "workers: {}",
            match cfg.workers {
                Some(n) => format!("{n} (set in the file)"),
                None => format!(
                    "{} (one per CPU)",
                    std::thread::available_parallelism().map_or(1, |n| n.get())
                ),
            }
        );
        // The destinations refused whatever allow_destinations says, with
        // this host's addresses as the relay reads them at start.
        let host = splitway_relay::policy::HostAddrs::read();
        println!("refused destinations (policy):");
        for line in cfg.policy.default_denials(&host.snapshot()) {
            println!("  {line}");
        }
        println!(
            "  SOCKS5/CONNECT clients that are relays ([[peer]] addresses, authenticated upstreams): {}",
            if cfg.policy.allow_relay_clients {
                "allowed by policy.allow_relay_clients = true"
            } else {
                "refused (policy.allow_relay_clients = true allows)"
            }
        );
        // What each acceleration will do here: the detector is loaded (and
        // on TCX kernels attached to lo and detached) to find out.
        let mut host = splitway_relay::accel::HostFacts::read();
        if cfg.accel.early_syn && !cfg.accel.strict {
            host.early_syn = Some(
                splitway_sys::bpf::SynWatch::probe()
                    .map(|()| "the BPF SYN detector loads and attaches on this host".to_owned())
                    .map_err(|e| {
                        format!(
                            "BPF attach failed: {}",
                            splitway_relay::accel::bpf_hint(&e.to_string())
                        )
                    }),
            );
        }
        if cfg.accel.zero_rtt
            && let Some(shares_port) = splitway_relay::zero_rtt::hello_listeners(&cfg)
        {
            host.hello_register = Some(splitway_relay::zero_rtt::HelloRegister::probe(shares_port));
        }
        if cfg.accel.learned_window {
            host.learned_window = Some(splitway_relay::learned_window::learn_windows(
                &mut cfg.clone(),
                splitway_relay::congestion::probe,
            ));
        }
        print!(
            "{}",
            splitway_relay::accel::describe(&splitway_relay::accel::plan(&cfg, &host))
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Taken before any thread exists; the fds are ours from here on.
    let inherited = splitway_sys::activation::take_listen_fds()
        .context("adopting the listening sockets passed by the service manager")?;
    // Reloads re-read the same file even if the working directory changes.
    let config_path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    // Before the first thread: every thread's heap in one arena, which the
    // trim before READY=1 reaches, so the start-up threads' BTF parses leave
    // nothing behind (docs/efficiency.md, "One heap arena").
    if !splitway_sys::mem::one_heap_arena() {
        warn!("mallopt(M_ARENA_MAX) refused: threads keep heap arenas of their own");
    }
    // Worker threads are created once, here; connections are tasks.
    let rt = runtime(cfg.workers)?;
    rt.block_on(async move {
        let relay = match Relay::bind_with(
            cfg,
            RelayOptions {
                config_path: Some(config_path),
                inherited,
                log: Some(log),
                // `systemctl status` shows it; the footprint check times it
                // (exec -> listening, docs/efficiency.md).
                on_listening: Some(Box::new(|| {
                    notify_service_manager("STATUS=listening; loading the accelerations")
                })),
            },
        )
        .await
        {
            Ok(relay) => relay,
            // As --check reports it: the config names what cannot run here.
            Err(e @ (RelayError::Congestion(_) | RelayError::Host(_))) => {
                error!("relay stopped: {}: {e}", path.display());
                return Ok(ExitCode::from(EX_CONFIG));
            }
            Err(e) => return Err(e.into()),
        };
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        let reloader = relay.reloader();
        // The reload reads a small file: done off the async workers.
        let reloads = tokio::spawn(async move {
            while hup.recv().await.is_some() {
                info!("SIGHUP: reloading the config");
                notify_service_manager(&format!(
                    "RELOADING=1\nMONOTONIC_USEC={}",
                    splitway_sys::activation::monotonic_usec()
                ));
                let reloader = reloader.clone();
                // The reloader logs the outcome (changes or every error).
                // A reload can load BPF programs too (see below); the trim
                // walks the heap under its locks, so it runs off the workers.
                let reloaded = tokio::task::spawn_blocking(move || {
                    let report = reloader.reload();
                    splitway_sys::mem::release_free_heap();
                    report
                });
                if let Err(e) = reloaded.await {
                    warn!(error = %e, "the config reload did not finish");
                }
                notify_service_manager("READY=1");
            }
        });
        // Loading the BPF programs parses the kernel's BTF (megabytes, freed
        // at once); glibc keeps such freed heap, which on the README's rc
        // config was 14 MB of an idle relay's 22 MB RSS. Hand it back once.
        splitway_sys::mem::release_free_heap();
        // Listeners listen, rules and accelerations are in, and signals are
        // handled: `systemctl start` (Type=notify) returns now, every start
        // error having been reported, and a reload from here on is applied.
        notify_service_manager("READY=1\nSTATUS=serving");
        let signal = Arc::new(std::sync::OnceLock::new());
        let received = signal.clone();
        let shutdown = async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            info!("{name}: draining");
            received.get_or_init(|| name);
            notify_service_manager("STOPPING=1");
        };
        let result = relay.run(shutdown, drain).await;
        reloads.abort();
        let stopped = result?;
        // The last line of the log says why the process ends.
        let by = match signal.get() {
            Some(name) => *name,
            None if stopped.by_admin => "a drain through the admin API",
            None => "shutdown",
        };
        if stopped.cut == 0 {
            info!("relay stopped after {by}: every open connection finished");
        } else {
            warn!(
                "relay stopped after {by}: {} connections were still open at the drain deadline ({}) and were closed",
                stopped.cut,
                humanize(drain)
            );
        }
        Ok::<_, anyhow::Error>(ExitCode::SUCCESS)
    })
}

/// The runtime connections run on: `workers` threads (absent: tokio's
/// default, one per CPU). Always the multi-threaded scheduler, also for one worker: the
/// single-threaded one cost less CPU per new connection but took 37
/// against 24 µs per 64 B ping-pong half round trip here, as a plain
/// one-thread epoll loop did (docs/efficiency.md, "threads").
fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    builder
        .enable_all()
        .thread_name("splitway-worker")
        .build()
        .context("starting the runtime")
}

/// Tells systemd (`NOTIFY_SOCKET`) the relay's state; without one, nothing.
fn notify_service_manager(state: &str) {
    if let Err(e) = splitway_sys::activation::notify(state) {
        // The state's first line names it (`RELOADING=1`).
        let state = state.lines().next().unwrap_or(state);
        warn!(error = %e, state, "telling the service manager failed");
    }
}

/// A duration as the config writes it ("30s", "1500ms").
fn humanize(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}
