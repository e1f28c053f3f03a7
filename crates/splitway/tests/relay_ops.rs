//! Operating a running relay with the real binary: live parameters through
//! `splitway ctl set`, config reloads (`ctl reload`, SIGHUP) including key
//! rotation, refused reloads, drain, metrics, and socket activation.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use sha2::{Digest as _, Sha256};
use support::*;

fn server_v6() -> SocketAddr {
    sock(&format!("[{SERVER_V6}]:{SERVER_PORT}"))
}

fn socks_addr() -> SocketAddr {
    sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"))
}

fn status(lab: &Lab, relay: &str) -> splitway_api::Status {
    admin_status(lab.relay_ns(relay)).unwrap_or_else(|e| panic!("GET /status from {relay}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Rewrites a relay's config file (to be reloaded).
fn rewrite(lab: &Lab, relay: &str, config: &RelayConfig) {
    std::fs::write(lab.config_path(relay), config.render(&lab.psk_path)).expect("write config");
}

/// `splitway ctl ARGS` that must succeed; returns its stdout.
fn ctl_ok(lab: &Lab, relay: &str, args: &[&str]) -> String {
    let out = lab.ctl(relay, args);
    assert!(
        out.status.success(),
        "splitway ctl {args:?} on {relay} failed with {}:\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Waits until `relay` runs config generation `generation` (a SIGHUP
/// reload is asynchronous).
fn wait_generation(lab: &Lab, relay: &str, generation: u64, deadline: Deadline) {
    wait_until(
        deadline,
        &format!("waiting for {relay} to run config generation {generation}"),
        || (status(lab, relay).config_generation == generation).then_some(()),
    );
}

/// SOCKS5 CONNECT through the entry relay: the stream once the relay
/// answered success, or the SOCKS reply code.
fn socks_connect(lab: &Lab, dst: SocketAddr) -> Result<TcpStream, u8> {
    let mut s = connect_in(&lab.client, socks_addr()).expect("connect to the SOCKS5 listener");
    let mut request = vec![5, 1, 0, 5, 1, 0];
    match dst {
        SocketAddr::V4(a) => {
            request.push(1);
            request.extend_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            request.push(4);
            request.extend_from_slice(&a.ip().octets());
        }
    }
    request.extend_from_slice(&dst.port().to_be_bytes());
    s.write_all(&request).expect("SOCKS5 request");
    let mut head = [0u8; 6];
    s.read_exact(&mut head).expect("SOCKS5 replies");
    assert_eq!(&head[..2], &[5, 0], "method selection");
    let addr_len = match head[5] {
        1 => 4,
        4 => 16,
        other => panic!("SOCKS5 reply with address type {other}"),
    };
    let mut rest = vec![0u8; addr_len + 2];
    s.read_exact(&mut rest).expect("SOCKS5 reply address");
    match head[3] {
        0 => Ok(s),
        code => Err(code),
    }
}

/// A sha256-checked transfer client → server that sends `first` bytes, then
/// waits for [`Paused::resume`] before sending the rest: a connection
/// verifiably open across whatever the test does in between.
struct Paused {
    resume: mpsc::Sender<()>,
    sender: JoinHandle<(u64, [u8; 32])>,
    receiver: JoinHandle<(u64, [u8; 32])>,
}

impl Paused {
    fn start(mut client: TcpStream, mut server: TcpStream, first: u64, total: u64) -> Paused {
        let (resume, resumed) = mpsc::channel::<()>();
        let (sent_first, first_sent) = mpsc::channel::<()>();
        let sender = std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(total ^ 0x0b5);
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; 64 * 1024];
            let mut sent = 0u64;
            while sent < total {
                if sent == first {
                    let _ = sent_first.send(());
                    resumed.recv().expect("resume signal");
                }
                let n = (total - sent).min(buf.len() as u64).min(if sent < first {
                    first - sent
                } else {
                    u64::MAX
                }) as usize;
                rng.fill_bytes(&mut buf[..n]);
                hasher.update(&buf[..n]);
                client.write_all(&buf[..n]).expect("client send");
                sent += n as u64;
            }
            client.shutdown(Shutdown::Write).expect("client shutdown");
            (sent, hasher.finalize().into())
        });
        let receiver = std::thread::spawn(move || {
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; 64 * 1024];
            let mut len = 0u64;
            loop {
                let n = read_some(&mut server, &mut buf).expect("server read");
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            (len, hasher.finalize().into())
        });
        first_sent
            .recv_timeout(IO_TIMEOUT)
            .expect("the first part of the transfer was sent");
        Paused {
            resume,
            sender,
            receiver,
        }
    }

    /// Lets the sender go on with the rest.
    fn resume(&self) {
        // The sender waits for exactly one signal; a second one is unread.
        let _ = self.resume.send(());
    }

    /// Sends the rest and checks the server got every byte, unaltered.
    fn finish(self, what: &str) -> u64 {
        self.resume();
        let sent = self.sender.join().expect("sender thread");
        let received = self.receiver.join().expect("receiver thread");
        assert_eq!(
            (received.0, hex::encode(received.1)),
            (sent.0, hex::encode(sent.1)),
            "{what}: bytes at the server (len, sha256) differ from those sent"
        );
        sent.0
    }
}

/// A transparent (TPROXY) connection to the v4 server, paused after 1 MiB.
fn paused_tproxy(lab: &Lab, server: &TestServer, total: u64) -> Paused {
    let client = connect_in(&lab.client, server_v4()).expect("connect");
    let (conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    Paused::start(client, conn, MIB, total)
}

/// A short sha256-checked exchange over an already connected stream.
fn exchange(client: &mut TcpStream, server: &TestServer, len: u64, seed: u64) {
    let (mut conn, _) = server.accept(Duration::from_secs(20));
    let sent = send_pattern(client, len, seed).expect("client send");
    client.shutdown(Shutdown::Write).expect("shutdown");
    let got = recv_all(&mut conn).expect("server receive");
    assert_eq!(got.to_string(), sent.to_string(), "bytes at the server");
}

#[test]
fn pool_watermarks_follow_ctl_set_while_a_transfer_runs() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].peers[0].pool = Some(pool_bounds(2, 2));
    configs[0].accel(|a| a.pool = Some(true));
    lab.start_relays(&configs);
    let level = |lab: &Lab| -> (u64, u64, u64) {
        let st = status(lab, "rc");
        let pool = st.peers[0]
            .pool
            .as_ref()
            .unwrap_or_else(|| panic!("no pool in {st:?}"));
        (pool.level, pool.low, pool.high)
    };
    wait_until(deadline, "waiting for rc's pool to fill to 2", || {
        (level(&lab) == (2, 2, 2)).then_some(())
    });

    let server = TestServer::bind(&lab.server, server_v4());
    let transfer = paused_tproxy(&lab, &server, 48 * MIB);
    let out = ctl_ok(
        &lab,
        "rc",
        &["set", "pool.rs.low", "6", "pool.rs.high", "6"],
    );
    assert!(
        out.contains("pool.rs.high: 2 -> 6"),
        "ctl set output:\n{out}"
    );
    assert!(
        out.contains("pool.rs.low: 2 -> 6"),
        "ctl set output:\n{out}"
    );
    // The transfer runs while the pool refills to the new level.
    transfer.resume();
    wait_until(deadline, "waiting for rc's pool to reach 6", || {
        (level(&lab) == (6, 6, 6)).then_some(())
    });
    transfer.finish("transfer during the watermark change");

    // The log filter, as RUST_LOG directives; a filter that does not
    // parse is refused with the reason.
    let out = ctl_ok(
        &lab,
        "rc",
        &["set", "log.level", "splitway_relay=debug,warn"],
    );
    assert!(
        out.contains("-> splitway_relay=debug,warn"),
        "ctl set output:\n{out}"
    );
    let refused = lab.ctl("rc", &["set", "log.level", "splitway=loud"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("log.level: `splitway=loud` is not a log filter"),
        "{}",
        text(&refused.stderr)
    );
    assert!(ctl_ok(&lab, "rc", &["params"]).contains("splitway_relay=debug,warn"));

    // A value outside the range is refused, naming the parameter.
    let refused = lab.ctl("rc", &["set", "pool.rs.high", "5000"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("pool.rs.high"),
        "{}",
        text(&refused.stderr)
    );
    lab.assert_relays_alive();
}

#[test]
fn reload_applies_routes_to_new_connections_and_refuses_a_bad_file() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // rc starts without a route to the server's IPv6 subnet.
    configs[0].routes.retain(|r| r.dst != "fd00:3::/64");
    lab.start_relays(&configs);
    let server4 = TestServer::bind(&lab.server, server_v4());
    let server6 = TestServer::bind(&lab.server, server_v6());

    // Open before any reload; finished after all of them.
    let old = paused_tproxy(&lab, &server4, 16 * MIB);
    assert!(
        socks_connect(&lab, server_v6()).is_err(),
        "rc has no route to {SERVER_V6} yet"
    );

    // `ctl reload` with the route added.
    configs[0].route("fd00:3::/64", "rs");
    rewrite(&lab, "rc", &configs[0]);
    let out = ctl_ok(&lab, "rc", &["reload"]);
    assert!(
        out.contains("route.fd00:3::/64: (none) -> rs"),
        "ctl reload output:\n{out}"
    );
    let mut v6 = socks_connect(&lab, server_v6()).expect("the reloaded route is used");

    // SIGHUP with the route removed again: new connections are refused,
    // the one opened under the previous config carries on.
    configs[0].routes.retain(|r| r.dst != "fd00:3::/64");
    rewrite(&lab, "rc", &configs[0]);
    lab.signal_relay("rc", "HUP");
    wait_generation(&lab, "rc", 2, deadline);
    assert!(
        socks_connect(&lab, server_v6()).is_err(),
        "the route removed by SIGHUP is still used"
    );
    exchange(&mut v6, &server6, 256 * 1024, 6);

    // A bad file is refused with every error, and changes nothing.
    // Appended as text on purpose: the misspelt key (`max_conections`)
    // is what a typed config cannot express.
    let good = std::fs::read_to_string(lab.config_path("rc")).expect("read config");
    std::fs::write(
        lab.config_path("rc"),
        format!("{good}\n[[route]]\ndst = \"10.9.0.0/16\"\nvia = \"nowhere\"\n\n[limits]\nmax_conections = 5\n"),
    )
    .expect("write bad config");
    let refused = lab.ctl("rc", &["reload"]);
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(stderr.contains("422"), "{stderr}");
    assert!(stderr.contains("via"), "the bad route is named:\n{stderr}");
    assert!(
        stderr.contains("max_conections"),
        "the unknown key is named:\n{stderr}"
    );
    assert_eq!(status(&lab, "rc").config_generation, 2);
    transfer_client_to_server(&lab.client, &server4, server_v4(), MIB, LAST_RELAY_V4);

    old.finish("connection opened before the reloads");
    lab.assert_relays_alive();
}

#[test]
fn psk_rotation_by_reload_keeps_connections_working() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].peers[0].pool = Some(pool_bounds(2, 2));
    configs[0].accel(|a| a.pool = Some(true));
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let old = paused_tproxy(&lab, &server, 8 * MIB);

    let old_key = lab.psk_path.clone();
    let new_key = lab.dir.join("new.key");
    write_psk(&new_key, 0x5717_0002);

    // rs (the listener) takes the new key and still accepts the old one.
    configs[1].psk_file = Some(new_key.clone());
    configs[1].psk_file_previous = Some(old_key.clone());
    rewrite(&lab, "rs", &configs[1]);
    let out = ctl_ok(&lab, "rs", &["reload"]);
    assert!(out.contains("psk_file"), "ctl reload output:\n{out}");
    transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);

    // rc (the dialer) switches to the new key.
    configs[0].psk_file = Some(new_key.clone());
    rewrite(&lab, "rc", &configs[0]);
    lab.signal_relay("rc", "HUP");
    wait_generation(&lab, "rc", 1, deadline);
    // Its pool was replaced: wait for connections authenticated anew.
    wait_until(deadline, "waiting for rc's new pool", || {
        (status(&lab, "rc").peers[0].pool.as_ref()?.level == 2).then_some(())
    });

    // rs drops the old key: only the new one works from now on.
    configs[1].psk_file_previous = None;
    rewrite(&lab, "rs", &configs[1]);
    ctl_ok(&lab, "rs", &["reload"]);
    for seed in 0..3 {
        transfer_client_to_server(&lab.client, &server, server_v4(), MIB + seed, LAST_RELAY_V4);
    }
    let failures = lab
        .metrics("rs")
        .counter("splitway_peer_auth_failures_total", &[]);
    assert_eq!(failures, 0.0, "rs refused a peer during the rotation");
    old.finish("connection opened before the key rotation");
    lab.assert_relays_alive();
}

#[test]
fn drain_finishes_an_inflight_transfer_refuses_new_ones_and_exits_0() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(180));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());

    let client = socks_connect(&lab, server_v4()).expect("SOCKS5 connect");
    let (conn, _) = server.accept(Duration::from_secs(20));
    let transfer = Paused::start(client, conn, MIB, 100 * MIB);
    // A transparent connection too: the drain removes the interception
    // rules, and its packets must still reach rc's socket.
    let transparent = paused_tproxy(&lab, &server, 8 * MIB);

    let out = ctl_ok(&lab, "rc", &["drain"]);
    assert!(out.contains("draining: on"), "ctl drain output:\n{out}");
    // New connections are refused once the listener is closed.
    wait_until(
        deadline,
        "waiting for rc to stop accepting",
        || match connect_in(&lab.client, socks_addr()) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        },
    );
    let sent = transfer.finish("transfer in flight during the drain");
    assert_eq!(sent, 100 * MIB);
    transparent.finish("transparent connection in flight during the drain");
    let exit = lab.wait_relay_exit("rc", deadline);
    assert!(exit.success(), "rc exited with {exit} after the drain");
}

/// Every admin answer of a real relay reads into splitway-api's types,
/// which refuse unknown fields in tests, and gives back the same JSON: a
/// field added to the relay without the types fails here.
/// `workers` sets the threads that run connections: `/status` reports
/// them, each listener has one accept socket per worker, and bytes cross a
/// one-worker and a two-worker relay whole in both directions.
#[test]
fn workers_set_the_threads_that_run_connections() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].sections.workers = Some(1);
    configs[1].sections.workers = Some(2);
    lab.start_relays(&configs);
    for (relay, workers) in [("rc", 1), ("rs", 2)] {
        let st = status(&lab, relay);
        assert_eq!(st.workers, workers, "{relay}: {st:?}");
        let paths = st.listeners[0].accept_paths.as_ref().expect("bound");
        assert_eq!(paths.len() as u64, workers, "{relay}: {st:?}");
    }
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 2 * MIB, LAST_RELAY_V4);
    transfer_server_to_client(&lab.client, &server, server_v4(), 2 * MIB, LAST_RELAY_V4);
    assert!(!deadline.expired(), "took longer than the deadline");
    lab.assert_relays_alive();
}

#[test]
fn admin_answers_round_trip_through_the_api_types() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].peers[0].pool = Some(pool_bounds(2, 2));
    configs[0].accel(|a| a.pool = Some(true));
    lab.start_relays(&configs);
    let status = wait_until(deadline, "waiting for rc's pool to fill", || {
        let st = admin_status(lab.rc()).expect("typed /status");
        (st.peers[0].pool.as_ref()?.level == 2).then_some(st)
    });
    assert_eq!(status.name, "rc");
    assert!(!status.routes.is_empty() && !status.listeners.is_empty());
    assert!(status.accel.contains_key("pool"), "{status:?}");

    let server = TestServer::bind(&lab.server, server_v4());
    let transfer = paused_tproxy(&lab, &server, 4 * MIB);
    let connections: splitway_api::Connections =
        typed_answer(&curl_admin(lab.rc(), "/connections?sample=5").expect("GET /connections"))
            .expect("typed /connections");
    assert_eq!(connections.total, 1, "{connections:?}");
    assert_eq!(connections.sample[0].dst, server_v4().to_string());

    let params: Vec<splitway_api::Param> =
        typed_answer(&curl_admin(lab.rc(), "/params").expect("GET /params"))
            .expect("typed /params");
    let low = params
        .iter()
        .find(|p| p.name == "pool.rs.low")
        .expect("pool.rs.low listed");
    assert_eq!(low.value, splitway_api::ParamValue::Int(2));

    let changed: splitway_api::ParamsChanged =
        typed_answer(&ctl_ok(&lab, "rc", &["--json", "set", "pool.rs.high", "3"]))
            .expect("typed PUT /params");
    assert_eq!(changed.changed[0].name, "pool.rs.high", "{changed:?}");
    let reload: splitway_api::Reload =
        typed_answer(&ctl_ok(&lab, "rc", &["--json", "reload"])).expect("typed /reload");
    assert!(reload.reloaded && reload.generation == 1, "{reload:?}");
    let refused = lab.ctl("rc", &["--json", "set", "pool.rs.high", "5000"]);
    assert_eq!(refused.status.code(), Some(1));
    let error: splitway_api::ErrorBody =
        typed_answer(&text(&refused.stdout)).expect("typed error answer");
    assert_eq!(error.status, 400, "{error:?}");

    transfer.finish("transfer during the admin requests");
    let drain: splitway_api::Drain =
        typed_answer(&ctl_ok(&lab, "rc", &["--json", "drain"])).expect("typed /drain");
    assert!(drain.draining, "{drain:?}");
    let exit = lab.wait_relay_exit("rc", deadline);
    assert!(exit.success(), "rc exited with {exit} after the drain");
}

#[test]
fn metrics_parse_and_count_what_was_done() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // rs counts one accepted peer leg per connection: none pooled ahead,
    // no window probe.
    configs[0].accel(|a| {
        a.pool = Some(false);
        a.learned_window = Some(false);
    });
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let sizes = [MIB, 3 * MIB + 7, 12_345];
    for (i, len) in sizes.iter().enumerate() {
        transfer_client_to_server(&lab.client, &server, server_v4(), *len, LAST_RELAY_V4);
        lab.wait_counter(
            "rc",
            "splitway_connections_closed_total",
            &[],
            (i + 1) as f64,
            deadline,
        );
    }
    let total: u64 = sizes.iter().sum();
    // Through the real ctl, parsed by prometheus-parse.
    let text = ctl_ok(&lab, "rc", &["metrics"]);
    let rc = Metrics::parse(&text);
    assert_eq!(
        rc.counter("splitway_connections_accepted_total", &[("mode", "tproxy")]),
        sizes.len() as f64,
        "{text}"
    );
    assert_eq!(
        rc.counter("splitway_connections_accepted_total", &[]),
        sizes.len() as f64,
        "{text}"
    );
    let forwarded = rc.counter(
        "splitway_forwarded_bytes_total",
        &[("direction", "to_server")],
    );
    assert!(
        forwarded >= total as f64,
        "forwarded {forwarded} < sent {total}"
    );
    let rs = lab.metrics("rs");
    assert_eq!(
        rs.counter("splitway_connections_accepted_total", &[("mode", "peer")]),
        sizes.len() as f64,
        "{}",
        rs.text
    );
    lab.assert_relays_alive();
}

#[test]
fn socket_activation_serves_through_the_inherited_listener() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    // rs as usual; rc started by the test with its SOCKS5 socket inherited.
    lab.restart_relay("rs", &configs[1]);
    let config_path = lab.config_path("rc");
    std::fs::write(&config_path, configs[0].render(&lab.psk_path)).expect("write config");

    let spawn = |lab: &Lab, listener: std::net::TcpListener, log: &str| {
        let stderr = std::fs::File::create(lab.dir.join(log)).expect("log file");
        // The socket arrives as stdin and is moved to fd 3 by the shell,
        // whose pid the relay keeps through exec: LISTEN_PID is its own.
        lab.rc()
            .command("sh")
            .arg("-c")
            .arg(r#"exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" relay --config "$1""#)
            .arg(SPLITWAY)
            .arg(&config_path)
            .stdin(Stdio::from(OwnedFd::from(listener)))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn splitway relay")
    };

    // A socket no [[listen]] entry has is refused, naming its address.
    let stray = lab
        .rc()
        .run_in(|| std::net::TcpListener::bind("10.0.1.2:1081"))
        .expect("enter namespace")
        .expect("bind");
    let mut child = spawn(&lab, stray, "stray.log");
    let exit = wait_until(
        deadline,
        "waiting for rc to refuse the stray socket",
        || child.try_wait().expect("try_wait"),
    );
    let log = std::fs::read_to_string(lab.dir.join("stray.log")).unwrap_or_default();
    assert!(
        !exit.success(),
        "rc accepted a socket it has no entry for:\n{log}"
    );
    assert!(
        log.contains("10.0.1.2:1081"),
        "the address is named:\n{log}"
    );

    let inherited = lab
        .rc()
        .run_in(move || std::net::TcpListener::bind(socks_addr()))
        .expect("enter namespace")
        .expect("bind the SOCKS5 address");
    let child = spawn(&lab, inherited, "rc-activated.log");
    lab.adopt(child);
    wait_until(deadline, "waiting for the activated rc", || {
        curl_admin(lab.rc(), "/status").ok()
    });
    let log = std::fs::read_to_string(lab.dir.join("rc-activated.log")).unwrap_or_default();
    assert!(
        log.contains("passed by the service manager") && log.contains(&socks_addr().to_string()),
        "rc did not report adopting the socket:\n{log}"
    );
    let server = TestServer::bind(&lab.server, server_v4());
    let mut client = socks_connect(&lab, server_v4()).expect("SOCKS5 through the inherited socket");
    exchange(&mut client, &server, 2 * MIB, 9);
}

/// One `NOTIFY_SOCKET` datagram, or a panic naming what was awaited.
fn next_notification(socket: &std::os::unix::net::UnixDatagram, what: &str) -> String {
    let mut buf = [0u8; 256];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("waiting for {what} on NOTIFY_SOCKET: {e}"));
    text(&buf[..n])
}

#[test]
fn the_service_manager_hears_ready_reloading_and_stopping() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.restart_relay("rs", &configs[1]);
    let config_path = lab.config_path("rc");
    std::fs::write(&config_path, configs[0].render(&lab.psk_path)).expect("write config");
    // A path socket: abstract ones are per network namespace.
    let notify_path = lab.dir.join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("bind NOTIFY_SOCKET");
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let stderr = std::fs::File::create(lab.dir.join("rc-notify.log")).expect("log file");
    let child = lab
        .rc()
        .command(SPLITWAY)
        .args(["relay", "--config"])
        .arg(&config_path)
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn splitway relay");
    let pid = child.id().to_string();
    lab.adopt(child);
    let kill = |signal: &str| {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid}");
    };

    // First the status once every listener listens (clients queue from
    // then on), then READY=1 once the whole start is done: the SOCKS5 port
    // and the admin API answer the moment it arrives, with no retry.
    assert_eq!(
        next_notification(&notify, "STATUS=listening"),
        "STATUS=listening; loading the accelerations"
    );
    assert_eq!(
        next_notification(&notify, "READY=1"),
        "READY=1\nSTATUS=serving"
    );
    let server = TestServer::bind(&lab.server, server_v4());
    let mut client = socks_connect(&lab, server_v4()).expect("SOCKS5 right after READY=1");
    exchange(&mut client, &server, 256 * 1024, 3);
    drop(client);
    curl_admin(lab.rc(), "/status").expect("admin API right after READY=1");

    // A reload is bracketed: RELOADING=1 with the monotonic clock, then
    // READY=1 once the new generation runs.
    let before = status(&lab, "rc").config_generation;
    kill("HUP");
    let reloading = next_notification(&notify, "RELOADING=1");
    let usec: u64 = reloading
        .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("not a reload notification: {reloading:?}"));
    assert!(usec > 0, "{reloading:?}");
    assert_eq!(
        next_notification(&notify, "READY=1 after the reload"),
        "READY=1"
    );
    assert_eq!(status(&lab, "rc").config_generation, before + 1);

    kill("TERM");
    assert_eq!(next_notification(&notify, "STOPPING=1"), "STOPPING=1");
    wait_until(deadline, "waiting for rc to stop after SIGTERM", || {
        curl_admin(lab.rc(), "/status").is_err().then_some(())
    });
}

/// `ctl connections` shows an open connection's next hop, bytes each way
/// and age (#34 item 5); once closed, it is one line of the access log, as
/// text on rc and JSON on rs: client, original destination, route, bytes
/// each way, duration and outcome.
#[test]
fn open_connections_show_next_hop_and_bytes_and_closed_ones_are_access_logged() {
    use splitway_relay::config::AccessLogFormat;
    use splitway_relay::config::raw::RawAccessLog;

    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    let rc_log = lab.dir.join("rc-access.log");
    let rs_log = lab.dir.join("rs-access.log");
    configs[0].sections.access_log = Some(RawAccessLog {
        path: rc_log.display().to_string(),
        format: None,
    });
    configs[1].sections.access_log = Some(RawAccessLog {
        path: rs_log.display().to_string(),
        format: Some(AccessLogFormat::Json),
    });
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let total = 4 * MIB;
    let transfer = paused_tproxy(&lab, &server, total);

    // Paused after its first MiB: both relays show it with that many bytes
    // to the server, none back, and their next hop.
    for (relay, via) in [("rc", "rs"), ("rs", "direct")] {
        let open = wait_until(deadline, "the first MiB counted", || {
            let answer = curl_admin(lab.relay_ns(relay), "/connections?sample=5").ok()?;
            let c: splitway_api::Connections = typed_answer(&answer).expect("typed /connections");
            let conn = c.sample.first()?.clone();
            (conn.bytes_to_server? >= MIB).then_some(conn)
        });
        assert_eq!(open.via.as_deref(), Some(via), "{relay}: {open:?}");
        assert_eq!(open.bytes_to_server, Some(MIB), "{relay}: {open:?}");
        assert_eq!(open.bytes_to_client, Some(0), "{relay}: {open:?}");
        assert_eq!(open.dst, server_v4().to_string(), "{relay}: {open:?}");
        assert!(open.age_seconds > 0.0, "{relay}: {open:?}");
    }
    let table = ctl_ok(&lab, "rc", &["connections"]);
    let row = table
        .lines()
        .find(|l| l.contains(&server_v4().to_string()))
        .unwrap_or_else(|| panic!("no row for the connection:\n{table}"));
    assert!(
        row.contains(" rs ") && row.contains(&MIB.to_string()),
        "ctl connections row names neither the next hop nor the bytes: {row}"
    );

    assert_eq!(transfer.finish("paused transfer"), total);
    let line = wait_until(deadline, "rc's access log line", || {
        let text = std::fs::read_to_string(&rc_log).ok()?;
        text.lines()
            .find(|l| l.contains(&format!("dst={}", server_v4())))
            .map(str::to_owned)
    });
    for field in [
        "mode=tproxy".to_owned(),
        "via=rs".to_owned(),
        format!("to_server={total}"),
        "to_client=0".to_owned(),
        "outcome=completed".to_owned(),
    ] {
        assert!(
            line.contains(&format!(" {field} ")) || line.ends_with(&field),
            "rc access log line lacks {field}: {line}"
        );
    }
    assert!(line.starts_with("time=20"), "{line}");
    let json = wait_until(deadline, "rs's access log line", || {
        let text = std::fs::read_to_string(&rs_log).ok()?;
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .find(|v| v["dst"] == server_v4().to_string())
    });
    assert_eq!(json["mode"], "peer", "{json}");
    assert_eq!(json["via"], "direct", "{json}");
    assert_eq!(json["to_server"], total, "{json}");
    assert_eq!(json["to_client"], 0, "{json}");
    assert_eq!(json["outcome"], "completed", "{json}");
    assert!(
        json["duration_ms"].as_f64().is_some_and(|d| d > 0.0),
        "{json}"
    );
    assert!(!deadline.expired(), "took longer than the deadline");
    lab.assert_relays_alive();
}

/// `metrics = ADDR` (issue #30): a cluster's Prometheus scrapes a relay
/// there from another host, while the admin API stays on loopback and the
/// metrics address answers nothing else.
#[test]
fn a_metrics_address_serves_metrics_to_other_hosts_and_nothing_else() {
    require_netns!();
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    let metrics = format!("{ENTRY_V4}:9464");
    configs[0].sections.metrics = Some(metrics.clone());
    lab.start_relays(&configs);
    let get = |addr: &str, path: &str| {
        let out = lab
            .client
            .command("curl")
            .args(["-s", "--max-time", "3", "-w", "\n%{http_code}"])
            .arg(format!("http://{addr}{path}"))
            .stdin(Stdio::null())
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
        (code.to_owned(), body.to_owned())
    };
    let (code, body) = get(&metrics, "/metrics");
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("splitway_build_info"), "{body}");
    assert!(body.contains("splitway_connections_accepted"), "{body}");
    for path in ["/status", "/connections", "/routes", "/params"] {
        assert_eq!(get(&metrics, path).0, "404", "{path}");
    }
    // The admin API, on rc's loopback, is out of the client's reach.
    let (code, _) = get(&format!("{ENTRY_V4}:9090"), "/status");
    assert_eq!(code, "000", "the admin API answered another host");
    assert!(admin_status(lab.rc()).is_ok());
    lab.assert_relays_alive();
}
