//! Reloading a relay in-process: what a reload applies, keeps, replaces and
//! refuses, read from its report and from the snapshot it installs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use splitway_relay::Relay;
use splitway_relay::config::Config;
use splitway_relay::relay::RelayOptions;
use splitway_relay::reload::ReloadError;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir() -> Dir {
    let path = std::env::temp_dir().join(format!(
        "splitway-reload-{}-{:x}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&path).unwrap();
    Dir(path)
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A relay config: one SOCKS5 listener, the given extra listener and peers
/// (nothing listens at their addresses: their pools just fail to dial).
fn config(name: &str, key: &str, peers: &[(&str, u16, usize, usize)], extra: &str) -> String {
    // The key file doubles as the switch for the SOCKS5 client ACL.
    let allow = if key == "k2" {
        "allow_clients = [\"127.0.0.0/8\", \"10.0.0.0/8\"]\n"
    } else {
        ""
    };
    let mut out = format!(
        "name = \"{name}\"\nadmin = \"off\"\npsk_file = \"{key}\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:0\"\n{allow}"
    );
    for (peer, port, low, high) in peers {
        out.push_str(&format!(
            "[[peer]]\nname = \"{peer}\"\naddr = \"127.0.0.1:{port}\"\npool = {{ low = {low}, high = {high} }}\n[[route]]\ndst = \"10.{port}.0.0/16\"\nvia = \"{peer}\"\n"
        ));
    }
    out.push_str("[accel]\npool = true\n");
    out.push_str(extra);
    out
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_keeps_replaces_and_refuses() {
    let dir = temp_dir();
    write(&dir.0.join("k1"), &"11".repeat(32));
    write(&dir.0.join("k2"), &"22".repeat(32));
    let path = dir.0.join("relay.toml");
    write(
        &path,
        &config("r", "k1", &[("a", 9, 1, 2), ("b", 13, 1, 2)], ""),
    );
    let cfg = Config::load(&path).expect("valid config");
    let relay = Relay::bind_with(
        cfg,
        RelayOptions {
            config_path: Some(path.clone()),
            ..RelayOptions::default()
        },
    )
    .await
    .expect("bind");
    let reloader = relay.reloader();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(
        async {
            let _ = stop_rx.await;
        },
        Duration::from_secs(1),
    ));
    // run() starts the pools; wait until it has.
    for _ in 0..200 {
        if reloader.running_pools().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = reloader.snapshot();
    assert_eq!(reloader.running_pools().len(), 2);

    // a: watermarks only; b: new address; c: new peer and route; a new
    // name and listener need a restart; limits apply.
    write(
        &path,
        &config(
            "r2",
            "k1",
            &[("a", 9, 2, 3), ("b", 17, 1, 2), ("c", 19, 1, 1)],
            "[limits]\nper_client = 3\n[[listen]]\nmode = \"http-connect\"\naddr = \"127.0.0.2:0\"\n",
        ),
    );
    let report = tokio::task::spawn_blocking({
        let reloader = reloader.clone();
        move || reloader.reload()
    })
    .await
    .unwrap()
    .expect("valid reload");
    let changed: Vec<String> = report
        .changed
        .iter()
        .map(|c| format!("{}: {} -> {}", c.key, c.old, c.new))
        .collect();
    for expected in [
        "peer.a.pool.low: 1 -> 2",
        "peer.a.pool.high: 2 -> 3",
        "peer.b.addr: 127.0.0.1:13 -> 127.0.0.1:17",
        "peer.c: (none) -> 127.0.0.1:19",
        "route.10.19.0.0/16: (none) -> c",
        "limits.per_client: 0 -> 3",
    ] {
        assert!(
            changed.iter().any(|c| c == expected),
            "{expected:?} missing from {changed:#?}"
        );
    }
    assert!(report.needs_restart.contains(&"name".to_owned()));
    assert!(
        report
            .needs_restart
            .iter()
            .any(|k| k.starts_with("listen.")),
        "{:?}",
        report.needs_restart
    );
    let second = reloader.snapshot();
    assert_eq!(second.generation, 1);
    assert_eq!(second.cfg.name, "r", "the name needs a restart");
    assert_eq!(second.cfg.listeners.len(), 1, "the listener set stays");
    assert_eq!(second.cfg.limits.per_client, 3);
    let pool = |s: &splitway_relay::relay::Shared, i: usize| s.pools[i].clone().expect("pool");
    assert!(Arc::ptr_eq(&pool(&first, 0), &pool(&second, 0)), "a kept");
    assert_eq!((pool(&second, 0).low(), pool(&second, 0).high()), (2, 3));
    assert!(
        !Arc::ptr_eq(&pool(&first, 1), &pool(&second, 1)),
        "b replaced"
    );
    let running_pools = reloader.running_pools();
    assert_eq!(running_pools.len(), 3, "a, new b, c");
    assert!(
        !running_pools
            .iter()
            .any(|p| Arc::ptr_eq(p, &pool(&first, 1))),
        "the old pool of b was stopped"
    );
    // The first snapshot is untouched: connections on it go on as before.
    assert_eq!(first.cfg.peers.len(), 2);
    assert_eq!(first.cfg.limits.per_client, 0);

    // A new key replaces every pool (they authenticate with it).
    write(
        &path,
        &config(
            "r",
            "k2",
            &[("a", 9, 2, 3), ("b", 17, 1, 2), ("c", 19, 1, 1)],
            "[limits]\nper_client = 3\n",
        ),
    );
    let report = reloader.reload().expect("valid reload");
    assert!(
        report
            .changed
            .iter()
            .any(|c| c.key == "psk_file" && c.new.ends_with("(new key)")),
        "{:?}",
        report.changed
    );
    assert!(
        report.needs_restart.is_empty(),
        "{:?}",
        report.needs_restart
    );
    assert!(
        report
            .changed
            .iter()
            .any(|c| c.key == "listen.127.0.0.1:0.allow_clients" && c.new.contains("10.0.0.0/8")),
        "{:?}",
        report.changed
    );
    let third = reloader.snapshot();
    assert_eq!(third.cfg.listeners[0].allow_clients.len(), 2);
    for i in 0..3 {
        assert!(!Arc::ptr_eq(&pool(&second, i), &pool(&third, i)));
    }

    // An invalid file changes nothing and names every problem.
    write(
        &path,
        &format!(
            "{}[[route]]\ndst = \"10.99.0.0/16\"\nvia = \"nowhere\"\n[timeouts]\nidle = \"soon\"\n",
            config("r", "k2", &[("a", 9, 2, 3)], "")
        ),
    );
    match reloader.reload() {
        Err(ReloadError::Invalid(errors)) => {
            let keys: Vec<&str> = errors.issues.iter().map(|i| i.key.as_str()).collect();
            assert!(keys.iter().any(|k| k.ends_with(".via")), "{keys:?}");
            assert!(keys.contains(&"timeouts.idle"), "{keys:?}");
        }
        other => panic!("an invalid file was not refused: {other:?}"),
    }
    assert_eq!(reloader.snapshot().generation, 2);
    assert_eq!(reloader.running_pools().len(), 3);

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("relay stops")
        .expect("task")
        .expect("clean exit");
    // A drained relay refuses reloads.
    assert!(matches!(reloader.reload(), Err(ReloadError::Draining)));
}

/// A syn-option listener's `watch` belongs to the SYN detector attached at
/// start: a reload that changes it reports a restart and keeps the running
/// value, so pairing never consults interfaces the detector does not watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_a_syn_option_listeners_watch() {
    let dir = temp_dir();
    let path = dir.0.join("relay.toml");
    let text = |watch: &str| {
        format!(
            "name = \"r\"\nadmin = \"off\"\n[[listen]]\nmode = \"syn-option\"\naddr = \"127.0.0.1:0\"\nallow_clients = [\"127.0.0.0/8\"]\nwatch = [\"{watch}\"]\n\
             [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n[accel]\nearly_syn = false\n"
        )
    };
    write(&path, &text("lo"));
    let cfg = Config::load(&path).expect("valid config");
    let relay = Relay::bind_with(
        cfg,
        RelayOptions {
            config_path: Some(path.clone()),
            ..RelayOptions::default()
        },
    )
    .await
    .expect("bind");
    let reloader = relay.reloader();
    write(&path, &text("eth9"));
    let report = tokio::task::spawn_blocking({
        let reloader = reloader.clone();
        move || reloader.reload()
    })
    .await
    .unwrap()
    .expect("valid reload");
    assert!(
        report
            .needs_restart
            .iter()
            .any(|k| k.starts_with("listen.")),
        "{:?}",
        report.needs_restart
    );
    assert_eq!(reloader.snapshot().cfg.listeners[0].watch, ["lo"]);
    drop(relay);
}
