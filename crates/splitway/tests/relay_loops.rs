//! Loops and exhaustion (`docs/reliability.md`, "Loops and exhaustion"),
//! through the real binary in namespaces:
//! - no connection makes a relay dial itself: a direct connection to the
//!   TPROXY port (remote and loopback), SOCKS5 and HTTP CONNECT requests for
//!   the relay's own listeners;
//! - a routing loop through two transparent relays with direct routes dies
//!   out like one through routers (the IP TTL counts relays too);
//! - near the open-file limit new connections are shed, open ones go on;
//! - a client that accept would refuse causes no dial at its SYN (early
//!   SYN, strict mode).
//!
//! After each, the relay holds fewer than 100 descriptors and still carries
//! a sha256-checked transfer.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use sha2::Digest as _;
use support::*;

const HTTP_FORBIDDEN: u16 = 403;
/// A second intercepted port, for the descriptor flood.
const FLOOD_PORT: u16 = 5002;

fn server_addr() -> SocketAddr {
    sock(&format!("{SERVER_V4}:{SERVER_PORT}"))
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(usize::MAX, |d| d.count())
}

/// The relay is back to a handful of descriptors and forwards intact.
fn assert_healthy(lab: &Lab, relays: &[&str], server: &TestServer, expected_peer: &str) {
    for relay in relays {
        let pid = lab.relay_pid(relay);
        let n = poll_until(Deadline::after(Duration::from_secs(10)), || {
            let n = open_descriptors(pid);
            (n < 100).then_some(n)
        });
        assert!(
            n.is_some(),
            "{relay} holds {} descriptors, expected < 100",
            open_descriptors(pid)
        );
    }
    transfer_client_to_server(&lab.client, server, server_addr(), MIB, expected_peer);
    transfer_server_to_client(&lab.client, server, server_addr(), MIB, expected_peer);
}

#[test]
fn connections_to_the_relays_own_listeners_are_refused() {
    if !netns_usable() {
        return;
    }
    let mut lab = Lab::chain(&["rc"]);
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_addr());

    // Not intercepted: straight to the transparent listener, whose
    // "original destination" is then itself. Remote, then loopback.
    tproxy_reset(&lab.client, sock(&format!("{ENTRY_V4}:{TPROXY_PORT}")));
    tproxy_reset(lab.rc(), sock(&format!("127.0.0.1:{TPROXY_PORT}")));
    // Proxy requests naming the relay's own listeners.
    for port in [SOCKS_PORT, TPROXY_PORT, HTTP_CONNECT_PORT] {
        let (code, _) = socks5(&lab.client, Target::Ip(sock(&format!("{ENTRY_V4}:{port}"))));
        assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 CONNECT to own port {port}");
    }
    let (status, _) = http_connect(&lab.client, &format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}"));
    assert_eq!(
        status, HTTP_FORBIDDEN,
        "CONNECT to the relay's own listener"
    );
    let (status, _) = http_connect(&lab.client, &format!("{ENTRY_V4}:{SOCKS_PORT}"));
    assert_eq!(
        status, HTTP_FORBIDDEN,
        "CONNECT to the relay's SOCKS5 listener"
    );

    let deadline = Deadline::after(Duration::from_secs(10));
    assert_count(
        &lab,
        "rc",
        "splitway_denied_total",
        &[("reason", "self")],
        7.0,
        deadline,
    );
    // Nothing was dialed for them: the only connections accepted are ours.
    let m = lab.metrics("rc");
    for (mode, n) in [("tproxy", 2.0), ("socks5", 3.0), ("http_connect", 2.0)] {
        assert_eq!(
            m.counter("splitway_connections_accepted_total", &[("mode", mode)]),
            n,
            "{mode} accepts"
        );
    }
    assert_healthy(&lab, &["rc"], &server, LAST_RELAY_V4);
}

/// Where the two relays' routes send the loop's destination: to each other.
const LOOP_DST: &str = "10.0.9.9";

#[test]
fn a_routing_loop_through_two_transparent_relays_dies_out() {
    if !netns_usable() {
        return;
    }
    let mut lab = Lab::chain(&["ra", "rb"]);
    // ra intercepts on both sides (rb's legs come back to it), rb on its
    // west side (ra's legs). A relay's own SYN coming back to it would be
    // dropped as a martian, so a loop needs two relays.
    let configs: Vec<RelayConfig> = [("ra", &[WEST_IF, EAST_IF][..]), ("rb", &[WEST_IF][..])]
        .iter()
        .map(|(name, interfaces)| {
            let mut cfg = RelayConfig::new(name);
            cfg.listen_intercept(
                ListenMode::Tproxy,
                &format!("0.0.0.0:{TPROXY_PORT}"),
                interfaces,
                &[SERVER_PORT],
            );
            cfg.route("0.0.0.0/0", "direct");
            cfg
        })
        .collect();
    // A routing loop: ra sends LOOP_DST east to rb, rb sends it west to ra.
    let middle = |host| link_v4(1, 2, host);
    lab.relays[0]
        .ip(&["route", "add", LOOP_DST, "via", &middle(2)])
        .expect("ra route");
    lab.relays[1]
        .ip(&["route", "add", LOOP_DST, "via", &middle(1)])
        .expect("rb route");
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_addr());

    let dst = sock(&format!("{LOOP_DST}:{SERVER_PORT}"));
    // The client sends with TTL 64: ra dials with 63, rb with 62, ra with
    // 61, and so on: each relay on the loop takes one, like a router.
    let mut stream = connect_in(&lab.client, dst).expect("connect: ra accepts at once");
    let denied = poll_until(Deadline::after(Duration::from_secs(10)), || {
        let n: f64 = ["ra", "rb"]
            .iter()
            .map(|r| {
                lab.metrics(r)
                    .counter("splitway_denied_total", &[("reason", "loop")])
            })
            .sum();
        (n >= 1.0).then_some(n)
    });
    assert_eq!(denied, Some(1.0), "one refusal ends the loop");
    // The refusal resets its way back to the client.
    let mut buf = [0u8; 1];
    let r = stream.read(&mut buf);
    assert!(
        matches!(&r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "client of the loop: {r:?}"
    );
    let laps: f64 = ["ra", "rb"]
        .iter()
        .map(|r| {
            lab.metrics(r)
                .counter("splitway_connections_accepted_total", &[("mode", "tproxy")])
        })
        .sum();
    assert!(
        (60.0..=64.0).contains(&laps),
        "{laps} looping connections accepted; a TTL of 64 allows 63"
    );
    assert_healthy(&lab, &["ra", "rb"], &server, LAST_RELAY_V4);
}

#[test]
fn near_the_open_file_limit_new_connections_are_shed_and_open_ones_go_on() {
    if !netns_usable() {
        return;
    }
    let _heavy = heavy_lock();
    let mut lab = Lab::chain(&["rc"]);
    let mut configs = lab.default_configs(&[SERVER_PORT, FLOOD_PORT], false);
    // 300 descriptors: 150 set aside, room for 75 split connections.
    configs[0].nofile = Some(300);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_addr());

    // A transfer in flight across the flood.
    let mut payload = vec![0u8; 8 * MIB as usize];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut payload);
    let expected: [u8; 32] = sha2::Sha256::digest(&payload).into();
    let mut inflight = connect_in(&lab.client, server_addr()).expect("connect");
    let (mut at_server, _) = server.accept(Duration::from_secs(20));
    let receiver = std::thread::spawn(move || recv_all(&mut at_server).expect("server receive"));
    let (before, after) = payload.split_at(MIB as usize);
    inflight.write_all(before).expect("first MiB");

    // Idle connections until the relay sheds: each takes 2 descriptors.
    let flood_addr = sock(&format!("{SERVER_V4}:{FLOOD_PORT}"));
    let flood_server = TestServer::bind(&lab.server, flood_addr);
    let holder = flood_server.serve_forever(|mut s| {
        let _ = read_until_end(&mut s);
    });
    let mut held = Vec::new();
    let mut shed = 0;
    for _ in 0..120 {
        // Admitted connections stay open and idle; shed ones are reset at
        // once (at the write, or the read after it).
        let outcome = connect_in(&lab.client, flood_addr).and_then(|mut s| {
            s.write_all(b"x")?;
            s.set_read_timeout(Some(Duration::from_millis(100)))?;
            match s.read(&mut [0u8; 1]) {
                Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Ok(s)
                }
                Err(e) => Err(e),
                Ok(_) => panic!("the server sends nothing"),
            }
        });
        match outcome {
            Ok(s) => held.push(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::BrokenPipe
                ) =>
            {
                shed += 1
            }
            Err(e) => panic!("flood connection: {e}"),
        }
    }
    assert!(shed >= 40, "only {shed} of 120 connections shed");
    assert!(
        (60..=80).contains(&held.len()),
        "{} connections admitted under a cap of about 75",
        held.len()
    );
    let m = lab.metrics("rc");
    assert!(m.counter("splitway_denied_total", &[("reason", "descriptors")]) >= shed as f64);

    // The transfer in flight finishes intact.
    inflight
        .write_all(after)
        .expect("the rest, after the flood");
    inflight.shutdown(Shutdown::Write).expect("shutdown");
    let received = receiver.join().expect("receiver");
    assert_eq!(
        received.len,
        payload.len() as u64,
        "bytes of the transfer in flight"
    );
    assert_eq!(
        received.sha256, expected,
        "sha256 of the transfer in flight"
    );

    drop(held);
    drop(holder);
    assert_healthy(&lab, &["rc"], &server, LAST_RELAY_V4);
}

/// A config where rc would refuse the client (`allow_clients`) and starts
/// legs at the SYN (`accel`).
fn refusing_lab(accel: impl FnOnce(&mut RawAccel)) -> (Lab, TestServer) {
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].listeners[0].allow_clients = vec!["10.0.99.0/24".into()];
    // No pool and no window probe: their legs would be accepted by rs
    // whatever the client did.
    configs[0].accel(accel).accel(|a| {
        a.pool = Some(false);
        a.learned_window = Some(false);
    });
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_addr());
    (lab, server)
}

fn assert_refused_without_dialing(lab: &Lab, server: &TestServer, outcome: (&str, &str)) {
    for _ in 0..3 {
        // Strict mode answers the SYN itself (refused); otherwise accept
        // resets the connection.
        match connect_in(&lab.client, server_addr()) {
            Ok(mut s) => {
                expect_reset(&mut s, "refused transparent client");
            }
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                ),
                "refused transparent client: {e}"
            ),
        }
    }
    lab.wait_counter(
        "rc",
        outcome.0,
        &[("outcome", outcome.1)],
        3.0,
        Deadline::after(Duration::from_secs(10)),
    );
    // Had a leg been started, rs would have accepted it by now: the SYN's
    // leg starts before the client even gets the reset.
    assert_eq!(
        lab.metrics("rs")
            .counter("splitway_connections_accepted_total", &[("mode", "peer")]),
        0.0,
        "rs accepted a leg for a refused client"
    );
    server.assert_no_pending_connection();
}

#[test]
fn a_refused_clients_syn_dials_nothing_with_early_syn() {
    if !netns_usable() {
        return;
    }
    let (lab, server) = refusing_lab(|a| a.early_syn = Some(true));
    let status = admin_status(lab.rc()).expect("status");
    assert!(status.early_syn.is_some(), "detector attached: {status:?}");
    assert_refused_without_dialing(&lab, &server, ("splitway_early_syn_total", "denied"));
}

#[test]
fn a_refused_clients_syn_dials_nothing_in_strict_mode() {
    if !netns_usable() {
        return;
    }
    let (lab, server) = refusing_lab(|a| a.strict = Some(true));
    assert_refused_without_dialing(&lab, &server, ("splitway_strict_syn_total", "denied"));
}
