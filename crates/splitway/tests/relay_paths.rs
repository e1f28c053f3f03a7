//! Path choice among a route's candidates (`via = ["rs1", "rs2"]`), with
//! real relays in namespaces:
//!
//! ```text
//! client — rc — rs1 — rs2 — server
//! ```
//!
//! rc lists both rs1 and rs2 for the server's subnet; it reaches rs2
//! through rs1's namespace as a plain router, so killing the rs1 process
//! leaves the rs2 path intact. rs1 and rs2 both go direct, so the server
//! sees which path a connection took: rs1's address on the rs1—rs2 link,
//! or rs2's on the server link.

mod support;

use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use splitway_lab::emu::DirectionParams;
use support::*;

/// The server sees this source for the rs1 path (rs1 dials direct, routed
/// through rs2's namespace).
fn via_rs1() -> SocketAddr {
    sock(&format!("{}:0", link_v4(2, 3, 1)))
}

fn lab() -> Lab {
    let mut lab = Lab::chain(&["rc", "rs1", "rs2"]);
    let ip = |ns: &splitway_sys::netns::Netns, args: &[&str]| {
        ns.ip(args)
            .unwrap_or_else(|e| panic!("ip {args:?} in {}: {e}", ns.name()))
    };
    // rc reaches rs2's peer listener through rs1's namespace, and rs2
    // answers it the same way.
    ip(
        &lab.relays[0],
        &["route", "add", "10.0.23.0/24", "via", &link_v4(1, 3, 2)],
    );
    ip(
        &lab.relays[2],
        &["route", "add", "10.0.12.0/24", "via", &link_v4(2, 3, 1)],
    );
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // rc: both relays are candidates for the server's subnet.
    configs[0] = rc_config(&lab, via_list(&["rs1", "rs2"]));
    // Path choice measured alone: window probes (learned windows) put 4 MiB
    // bursts on the candidates' emulated links at start, and their queueing
    // moved the choice in two runs out of three (an open interaction).
    configs[0].accel(|a| a.learned_window = Some(false));
    // rs1 dials the server itself (its kernel routes through rs2).
    let rs1 = &mut configs[1];
    rs1.routes.clear();
    rs1.peers.clear();
    rs1.route("0.0.0.0/0", "direct");
    lab.start_relays(&configs);
    lab
}

/// rc: a SOCKS5 entry, both relays as peers, the server's subnet routed
/// `via` (a string or a list).
fn rc_config(lab: &Lab, via: RawVia) -> RelayConfig {
    let mut rc = RelayConfig::new("rc");
    rc.listen(ListenMode::Socks5, &format!("{ENTRY_V4}:{SOCKS_PORT}"));
    rc.listeners[0].allow_clients = vec!["10.0.1.0/24".into()];
    rc.peer("rs1", &lab.peer_addr(1));
    rc.peer("rs2", &lab.peer_addr(2));
    rc.raw_route(route_via("10.0.3.0/24", via));
    rc
}

/// One SOCKS5 connection to the server through rc carrying `len` bytes
/// each way, sha256-checked at both ends. `None` when rc refused it (the
/// path failed during setup); otherwise the address the server saw.
fn transfer(lab: &Lab, server: &TestServer, len: u64, seed: u64) -> Option<SocketAddr> {
    let (code, mut stream) = socks5(&lab.client, Target::Ip(server.addr));
    if code != 0 {
        return None;
    }
    let client = std::thread::spawn(move || {
        let sent = send_pattern(&mut stream, len, seed).expect("client send");
        stream.shutdown(Shutdown::Write).expect("client shutdown");
        let got = recv_all(&mut stream).expect("client receive");
        (sent, got)
    });
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    let at_server = recv_all(&mut conn).expect("server receive");
    let from_server = send_pattern(&mut conn, len, seed + 1).expect("server send");
    conn.shutdown(Shutdown::Write).expect("server shutdown");
    let (sent, got) = client.join().expect("client thread");
    assert_eq!(at_server, sent, "client→server through {peer}");
    assert_eq!(got, from_server, "server→client through {peer}");
    Some(peer)
}

fn path_of(peer: SocketAddr) -> &'static str {
    if peer.ip() == via_rs1().ip() {
        "rs1"
    } else if peer.ip().to_string() == LAST_RELAY_V4 {
        "rs2"
    } else {
        panic!("the server saw {peer}, neither relay's address")
    }
}

const LEN: u64 = 256 * 1024 + 17;

/// Connections take rs1 while both peers are up (equal legs: the first
/// candidate is kept); rs1 is killed, and the first connection to get
/// through after it must have taken rs2 within 3 s, and the next ones stay
/// there, every byte intact. `path` names the relay the server saw.
fn fail_over_from_rs1(
    lab: &mut Lab,
    server: &TestServer,
    deadline: Deadline,
    path: impl Fn(SocketAddr) -> &'static str,
) {
    for seed in 0..3 {
        let peer = transfer(lab, server, LEN, seed).expect("rc refused with every peer up");
        assert_eq!(path(peer), "rs1", "connection {seed}");
    }
    lab.kill_relay("rs1");
    let killed = Instant::now();
    let mut refused = 0;
    let moved = loop {
        deadline.remaining("waiting for a connection through rs2");
        if let Some(peer) = transfer(lab, server, LEN, 100 + refused) {
            break (peer, killed.elapsed());
        }
        refused += 1;
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "[relay_paths] first connection through {} {:?} after the kill, {refused} refused before",
        moved.0, moved.1
    );
    assert_eq!(path(moved.0), "rs2");
    assert!(
        moved.1 <= Duration::from_secs(3),
        "moved after {:?}",
        moved.1
    );
    for seed in 200..203 {
        let peer = transfer(lab, server, LEN, seed).expect("rc refused with rs2 up");
        assert_eq!(path(peer), "rs2", "connection {seed}");
    }
}
/// Short transfers while timing a switch: each connection is a new chance
/// to move.
const SMALL: u64 = 4 * 1024 + 3;

#[test]
fn killing_the_chosen_peer_moves_new_connections_within_3s() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = lab();
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));

    fail_over_from_rs1(&mut lab, &server, deadline, path_of);
    // What the operator sees: rs1 down, rs2 chosen and measured.
    let shown = lab.ctl("rc", &["routes"]);
    let table = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "ctl routes: {shown:?}");
    let row = |name: &str| {
        table
            .lines()
            .skip_while(|l| !l.starts_with("DESTINATION  CANDIDATE"))
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{table}"))
            .to_owned()
    };
    // The routing table shows where new connections go now.
    let via = table
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(1));
    assert_eq!(via, Some("rs2"), "{table}");
    assert_eq!(
        row("rs1").split_whitespace().nth(2),
        Some("down"),
        "{table}"
    );
    assert_eq!(row("*rs2").split_whitespace().nth(2), Some("up"), "{table}");
    let json = lab.ctl("rc", &["routes", "--json"]);
    let doc: splitway_api::RoutesReport =
        typed_answer(&String::from_utf8_lossy(&json.stdout)).expect("ctl routes --json");
    let route = &doc.paths.as_ref().expect("the relay has /routes").routes[0];
    assert_eq!(route.chosen, "rs2", "{doc:?}");
    assert_eq!(route.flips, 1, "{doc:?}");
    assert_eq!(route.candidates[0].state, "down", "{doc:?}");
    let rtt = route.candidates[1].leg_rtt_ms.expect("rs2 leg measured");
    assert!(rtt > 0.0 && rtt < 100.0, "rs2 leg rtt {rtt} ms on a veth");
    eprintln!("[relay_paths] ctl routes after the failover:\n{table}");

    let m = lab.metrics("rc");
    assert_eq!(
        m.counter("splitway_path_flips_total", &[("cause", "failure")]),
        1.0
    );
    assert_eq!(
        m.counter("splitway_path_flips_total", &[("cause", "better")]),
        0.0
    );
    assert_eq!(
        m.counter("splitway_path_choices_total", &[("candidate", "rs2")]),
        4.0
    );
}

#[test]
fn stable_paths_do_not_flip_and_probes_stay_under_one_per_second() {
    require_netns!();
    let _heavy = heavy_lock();
    let started = Instant::now();
    let mut lab = lab();
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let answered = |lab: &Lab, relay: &str| {
        lab.metrics(relay)
            .counter("splitway_path_probes_answered_total", &[])
    };
    // Both peers are being probed (an answer reached rc from each).
    for peer in ["rs1", "rs2"] {
        lab.wait_counter(
            "rc",
            "splitway_path_probes_sent_total",
            &[("peer", peer), ("outcome", "ok")],
            1.0,
            Deadline::after(Duration::from_secs(10)),
        );
    }
    let before = [answered(&lab, "rs1"), answered(&lab, "rs2")];
    let window_start = Instant::now();
    let mut seed = 0;
    while window_start.elapsed() < Duration::from_secs(8) {
        let peer = transfer(&lab, &server, LEN, seed).expect("rc refused with every peer up");
        assert_eq!(path_of(peer), "rs1", "connection {seed}");
        seed += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = [answered(&lab, "rs1"), answered(&lab, "rs2")];
    let window = window_start.elapsed().as_secs_f64();
    let since_start = started.elapsed().as_secs_f64();
    for (k, relay) in ["rs1", "rs2"].iter().enumerate() {
        let in_window = after[k] - before[k];
        eprintln!(
            "[relay_paths] {relay} answered {in_window} probes in {window:.1} s, {} in {since_start:.1} s since rc started",
            after[k]
        );
        // At most one per second (plus the one in flight at each edge),
        // and probing did go on.
        assert!(
            in_window <= window.floor() + 1.0,
            "{relay}: {in_window} probes in {window:.1} s"
        );
        assert!(
            after[k] <= since_start.floor() + 1.0,
            "{relay}: {} probes in {since_start:.1} s",
            after[k]
        );
        assert!(
            in_window >= (window / 2.0).floor(),
            "{relay}: only {in_window} probes in {window:.1} s"
        );
    }
    let m = lab.metrics("rc");
    assert_eq!(m.counter("splitway_path_flips_total", &[]), 0.0);
    assert_eq!(
        m.counter("splitway_path_choices_total", &[("candidate", "rs1")]),
        seed as f64
    );
    eprintln!("[relay_paths] {seed} connections, no flip");
    lab.assert_relays_alive();
}

/// A peer that goes silent (its packets dropped: no reset, no FIN, pooled
/// legs look alive) is found out by its probes going unanswered.
#[test]
fn a_silent_peer_is_marked_down_by_its_probes_within_3s() {
    require_netns!();
    let _heavy = heavy_lock();
    let lab = lab();
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let peer = transfer(&lab, &server, LEN, 1).expect("rc refused with every peer up");
    assert_eq!(path_of(peer), "rs1");

    let port = PEER_PORT.to_string();
    let dropped = output(
        lab.relays[1]
            .command("iptables")
            .args(["-A", "INPUT", "-p", "tcp", "--dport", &port, "-j", "DROP"]),
    );
    assert!(dropped.status.success(), "iptables: {dropped:?}");
    let silenced = Instant::now();
    let rs1_state = || {
        let doc = admin_routes(lab.rc()).expect("GET /routes");
        Some(doc.routes[0].candidates[0].state.clone())
    };
    let down_after = wait_until(
        Deadline::after(Duration::from_secs(10)),
        "rs1 marked down",
        || (rs1_state().as_deref() == Some("down")).then(|| silenced.elapsed()),
    );
    eprintln!("[relay_paths] silent rs1 marked down {down_after:?} after its packets were dropped");
    assert!(down_after <= Duration::from_secs(3), "{down_after:?}");
    // The next connection goes the other way, every byte intact.
    let peer = transfer(&lab, &server, LEN, 2).expect("rc refused with rs2 up");
    assert_eq!(path_of(peer), "rs2");
    let m = lab.metrics("rc");
    assert!(
        m.counter(
            "splitway_path_probes_sent_total",
            &[("peer", "rs1"), ("outcome", "failed")]
        ) >= 1.0
    );
    assert_eq!(
        m.counter("splitway_path_flips_total", &[("cause", "failure")]),
        1.0
    );
}

/// The chosen path degrades by +100 ms (emulated RTT 10 → 110 ms, the
/// other candidate at 30 ms): new connections move within 3 s. Going back
/// to 10 ms right after does not move them back: the choice is held.
#[test]
fn a_100ms_degradation_moves_new_connections_and_the_choice_is_held() {
    require_netns!();
    let _heavy = heavy_lock();
    let mut lab = Lab::chain(&["rc", "rs1", "rs2"]);
    // rc reaches each relay over its own emulated link; rs1 still reaches
    // the server through rs2's namespace over the veths.
    let to_rs1 = emulated_link(
        &lab.relays[0],
        &lab.relays[1],
        98,
        Duration::from_millis(10),
    );
    let to_rs2 = emulated_link(
        &lab.relays[0],
        &lab.relays[2],
        99,
        Duration::from_millis(30),
    );
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    let mut rc = RelayConfig::new("rc");
    rc.listen(ListenMode::Socks5, &format!("{ENTRY_V4}:{SOCKS_PORT}"));
    rc.listeners[0].allow_clients = vec!["10.0.1.0/24".into()];
    rc.peer("rs1", &format!("10.0.98.2:{PEER_PORT}"));
    rc.peer("rs2", &format!("10.0.99.2:{PEER_PORT}"));
    rc.raw_route(route_via("10.0.3.0/24", via_list(&["rs1", "rs2"])));
    configs[0] = rc;
    // Path choice measured alone: window probes (learned windows) put 4 MiB
    // bursts on the candidates' emulated links at start, and their queueing
    // moved the choice in two runs out of three (an open interaction).
    configs[0].accel(|a| a.learned_window = Some(false));
    configs[1].routes.clear();
    configs[1].peers.clear();
    configs[1].route("0.0.0.0/0", "direct");
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let leg_ms = |lab: &Lab, k: usize| {
        let doc = admin_routes(lab.rc()).expect("GET /routes");
        doc.routes[0].candidates[k].leg_rtt_ms
    };
    // Both legs measured by probes before we start.
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "both legs measured",
        || (leg_ms(&lab, 0).is_some() && leg_ms(&lab, 1).is_some()).then_some(()),
    );
    for seed in 0..3 {
        let peer = transfer(&lab, &server, LEN, seed).expect("rc refused with every peer up");
        assert_eq!(path_of(peer), "rs1", "connection {seed}");
    }
    eprintln!(
        "[relay_paths] legs before: rs1 {:?} ms, rs2 {:?} ms",
        leg_ms(&lab, 0),
        leg_ms(&lab, 1)
    );

    set_rtt(&to_rs1, Duration::from_millis(110));
    let degraded = Instant::now();
    let mut seed = 10;
    let switch = loop {
        let started = degraded.elapsed();
        let peer = transfer(&lab, &server, SMALL, seed).expect("rc refused while degraded");
        seed += 1;
        if path_of(peer) == "rs2" {
            break started;
        }
        assert!(
            started < Duration::from_secs(10),
            "still on rs1 {started:?} after the degradation"
        );
    };
    eprintln!(
        "[relay_paths] +100 ms on rs1: first connection through rs2 started {switch:?} after; legs rs1 {:?} ms, rs2 {:?} ms",
        leg_ms(&lab, 0),
        leg_ms(&lab, 1)
    );
    assert!(
        switch <= Duration::from_secs(3),
        "switched after {switch:?}"
    );

    // rs1 recovers and is now better again, but the last change is recent.
    set_rtt(&to_rs1, Duration::from_millis(10));
    let recovered = Instant::now();
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "rs1's recovery measured",
        || leg_ms(&lab, 0).is_some_and(|ms| ms < 25.0).then_some(()),
    );
    while recovered.elapsed() < Duration::from_secs(5) {
        let peer = transfer(&lab, &server, LEN, seed).expect("rc refused after recovery");
        seed += 1;
        assert_eq!(path_of(peer), "rs2", "moved back within the hold");
    }
    let m = lab.metrics("rc");
    assert_eq!(
        m.counter("splitway_path_flips_total", &[("cause", "better")]),
        1.0
    );
    assert_eq!(m.counter("splitway_path_flips_total", &[]), 1.0);
    drop((to_rs1, to_rs2));
}

/// A reload applies new candidates to new connections, and probing
/// follows the running config: it stops when no route has a choice left.
#[test]
fn a_reload_changes_candidates_and_probing_follows() {
    require_netns!();
    let _heavy = heavy_lock();
    let mut lab = lab();
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let peer = transfer(&lab, &server, LEN, 1).expect("rc refused with every peer up");
    assert_eq!(path_of(peer), "rs1");
    let route = |lab: &Lab| {
        let doc = admin_routes(lab.rc()).expect("GET /routes");
        doc.routes[0].clone()
    };
    let reload = |lab: &mut Lab, via: RawVia| {
        let cfg = rc_config(lab, via);
        std::fs::write(lab.config_path("rc"), cfg.render(&lab.psk_path)).expect("write config");
        lab.signal_relay("rc", "HUP");
    };

    // New order: rs2 first, so new connections start there.
    reload(&mut lab, via_list(&["rs2", "rs1"]));
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "the reloaded candidates",
        || (route(&lab).candidates[0].name == "rs2").then_some(()),
    );
    let peer = transfer(&lab, &server, LEN, 2).expect("rc refused after the reload");
    assert_eq!(path_of(peer), "rs2");
    assert_eq!(route(&lab).chosen, "rs2");

    // One candidate: nothing to choose, nothing probed.
    reload(&mut lab, RawVia::One("rs1".into()));
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "the single-candidate route",
        || (!route(&lab).probed).then_some(()),
    );
    // A probe started just before the reload may still be answered.
    std::thread::sleep(PROBE_SETTLE);
    let answered = |lab: &Lab| {
        lab.metrics("rs1")
            .counter("splitway_path_probes_answered_total", &[])
            + lab
                .metrics("rs2")
                .counter("splitway_path_probes_answered_total", &[])
    };
    let before = answered(&lab);
    assert!(before > 0.0, "probes were answered before the reload");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        answered(&lab),
        before,
        "probes after the last choice went away"
    );
    let peer = transfer(&lab, &server, LEN, 3).expect("rc refused on a plain route");
    assert_eq!(path_of(peer), "rs1");
}

/// Longer than a probe's timeout: any probe in flight has ended.
const PROBE_SETTLE: Duration = Duration::from_millis(2000);

/// rc with each relay behind its own emulated link (rs1 `rtt1`, rs2
/// `rtt2`), the server's subnet routed `via`; rs1 dials the server itself.
fn emulated_lab(
    rtt1: Duration,
    rtt2: Duration,
    via: RawVia,
) -> (
    Lab,
    splitway_lab::emu::LinkHandle,
    splitway_lab::emu::LinkHandle,
) {
    let mut lab = Lab::chain(&["rc", "rs1", "rs2"]);
    let to_rs1 = emulated_link(&lab.relays[0], &lab.relays[1], 98, rtt1);
    let to_rs2 = emulated_link(&lab.relays[0], &lab.relays[2], 99, rtt2);
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    let mut rc = RelayConfig::new("rc");
    rc.listen(ListenMode::Socks5, &format!("{ENTRY_V4}:{SOCKS_PORT}"));
    rc.listeners[0].allow_clients = vec!["10.0.1.0/24".into()];
    rc.peer("rs1", &format!("10.0.98.2:{PEER_PORT}"));
    rc.peer("rs2", &format!("10.0.99.2:{PEER_PORT}"));
    rc.raw_route(route_via("10.0.3.0/24", via));
    configs[0] = rc;
    // Path choice measured alone: window probes (learned windows) put 4 MiB
    // bursts on the candidates' emulated links at start, and their queueing
    // moved the choice in two runs out of three (an open interaction).
    configs[0].accel(|a| a.learned_window = Some(false));
    configs[1].routes.clear();
    configs[1].peers.clear();
    configs[1].route("0.0.0.0/0", "direct");
    lab.start_relays(&configs);
    // rc's own (direct) packets reach the server through the relays'
    // namespaces as routers; rs2 routes the answers back.
    lab.relays[2]
        .ip(&["route", "add", "10.0.12.0/24", "via", &link_v4(2, 3, 1)])
        .expect("return route for rc's direct legs");
    (lab, to_rs1, to_rs2)
}

/// `transfer`, skipping connections that arrive empty and closed: rc's
/// direct probes (a handshake, closed at once) reach the same server.
fn transfer_past_probes(lab: &Lab, server: &TestServer, len: u64, seed: u64) -> Option<SocketAddr> {
    let (code, mut stream) = socks5(&lab.client, Target::Ip(server.addr));
    if code != 0 {
        return None;
    }
    let client = std::thread::spawn(move || {
        let sent = send_pattern(&mut stream, len, seed).expect("client send");
        stream.shutdown(Shutdown::Write).expect("client shutdown");
        let got = recv_all(&mut stream).expect("client receive");
        (sent, got)
    });
    let (mut conn, peer, at_server) = loop {
        let (mut conn, peer) = server.accept(Duration::from_secs(20));
        let at_server = recv_all(&mut conn).expect("server receive");
        if at_server.len > 0 {
            break (conn, peer, at_server);
        }
    };
    let from_server = send_pattern(&mut conn, len, seed + 1).expect("server send");
    conn.shutdown(Shutdown::Write).expect("server shutdown");
    let (sent, got) = client.join().expect("client thread");
    assert_eq!(at_server, sent, "client→server through {peer}");
    assert_eq!(got, from_server, "server→client through {peer}");
    Some(peer)
}

fn routes_doc(lab: &Lab) -> serde_json::Value {
    serde_json::from_str(&curl_admin(lab.rc(), "/routes").expect("GET /routes"))
        .expect("/routes is JSON")
}

/// The candidate named `name` of rc's first route.
fn candidate(lab: &Lab, name: &str) -> serde_json::Value {
    let doc = routes_doc(lab);
    doc["routes"][0]["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no candidate {name} in {doc}"))
        .clone()
}

#[test]
fn loss_on_the_chosen_leg_moves_new_connections() {
    require_netns!();
    let _heavy = heavy_lock();
    let (lab, to_rs1, to_rs2) = emulated_lab(
        Duration::from_millis(10),
        Duration::from_millis(30),
        via_list(&["rs1", "rs2"]),
    );
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "both legs measured",
        || {
            (candidate(&lab, "rs1")["leg_rtt_ms"].is_number()
                && candidate(&lab, "rs2")["leg_rtt_ms"].is_number())
            .then_some(())
        },
    );
    for seed in 0..3 {
        let peer = transfer(&lab, &server, LEN, seed).expect("rc refused with every peer up");
        assert_eq!(path_of(peer), "rs1", "connection {seed}");
    }
    let clean = candidate(&lab, "rs1")["loss"].as_f64().unwrap_or(0.0);
    assert!(clean < 0.01, "rs1 loss {clean} on a clean link");

    // 5 % loss each way on rc—rs1: at 10 ms it now costs more than rs2's 30.
    let half = Duration::from_millis(5).as_nanos() as u64;
    let lossy = DirectionParams {
        loss: 0.05,
        ..DirectionParams::delay_only(half)
    };
    to_rs1.set_params(lossy, lossy, 4096);
    let lossy_since = Instant::now();
    let mut seed = 10;
    let moved = loop {
        let peer = transfer(&lab, &server, LEN, seed).expect("rc refused on a lossy leg");
        seed += 1;
        if path_of(peer) == "rs2" {
            break lossy_since.elapsed();
        }
        assert!(
            lossy_since.elapsed() < Duration::from_secs(30),
            "still on rs1 30 s into 5 % loss: {}",
            routes_doc(&lab)
        );
    };
    let rs1 = candidate(&lab, "rs1");
    let rs2 = candidate(&lab, "rs2");
    eprintln!("[relay_paths] 5 % loss on rs1: moved after {moved:?}; rs1 {rs1}, rs2 {rs2}");
    let loss = rs1["loss"].as_f64().expect("rs1 loss measured");
    assert!(loss > 0.005, "rs1 loss {loss}");
    // The leg's RTT alone still favours rs1: the loss made the difference.
    assert!(
        rs1["leg_rtt_ms"].as_f64().expect("rs1 RTT") < rs2["leg_rtt_ms"].as_f64().expect("rs2 RTT"),
        "rs1 {rs1}, rs2 {rs2}"
    );
    assert!(
        rs1["estimate_ms"].as_f64().expect("rs1 estimate")
            > rs2["estimate_ms"].as_f64().expect("rs2 estimate"),
        "rs1 {rs1}, rs2 {rs2}"
    );
    // ctl routes shows the loss column.
    let shown = lab.ctl("rc", &["routes"]);
    let table = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success() && table.contains("LOSS"), "{table}");
    drop((to_rs1, to_rs2));
}

#[test]
fn a_failed_dial_retries_on_the_next_candidate_for_the_same_connection() {
    require_netns!();
    let _heavy = heavy_lock();
    let mut lab = lab();
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let peer = transfer(&lab, &server, LEN, 1).expect("rc refused with every peer up");
    assert_eq!(path_of(peer), "rs1");
    let failures = |lab: &Lab| {
        lab.metrics("rc")
            .counter("splitway_peer_connect_failures_total", &[("peer", "rs1")])
    };
    assert_eq!(failures(&lab), 0.0);
    // Right after the kill rc still thinks rs1 is up (its next probe is
    // up to a second away): the dial fails, and the same connection
    // must go through rs2 with every byte intact.
    lab.kill_relay("rs1");
    let peer = transfer(&lab, &server, LEN, 2).expect("the client's connection was refused");
    assert_eq!(path_of(peer), "rs2");
    let failed = failures(&lab);
    if failed == 0.0 {
        // A probe saw rs1 die first and the choice had already moved: the
        // connection succeeded, but no retry was needed to make it.
        eprintln!("[relay_paths] a probe beat the connection to the dead rs1");
    } else {
        assert_eq!(failed, 1.0, "one failed dial, retried once");
    }
    assert_eq!(candidate(&lab, "rs1")["state"], "down");
    for seed in 3..6 {
        let peer = transfer(&lab, &server, LEN, seed).expect("rc refused with rs2 up");
        assert_eq!(path_of(peer), "rs2", "connection {seed}");
    }
}

#[test]
fn direct_is_measured_and_chosen_when_it_is_best() {
    require_netns!();
    let _heavy = heavy_lock();
    // rs1 behind 30 ms; rc's own way to the server is the veth chain.
    let (lab, to_rs1, to_rs2) = emulated_lab(
        Duration::from_millis(30),
        Duration::from_millis(30),
        via_list(&["rs1", "direct"]),
    );
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    // rc's source address towards the server: what the server sees direct.
    let route = lab
        .rc()
        .ip(&["-o", "route", "get", SERVER_V4])
        .expect("ip route get");
    let route = String::from_utf8_lossy(&route.stdout);
    let rc_src = route
        .split_whitespace()
        .skip_while(|w| *w != "src")
        .nth(1)
        .expect("a source address")
        .to_owned();
    let path = |peer: SocketAddr| {
        if peer.ip().to_string() == rc_src {
            "direct"
        } else {
            path_of(peer)
        }
    };
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "rs1 measured",
        || {
            candidate(&lab, "rs1")["leg_rtt_ms"]
                .is_number()
                .then_some(())
        },
    );
    // Config order puts rs1 first; direct is unmeasured until a
    // connection names a destination for its probe.
    let peer = transfer_past_probes(&lab, &server, LEN, 1).expect("rc refused");
    assert_eq!(path(peer), "rs1");
    wait_until(
        Deadline::after(Duration::from_secs(5)),
        "direct probed",
        || {
            candidate(&lab, "direct")["leg_rtt_ms"]
                .is_number()
                .then_some(())
        },
    );
    let direct = candidate(&lab, "direct");
    assert_eq!(direct["state"], "up", "{direct}");
    assert!(
        direct["probes"].as_u64().is_some_and(|n| n >= 1),
        "{direct}"
    );
    for seed in 2..5 {
        let peer = transfer_past_probes(&lab, &server, LEN, seed).expect("rc refused");
        assert_eq!(path(peer), "direct", "connection {seed}");
    }
    assert_eq!(routes_doc(&lab)["routes"][0]["chosen"], "direct");
    // Direct now carries the traffic: its probes stop.
    std::thread::sleep(PROBE_SETTLE);
    let probes = candidate(&lab, "direct")["probes"].clone();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(candidate(&lab, "direct")["probes"], probes);
    drop((to_rs1, to_rs2));
}

/// Path choice with IPv6 candidates (issue #32): rc reaches rs1 and rs2
/// over their IPv6 link addresses and carries a SOCKS5 client (IPv4) to an
/// IPv6 server; killing rs1 moves new connections to rs2 within 3 s, every
/// byte intact both ways.
#[test]
fn ipv6_candidates_fail_over_within_3s() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::chain(&["rc", "rs1", "rs2"]);
    let ip = |ns: &splitway_sys::netns::Netns, args: &[&str]| {
        ns.ip(args)
            .unwrap_or_else(|e| panic!("ip {args:?} in {}: {e}", ns.name()))
    };
    ip(
        &lab.relays[0],
        &[
            "-6",
            "route",
            "add",
            "fd00:23::/64",
            "via",
            &link_v6(1, 3, 2),
        ],
    );
    ip(
        &lab.relays[2],
        &[
            "-6",
            "route",
            "add",
            "fd00:12::/64",
            "via",
            &link_v6(2, 3, 1),
        ],
    );
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    let mut rc = RelayConfig::new("rc");
    rc.listen(ListenMode::Socks5, &format!("{ENTRY_V4}:{SOCKS_PORT}"));
    rc.listeners[0].allow_clients = vec!["10.0.1.0/24".into()];
    rc.peer("rs1", &format!("[{}]:{PEER_PORT}", link_v6(1, 3, 2)));
    rc.peer("rs2", &format!("[{}]:{PEER_PORT}", link_v6(2, 3, 2)));
    rc.raw_route(route_via("fd00:3::/64", via_list(&["rs1", "rs2"])));
    rc.accel(|a| a.learned_window = Some(false));
    configs[0] = rc;
    for cfg in &mut configs[1..] {
        for l in &mut cfg.listeners {
            if l.mode == ListenMode::Peer {
                l.addr = format!("[::]:{PEER_PORT}");
            }
        }
    }
    // rs1 dials the server itself (its kernel routes through rs2).
    configs[1].routes.clear();
    configs[1].peers.clear();
    configs[1].route("::/0", "direct");
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("[{SERVER_V6}]:{SERVER_PORT}")));
    let path_v6 = |peer: SocketAddr| match peer.ip().to_string() {
        a if a == link_v6(2, 3, 1) => "rs1",
        a if a == LAST_RELAY_V6 => "rs2",
        a => panic!("the server saw {a}, neither relay's IPv6 address"),
    };
    fail_over_from_rs1(&mut lab, &server, deadline, path_v6);
    let m = lab.metrics("rc");
    assert_eq!(
        m.counter("splitway_path_flips_total", &[("cause", "failure")]),
        1.0
    );
}
