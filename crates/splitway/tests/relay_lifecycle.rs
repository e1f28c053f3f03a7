//! What a relay leaves behind and applies to its sockets: interception rules
//! removed on exit, per-leg congestion control, idle timeout.

mod support;

use std::time::{Duration, Instant};

use splitway_sys::netns::Netns;
use support::*;

/// What interception installs in a namespace, as text: the nft ruleset,
/// the policy routing rules and the routes of tables other than main and
/// local (those two change by themselves, e.g. when IPv6 link-local
/// addresses finish DAD).
fn interception_state(ns: &Netns) -> String {
    let mut state = String::new();
    for (prog, args, keep) in [
        ("nft", &["list", "ruleset"][..], None),
        ("ip", &["-4", "rule", "show"][..], None),
        ("ip", &["-6", "rule", "show"][..], None),
        (
            "ip",
            &["-4", "route", "show", "table", "all"][..],
            Some("table "),
        ),
        (
            "ip",
            &["-6", "route", "show", "table", "all"][..],
            Some("table "),
        ),
    ] {
        let out = output(ns.command(prog).args(args));
        assert!(out.status.success(), "{prog} {args:?} failed");
        state.push_str(&format!("$ {prog} {}\n", args.join(" ")));
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let custom_table = |marker: &str| {
                line.contains(marker)
                    && !line.contains("table local")
                    && !line.contains("table main")
            };
            if keep.is_none_or(custom_table) {
                state.push_str(line);
                state.push('\n');
            }
        }
    }
    state
}

#[test]
fn intercept_rules_are_removed_on_sigterm() {
    require_netns!();
    let mut lab = Lab::two_relays();
    let before = interception_state(lab.rc());
    let configs = lab.default_configs(&[SERVER_PORT], true);
    lab.start_relays(&configs);
    let during = interception_state(lab.rc());
    let expected = [
        ("tproxy ip to", 1),
        ("tproxy ip6 to", 1),
        ("fwmark", 2),                     // one IPv4 and one IPv6 rule
        ("local default dev lo table", 2), // one IPv4 and one IPv6 route
    ];
    for (installed, count) in expected {
        assert_eq!(
            during.matches(installed).count(),
            count,
            "rc should have installed {count} × {installed:?}:\n{during}"
        );
    }

    // Interception works while it is installed.
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 1024, LAST_RELAY_V4);

    let status = lab.stop_relay("rc");
    assert!(
        status.is_some_and(|s| s.success()),
        "rc should exit cleanly on SIGTERM, got {status:?}"
    );
    // Its last log line says why it stopped.
    let log = lab.relay_stderr("rc");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("relay stopped after SIGTERM: every open connection finished"),
        "last line: {last}\n{log}"
    );
    let after = interception_state(lab.rc());
    assert_eq!(
        before, after,
        "rc left interception state behind after SIGTERM"
    );
}

/// Text of `ss -tin` for established sockets matching `filter`.
/// The next relay dies and its host drops every new SYN to it (a dead
/// peer, not a refusing one): the entry relay's pool refills hang in
/// connect. SIGTERM still ends the relay at once instead of after the
/// connect timeout (it waited ≥ 7 s, longer than `stop_relay`'s 5 s).
#[test]
fn sigterm_is_not_held_by_pool_dials_to_a_dead_peer() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let pool_level = |lab: &Lab| {
        admin_status(lab.relay_ns("rc"))
            .ok()
            .and_then(|st| Some((st.peers.first()?.pool.as_ref()?.level, st)))
    };
    wait_until(deadline, "rc's pool filled", || {
        pool_level(&lab).and_then(|(level, _)| (level > 0).then_some(()))
    });
    let port = PEER_PORT.to_string();
    for args in [
        vec!["add", "table", "inet", "swdead"],
        vec![
            "add",
            "chain",
            "inet",
            "swdead",
            "input",
            "{ type filter hook input priority 0; }",
        ],
        vec![
            "add",
            "rule",
            "inet",
            "swdead",
            "input",
            "tcp",
            "dport",
            &port,
            "tcp",
            "flags",
            "&",
            "(syn|ack)",
            "==",
            "syn",
            "drop",
        ],
    ] {
        let ok = lab
            .relay_ns("rs")
            .command("nft")
            .args(&args)
            .status()
            .expect("run nft");
        assert!(ok.success(), "nft {args:?}");
    }
    lab.kill_relay("rs");
    // The pooled legs die with rs; the refills' SYNs go unanswered.
    wait_until(deadline, "rc's pool emptied and refilling", || {
        pool_level(&lab).and_then(|(level, _)| (level == 0).then_some(()))
    });
    let started = Instant::now();
    let status = lab.stop_relay("rc");
    let took = started.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "rc did not exit on SIGTERM within 5 s ({status:?})"
    );
    assert!(took < Duration::from_secs(3), "rc took {took:?} to exit");
}

fn ss_info(ns: &Netns, filter: &str) -> String {
    let out = output(
        ns.command("ss")
            .args(["-Htin", "state", "established"])
            .arg(filter),
    );
    assert!(out.status.success(), "ss failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Congestion control algorithm names shown by `ss -i`, one per socket.
fn congestion_algorithms(ss_text: &str) -> Vec<String> {
    const KNOWN: [&str; 3] = ["cubic", "reno", "bbr"];
    ss_text
        .split_whitespace()
        .filter(|word| KNOWN.contains(word))
        .map(str::to_owned)
        .collect()
}

#[test]
fn congestion_control_is_applied_per_leg() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    // The namespaces' default is bbr; ask for two other algorithms so that
    // only the relay's setsockopt can explain what ss shows.
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].peers[0].congestion = Some("cubic".into());
    configs[0].tuning(Leg::Client, |t| t.congestion = Some("reno".into()));
    configs[1]
        .tuning(Leg::Direct, |t| t.congestion = Some("reno".into()))
        .tuning(Leg::Upstream, |t| t.congestion = Some("reno".into()));
    lab.start_relays(&configs);
    let default_cc = output(
        lab.rc()
            .command("sysctl")
            .args(["-n", "net.ipv4.tcp_congestion_control"]),
    );
    let default_cc = String::from_utf8_lossy(&default_cc.stdout)
        .trim()
        .to_owned();
    assert!(
        default_cc != "cubic" && default_cc != "reno",
        "the test needs a namespace default other than cubic and reno, got {default_cc}"
    );

    let server = TestServer::bind(&lab.server, server_v4());
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    send_pattern(&mut client, 64 * 1024, 1).expect("client send");
    let peer_legs = ss_info(lab.rc(), &format!("dport = :{PEER_PORT}"));
    let direct_legs = ss_info(lab.rs(), &format!("dst {SERVER_V4}"));
    // rs's end of the relay leg sends the downloads: `[upstream]` there.
    let upstream_legs = ss_info(lab.rs(), &format!("sport = :{PEER_PORT}"));
    // TPROXY-accepted sockets carry the server's address as their own.
    let client_legs = ss_info(lab.rc(), &format!("src {SERVER_V4}"));
    let client_ccs = congestion_algorithms(&client_legs);
    assert!(
        !client_ccs.is_empty() && client_ccs.iter().all(|cc| cc == "reno"),
        "rc's accepted client sockets should use reno:\n{client_legs}"
    );
    let peer_ccs = congestion_algorithms(&peer_legs);
    let direct_ccs = congestion_algorithms(&direct_legs);
    assert!(
        !peer_ccs.is_empty() && peer_ccs.iter().all(|cc| cc == "cubic"),
        "rc → rs legs should use cubic:\n{peer_legs}"
    );
    assert!(
        !direct_ccs.is_empty() && direct_ccs.iter().all(|cc| cc == "reno"),
        "rs → server legs should use reno:\n{direct_legs}"
    );
    let upstream_ccs = congestion_algorithms(&upstream_legs);
    assert!(
        !upstream_ccs.is_empty() && upstream_ccs.iter().all(|cc| cc == "reno"),
        "rs's accepted legs from rc should use reno ([upstream]):\n{upstream_legs}"
    );
    drop(client);
    let (received, _) = read_until_end(&mut conn);
    assert_eq!(received, 64 * 1024);
    deadline.remaining("congestion test");
    lab.assert_relays_alive();
}

#[test]
fn idle_connections_are_closed() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].timeouts(|t| t.idle = Some("1s".into()));
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let started = Instant::now();
    // Neither side sends: rc must close both ends by itself.
    let (client_bytes, _client_end) = read_until_end(&mut client);
    let (server_bytes, _server_end) = read_until_end(&mut conn);
    let waited = started.elapsed();
    assert_eq!((client_bytes, server_bytes), (0, 0));
    assert!(
        waited >= Duration::from_millis(900),
        "closed after {waited:?}, before the 1 s idle timeout"
    );
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "idle_timeout")],
        1.0,
        deadline,
    );
    lab.assert_relays_alive();
}

/// Established relay legs in `ns` whose `side` (`dport` on the dialing
/// end, `sport` on the accepting end) is the peer port.
fn relay_legs(ns: &Netns, side: &str) -> usize {
    ss_info(ns, &format!("( {side} = :{PEER_PORT} )"))
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit() || c == '['))
        .count()
}

/// The path between rc and rs dies silently (rs drops every relay-leg
/// packet both ways, no reset): keepalive ends the idle pooled legs on both
/// ends within about 11 s (5 s idle, then 3 probes 2 s apart), where the
/// 30 s keepalive took over a minute and the kernel's default hours. Once the path is back, the next connection gets a fresh leg:
/// the pool drops the dead ones before handing one out.
#[test]
fn a_dead_path_ends_idle_relay_legs_within_the_bound() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], true);
    lab.start_relays(&configs);
    wait_until(deadline, "rc's pool filled", || {
        let st = admin_status(lab.relay_ns("rc")).ok()?;
        (st.peers.first()?.pool.as_ref()?.level > 0).then_some(())
    });
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 64 * 1024, LAST_RELAY_V4);
    assert!(relay_legs(lab.relay_ns("rc"), "dport") > 0);
    assert!(relay_legs(lab.relay_ns("rs"), "sport") > 0);

    // Counted from before the cut: the pool's sweep (every second) may
    // drop the dead legs before the path heals, or `take` at the next
    // connection; either way each is counted once.
    let dead_before = lab
        .metrics("rc")
        .counter("splitway_pool_events_total", &[("event", "dead")]);
    let nft = cut_relay_legs(&lab);
    let cut = Instant::now();
    wait_until(deadline, "the dead legs ended on both ends", || {
        (relay_legs(lab.relay_ns("rc"), "dport") == 0
            && relay_legs(lab.relay_ns("rs"), "sport") == 0)
            .then_some(())
    });
    let took = cut.elapsed();
    println!("dead relay legs ended {took:?} after the cut");
    assert!(
        took < Duration::from_secs(16),
        "dead legs lived {took:?} after the path died"
    );

    nft(&["delete", "table", "inet", "swcut"]);
    transfer_client_to_server(&lab.client, &server, server_v4(), 64 * 1024, LAST_RELAY_V4);
    let dead_after = lab
        .metrics("rc")
        .counter("splitway_pool_events_total", &[("event", "dead")]);
    assert!(
        dead_after > dead_before,
        "the pool never counted its dead legs ({dead_before} -> {dead_after}), yet the transfer after the cut went through"
    );
}

/// Makes rs drop every relay-leg packet both ways (no reset: a path that
/// died silently); returns the `nft` runner, to heal it with
/// `nft(&["delete", "table", "inet", "swcut"])`.
fn cut_relay_legs(lab: &Lab) -> impl Fn(&[&str]) + '_ {
    let port = PEER_PORT.to_string();
    let nft = move |args: &[&str]| {
        let ok = lab
            .relay_ns("rs")
            .command("nft")
            .args(args)
            .status()
            .expect("run nft");
        assert!(ok.success(), "nft {args:?}");
    };
    nft(&["add", "table", "inet", "swcut"]);
    for (chain, hook, match_port) in [("in", "input", "dport"), ("out", "output", "sport")] {
        nft(&[
            "add",
            "chain",
            "inet",
            "swcut",
            chain,
            &format!("{{ type filter hook {hook} priority -300; }}"),
        ]);
        nft(&[
            "add", "rule", "inet", "swcut", chain, "tcp", match_port, &port, "drop",
        ]);
    }
    nft
}

/// The path dies under traffic: keepalive cannot help a leg with data in
/// flight (the kernel retransmits it for about 15 minutes), the default
/// TCP_USER_TIMEOUT of relay legs (10 s) ends it, and the client's
/// connection fails instead of hanging.
#[test]
fn a_dead_path_ends_a_busy_relay_leg_within_the_user_timeout() {
    use std::io::{Read, Write};
    require_netns!();
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], true);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let mut conn = connect_in(&lab.client, server_v4()).expect("connect through rc and rs");
    let (mut served, _) = server.accept(Duration::from_secs(20));
    let first = vec![7u8; 64 * 1024];
    conn.write_all(&first).expect("write before the cut");
    let mut got = vec![0u8; first.len()];
    served.read_exact(&mut got).expect("the server reads it");
    assert_eq!(got, first);

    let _nft = cut_relay_legs(&lab);
    let cut = Instant::now();
    conn.set_write_timeout(Some(Duration::from_secs(60)))
        .expect("write timeout");
    let chunk = vec![0u8; 16 * 1024];
    let error = loop {
        if let Err(e) = conn.write_all(&chunk) {
            break e;
        }
    };
    let took = cut.elapsed();
    println!("the client's connection failed {took:?} after the cut: {error}");
    assert!(
        !matches!(
            error.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "the client's writes blocked until the test's timeout: {error}"
    );
    assert!(
        took < Duration::from_secs(16),
        "a busy relay leg lived {took:?} after the path died"
    );
}

/// SIGTERM to rs while a connection through it is open: rs drains, and
/// closes the idle legs rc pooled to it at once (they used to wait for a
/// header until their own timeout, carrying new connections into the
/// drain). A new rs started during the drain runs (its admin API waits for
/// the old one's address instead of failing with EADDRINUSE), new
/// connections reach it over fresh legs, the open one finishes on the old
/// rs, and the old rs's last log line says it stopped after SIGTERM.
#[test]
fn a_draining_relay_closes_idle_pooled_legs_and_a_restart_runs_beside_it() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], true);
    lab.start_relays(&configs);
    let pool_level = |lab: &Lab| {
        admin_status(lab.relay_ns("rc"))
            .ok()
            .and_then(|st| Some(st.peers.first()?.pool.as_ref()?.level))
    };
    wait_until(deadline, "rc's pool filled", || {
        pool_level(&lab).filter(|&l| l > 0)
    });
    let server = TestServer::bind(&lab.server, server_v4());
    let mut open = connect_in(&lab.client, server_v4()).expect("connect through rc and rs");
    let (mut served, _) = server.accept(Duration::from_secs(20));
    let before = relay_legs(lab.relay_ns("rs"), "sport");
    assert!(
        before > 1,
        "rs holds the open connection's leg and pooled ones: {before}"
    );

    lab.signal_relay("rs", "TERM");
    let term = Instant::now();
    wait_until(deadline, "rs closed its idle pooled legs", || {
        (relay_legs(lab.relay_ns("rs"), "sport") == 1).then_some(())
    });
    let took = term.elapsed();
    println!("draining rs closed {} idle legs in {took:?}", before - 1);
    assert!(
        took < Duration::from_secs(3),
        "idle legs lived {took:?} into the drain"
    );

    // A restart while the old rs drains: it starts, and carries new
    // connections over fresh legs (rc's pool drops the closed ones).
    lab.start_relay_beside("rs", &configs[1]);
    transfer_client_to_server(&lab.client, &server, server_v4(), 256 * 1024, LAST_RELAY_V4);

    // The open connection still runs on the old rs, both ways.
    let ping = b"still carried by the draining relay";
    std::io::Write::write_all(&mut open, ping).expect("client writes");
    let mut got = vec![0u8; ping.len()];
    std::io::Read::read_exact(&mut served, &mut got).expect("server reads");
    assert_eq!(&got, ping);
    std::io::Write::write_all(&mut served, ping).expect("server writes");
    std::io::Read::read_exact(&mut open, &mut got).expect("client reads");
    assert_eq!(&got, ping);
    drop(open);
    drop(served);
    let exit = lab.wait_relay_exit("rs", deadline);
    assert!(exit.success(), "the old rs exited with {exit}");
    let old_log = lab.relay_stderr("rs");
    let last = old_log.lines().last().unwrap_or_default();
    assert!(
        last.contains("relay stopped after SIGTERM: every open connection finished"),
        "{last}"
    );
    // Its address free, the new rs's admin API answers.
    wait_until(deadline, "the new rs's admin API answers", || {
        curl_admin(lab.relay_ns("rs"), "/status").ok()
    });
    transfer_client_to_server(&lab.client, &server, server_v4(), 256 * 1024, LAST_RELAY_V4);
}
