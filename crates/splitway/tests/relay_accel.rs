//! Connection-time accelerations through real relays in namespaces: early
//! SYN pairing (retransmits, expiry, flood budget), the relay↔relay pool
//! (dead connections skipped, refill after a peer restart) and turbo-start
//! windows on relay legs only, TCP Fast Open on client and server legs, and
//! what status says when an acceleration cannot run.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use splitway_sys::netns::Netns;
use support::*;

/// `turbo = { initcwnd = 40, initrwnd = 40 }`.
fn turbo_40() -> RawTurbo {
    RawTurbo {
        initcwnd: Some(40),
        initrwnd: Some(40),
        buffer: None,
    }
}

fn status(lab: &Lab, relay: &str) -> splitway_api::Status {
    admin_status(lab.relay_ns(relay)).unwrap_or_else(|e| panic!("GET /status from {relay}: {e}"))
}

/// The `cwnd:N` values in `ss -i` output.
fn cwnds(ss: &str) -> Vec<u32> {
    ss.split_whitespace()
        .filter_map(|w| w.strip_prefix("cwnd:")?.parse().ok())
        .collect()
}

/// The standard lab with rc's `[accel]` set by `accel`.
fn lab_with(accel: impl FnOnce(&mut RawAccel)) -> Lab {
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].accel(accel);
    lab.start_relays(&configs);
    lab
}

fn assert_early_syn_up(lab: &Lab) {
    let st = status(lab, "rc");
    assert!(
        st.early_syn.is_some(),
        "early SYN did not come up (BPF SYN detector failed to attach): {st:?}"
    );
}

fn early(lab: &Lab, outcome: &str) -> f64 {
    lab.metrics("rc")
        .counter("splitway_early_syn_total", &[("outcome", outcome)])
}

/// The client's first SYN-ACK is lost, so it retransmits its SYN: the relay
/// starts the next leg once, pairs it with the accepted socket, and the
/// transfer arrives intact.
#[test]
fn early_syn_pairs_once_under_syn_retransmit() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = lab_with(|a| a.early_syn = Some(true));
    assert_early_syn_up(&lab);
    // Only the first SYN-ACK (numgen starts at 0) is dropped.
    drop_syn_acks(&lab.client, "0-65535", "numgen inc mod 1000000 == 0");
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_server_to_client(&lab.client, &server, server_v4(), 3 * MIB, LAST_RELAY_V4);
    deadline.remaining("transfer");
    let dup = lab.wait_counter(
        "rc",
        "splitway_early_syn_total",
        &[("outcome", "duplicate")],
        1.0,
        deadline,
    );
    assert!(dup >= 1.0);
    assert_eq!(
        early(&lab, "started"),
        1.0,
        "a retransmitted SYN must not start a second leg"
    );
    assert_eq!(
        early(&lab, "hit"),
        1.0,
        "the accepted socket found its early leg"
    );
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}

/// A SYN whose handshake never completes: its early leg reaches the server,
/// then expires and is reset without a byte.
#[test]
fn early_syn_that_never_completes_expires_and_resets_its_leg() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = lab_with(|a| {
        a.early_syn = Some(true);
        a.early_syn_expiry = Some("1s".into());
    });
    assert_early_syn_up(&lab);
    let server = TestServer::bind(&lab.server, server_v4());
    assert_expired_early_leg_is_reset(&lab, &server, deadline);
    assert_eq!(early(&lab, "hit"), 0.0);
    lab.assert_relays_alive();
}

/// Thousands of SYNs that never complete: pending early starts stay within
/// the budget, the pool is back at its watermark afterwards, and a real
/// client is served throughout.
#[test]
fn syn_flood_is_bounded_by_the_budget() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let budget = 32u64;
    let mut lab = lab_with(|a| {
        a.early_syn = Some(true);
        a.pool = Some(true);
        a.early_syn_budget = Some(budget as usize);
        // One prefix may use the whole budget here: this is the budget's
        // test (a prefix's share: `relay_flood`).
        a.early_syn_prefix_budget = Some(budget as usize);
        a.early_syn_expiry = Some("2s".into());
    });
    assert_early_syn_up(&lab);
    let pool_full = || {
        let st = status(&lab, "rc");
        let pool = st.peers[0].pool.as_ref()?;
        (pool.level >= pool.high).then_some(())
    };
    wait_until(deadline, "pool filled before the flood", pool_full);

    // The server answers real requests and lets early legs of flood SYNs
    // (which never carry a byte) close by themselves.
    let server = TestServer::bind(&lab.server, server_v4());
    let serving = serve_go(&server, MIB, 7);

    // Flood from local ports 40000-41999, whose SYN-ACKs are dropped.
    drop_syn_acks(&lab.client, "40000-41999", "");
    let flood: Vec<socket2::Socket> = (0..2000u16)
        .map(|i| start_connect(&lab.client, 40000 + i, server_v4()))
        .collect();
    lab.wait_counter(
        "rc",
        "splitway_early_syn_total",
        &[("outcome", "over_budget")],
        1.0,
        deadline,
    );
    let mut max_pending = 0;
    for _ in 0..20 {
        let p = match status(&lab, "rc").early_syn {
            Some(splitway_api::EarlySyn::Running(early)) => early.pending,
            other => panic!("no early-SYN counters: {other:?}"),
        };
        max_pending = max_pending.max(p);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        max_pending <= budget,
        "pending early starts {max_pending} > budget {budget}"
    );

    // A real client during the flood.
    real_request(&lab.client, server_v4());
    drop(flood);
    // The flood is over: its ports are free again and the next client's
    // ephemeral port may be one of them (7 % of the range), so its SYN-ACK
    // must no longer be dropped.
    nft(&lab.client, "delete table inet swtest\n");
    wait_until(
        deadline,
        "pool back at its watermark after the flood",
        pool_full,
    );
    real_request(&lab.client, server_v4());
    drop(serving);
    lab.assert_relays_alive();
}

fn real_request(client: &Netns, dst: SocketAddr) {
    go_request(client, dst, MIB, 7);
}

/// The next relay restarts: every pooled connection at the entry relay is
/// dead. The next client does not notice (dead ones are skipped), and the
/// pool refills to its watermark.
#[test]
fn pool_skips_dead_connections_and_refills_after_peer_restart() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].accel(|a| a.pool = Some(true));
    configs[0].peers[0].pool = Some(pool_bounds(2, 4));
    lab.start_relays(&configs);
    let pool_at = |level: u64| {
        move |lab: &Lab| {
            let st = status(lab, "rc");
            (st.peers[0].pool.as_ref()?.level >= level).then_some(())
        }
    };
    wait_until(deadline, "pool filled", || pool_at(4)(&lab));
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    let taken = lab
        .metrics("rc")
        .counter("splitway_pool_events_total", &[("event", "taken")]);
    assert!(taken >= 1.0, "the transfer used a pooled connection");

    lab.stop_relay("rs");
    lab.restart_relay("rs", &configs[1]);
    // Right after the restart the pool still holds connections to the old rs.
    transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    lab.wait_counter(
        "rc",
        "splitway_pool_events_total",
        &[("event", "dead")],
        1.0,
        deadline,
    );
    wait_until(deadline, "pool refilled after the restart", || {
        pool_at(4)(&lab)
    });
    transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    lab.assert_relays_alive();
}

/// Turbo-start: idle pooled relay legs start with the configured window;
/// the client-facing leg keeps the kernel default.
#[test]
fn turbo_start_on_relay_legs_only() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].accel(|a| {
        a.pool = Some(true);
        a.turbo = Some(turbo_40());
    });
    configs[1].accel(|a| a.turbo = Some(turbo_40()));
    // Upstream relays' prefix known in advance: rs installs the return
    // route at start, before the first pooled connection arrives.
    configs[1].listeners[0].allow_clients = vec!["10.0.12.0/24".into()];
    lab.start_relays(&configs);
    wait_until(deadline, "pool filled", || {
        let st = status(&lab, "rc");
        (st.peers[0].pool.as_ref()?.level >= 4).then_some(())
    });
    // Established relay legs (no data yet) show their initial cwnd.
    let ss = |ns: &Netns, filter: &str| -> String {
        let out = output(
            ns.command("ss")
                .args(["-tin", "state", "established", filter]),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let relay_legs = ss(lab.rc(), "( dport = :7100 )");
    let windows = cwnds(&relay_legs);
    // The authentication exchange may have grown them by a segment.
    assert!(
        !windows.is_empty() && windows.iter().all(|&w| w >= 40),
        "rc's legs to rs should start at cwnd 40:\n{relay_legs}"
    );
    let rs_legs = ss(lab.rs(), "( sport = :7100 )");
    let windows = cwnds(&rs_legs);
    assert!(
        !windows.is_empty() && windows.iter().all(|&w| w >= 40),
        "rs's legs to rc (learned at authentication) should start at cwnd 40:\n{rs_legs}"
    );
    // A client connection held open without data: its leg at rc is default.
    let server = TestServer::bind(&lab.server, server_v4());
    let client = connect_in(&lab.client, server_v4()).expect("connect");
    let (_at_server, _) = server.accept(deadline.remaining("connection at server"));
    for (ns, filter, what) in [
        (lab.rc(), "( sport = :5001 )", "client-facing leg at rc"),
        (lab.rs(), "( dport = :5001 )", "server-facing leg at rs"),
    ] {
        let text = ss(ns, filter);
        let windows = cwnds(&text);
        assert!(
            windows.len() == 1 && windows[0] <= 11,
            "{what} must keep the kernel default window (10):\n{text}"
        );
    }
    drop(client);
    lab.assert_relays_alive();
}

fn tcp_ext(ns: &Netns, name: &str) -> u64 {
    ns.tcp_ext().expect("TcpExt counters")[name]
}

/// A TCP Fast Open listener in the server's namespace that answers each
/// request (read until the client's FIN) with its bytes reversed.
fn tfo_reverse_server(ns: &Netns, addr: SocketAddr) -> std::net::TcpListener {
    ns.run_in(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        splitway_sys::sock::set_fastopen_listener(&s, 128).map_err(std::io::Error::other)?;
        s.listen(128)?;
        Ok::<_, std::io::Error>(std::net::TcpListener::from(s))
    })
    .expect("enter namespace")
    .expect("TFO listener")
}

/// One request through the relays from a TFO client: its first write goes
/// in the SYN once it holds a cookie for the address it dials.
fn tfo_request(ns: &Netns, dst: SocketAddr, request: Vec<u8>) -> Vec<u8> {
    ns.run_in(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        splitway_sys::sock::set_fastopen_connect(&s).map_err(std::io::Error::other)?;
        s.connect_timeout(&dst.into(), Duration::from_secs(10))?;
        let mut s = std::net::TcpStream::from(s);
        set_timeouts(&s);
        s.write_all(&request)?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)?;
        Ok::<_, std::io::Error>(reply)
    })
    .expect("enter namespace")
    .expect("TFO request through the relays")
}

/// `[accel] tfo`: a TFO client's request rides its SYN to rc (client leg,
/// accepted by default), and rs, with `tfo = true`, sends it on in its own
/// SYN to a TFO server (server leg). Counted by the kernels themselves.
#[test]
fn tfo_carries_the_request_in_the_syn_on_client_and_server_legs() {
    require_netns!();
    let mut lab = Lab::two_relays();
    for ns in [&lab.client, lab.rc(), lab.rs(), &lab.server] {
        enable_fast_open(ns);
    }
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // rc: TFO on its client listener by default (no key). rs: asked for,
    // so its direct legs send the client's bytes in their SYN.
    configs[1].accel(|a| a.tfo = Some(true));
    lab.start_relays(&configs);
    let st = status(&lab, "rc");
    assert_eq!(st.accel["tfo_client"].state, "active", "{st:?}");
    assert_eq!(st.accel["tfo_server"].state, "off", "{st:?}");
    let st = status(&lab, "rs");
    assert_eq!(st.accel["tfo_server"].state, "active", "{st:?}");

    let listener = tfo_reverse_server(&lab.server, server_v4());
    const REQUESTS: u64 = 4;
    let serve = std::thread::spawn(move || -> std::io::Result<()> {
        for _ in 0..REQUESTS {
            let (mut c, _) = listener.accept()?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut request = Vec::new();
            c.read_to_end(&mut request)?;
            request.reverse();
            c.write_all(&request)?;
        }
        Ok(())
    });
    let rc_passive = tcp_ext(lab.rc(), "TCPFastOpenPassive");
    let rs_active = tcp_ext(lab.rs(), "TCPFastOpenActive");
    let server_passive = tcp_ext(&lab.server, "TCPFastOpenPassive");
    for i in 0..REQUESTS {
        let request: Vec<u8> = (0..1000u32).map(|b| (b * 7 + i as u32) as u8).collect();
        let mut expected = request.clone();
        expected.reverse();
        let reply = tfo_request(&lab.client, server_v4(), request);
        assert_eq!(reply, expected, "request {i}: reply differs");
    }
    serve.join().expect("server thread").expect("server");
    // The first request fetches rc's cookie; every later one rides the SYN.
    let rc_syn_data = tcp_ext(lab.rc(), "TCPFastOpenPassive") - rc_passive;
    assert!(
        rc_syn_data >= REQUESTS - 1,
        "client leg: {rc_syn_data} of {REQUESTS} requests in the SYN"
    );
    // rs's first TFO dial (the first with the client's bytes at hand)
    // fetches the server's cookie; later ones carry the bytes.
    let rs_syn_data = tcp_ext(lab.rs(), "TCPFastOpenActive") - rs_active;
    let server_syn_data = tcp_ext(&lab.server, "TCPFastOpenPassive") - server_passive;
    assert!(
        rs_syn_data >= REQUESTS - 2 && server_syn_data >= REQUESTS - 2,
        "server leg: rs sent {rs_syn_data}, the server took {server_syn_data} of {REQUESTS} requests in the SYN"
    );
    lab.assert_relays_alive();
}

/// A reload that removes a peer removes its turbo-start route at once.
#[test]
fn turbo_route_of_a_peer_removed_by_reload_goes_with_it() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(30));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].accel(|a| a.turbo = Some(turbo_40()));
    lab.start_relays(&configs);
    let rs_ip = lab
        .peer_addr(1)
        .rsplit_once(':')
        .map(|(ip, _)| ip.to_owned())
        .expect("ip:port");
    let route = |lab: &Lab| {
        let out =
            output(
                lab.rc()
                    .command("ip")
                    .args(["route", "show", "exact", &format!("{rs_ip}/32")]),
            );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        route(&lab).contains("initcwnd 40"),
        "turbo route to rs: {:?}",
        route(&lab)
    );
    // The same relay without its peer: everything goes direct.
    let mut without = RelayConfig::new("rc");
    without.listeners = configs[0].listeners.clone();
    without.route("0.0.0.0/0", "direct");
    without.accel(|a| a.turbo = Some(turbo_40()));
    std::fs::write(lab.config_path("rc"), without.render(&lab.psk_path)).expect("write config");
    let out = lab.ctl("rc", &["reload"]);
    assert!(out.status.success(), "ctl reload: {out:?}");
    wait_until(deadline, "turbo route to the removed peer gone", || {
        (!route(&lab).contains("initcwnd")).then_some(())
    });
    lab.assert_relays_alive();
}

/// Early SYN is on by default with an intercepting listener; on a host where
/// its detector cannot attach (rc without CAP_BPF and CAP_SYS_ADMIN) the
/// relay runs without it and says so, with the reason, in `/status`,
/// `ctl status` and `/metrics`, instead of claiming it on.
#[test]
fn early_syn_that_cannot_attach_is_reported_unavailable_with_the_reason() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(30));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    assert_eq!(status(&lab, "rc").accel["early_syn"].state, "active");
    // rc again, same config, without the capabilities BPF needs.
    lab.stop_relay("rc");
    let log = std::fs::File::create(lab.dir.join("rc-without-cap-bpf.log")).expect("log file");
    let child = lab
        .rc()
        .command("setpriv")
        .args([
            "--bounding-set=-bpf,-sys_admin",
            "--inh-caps=-bpf,-sys_admin",
            "--",
            SPLITWAY,
            "relay",
            "--config",
        ])
        .arg(lab.config_path("rc"))
        .stdout(log.try_clone().expect("dup log"))
        .stderr(log)
        .spawn()
        .expect("spawn rc without CAP_BPF");
    lab.adopt(child);
    let st = wait_until(deadline, "rc without CAP_BPF answering", || {
        admin_status(lab.rc()).ok()
    });
    let state = &st.accel["early_syn"];
    assert_eq!(state.state, "unavailable", "{st:?}");
    assert_eq!(state.requested, "auto", "{st:?}");
    assert!(
        state.reason.contains("CAP_BPF"),
        "the reason names the capability: {st:?}"
    );
    assert!(!st.features.early_syn, "{st:?}");
    assert!(st.early_syn.is_none(), "no early-SYN statistics: {st:?}");
    let out = lab.ctl("rc", &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("early_syn") && l.contains("unavailable")),
        "ctl status:\n{text}"
    );
    let rc = lab.metrics("rc");
    assert_eq!(
        rc.counter(
            "splitway_accel_state",
            &[("accel", "early_syn"), ("state", "unavailable")]
        ),
        1.0
    );
    assert_eq!(
        rc.counter(
            "splitway_accel_state",
            &[("accel", "early_syn"), ("state", "active")]
        ),
        0.0
    );
    // Legs start at accept: every byte still arrives.
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    assert_eq!(early(&lab, "started"), 0.0);
}

/// Turbo-start over IPv6 relay legs (issue #32): rc installs the IPv6
/// route to rs's link address and rs the one back to rc's prefix, so idle
/// pooled legs both ways start at the configured window; bytes carried
/// both ways over them.
#[test]
fn turbo_start_on_ipv6_relay_legs() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].peers[0].addr = format!("[{}]:{PEER_PORT}", link_v6(1, 2, 2));
    configs[0].accel(|a| {
        a.pool = Some(true);
        a.turbo = Some(turbo_40());
    });
    configs[1].accel(|a| a.turbo = Some(turbo_40()));
    configs[1].listeners[0].addr = format!("[::]:{PEER_PORT}");
    configs[1].listeners[0].allow_clients = vec!["fd00:12::/64".into()];
    lab.start_relays(&configs);
    wait_until(deadline, "pool filled over IPv6", || {
        let st = status(&lab, "rc");
        (st.peers[0].pool.as_ref()?.level >= 4).then_some(())
    });
    let ss = |ns: &Netns, filter: &str| -> String {
        let out = output(
            ns.command("ss")
                .args(["-6", "-tin", "state", "established", filter]),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for (ns, filter, what) in [
        (lab.rc(), "( dport = :7100 )", "rc's IPv6 legs to rs"),
        (lab.rs(), "( sport = :7100 )", "rs's IPv6 legs to rc"),
    ] {
        let text = ss(ns, filter);
        let windows = cwnds(&text);
        let routes = output(ns.command("ip").args(["-6", "route", "show"]));
        assert!(
            !windows.is_empty() && windows.iter().all(|&w| w >= 40),
            "{what} should start at cwnd 40:\n{text}\nroutes:\n{}",
            String::from_utf8_lossy(&routes.stdout)
        );
    }
    let routes = output(lab.rc().command("ip").args(["-6", "route", "show"]));
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(
        routes
            .lines()
            .any(|l| l.starts_with(&link_v6(1, 2, 2)) && l.contains("initcwnd 40")),
        "rc's turbo route to rs over IPv6:\n{routes}"
    );
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_server_to_client(&lab.client, &server, server_v4(), 4 * MIB, LAST_RELAY_V4);
    transfer_client_to_server(&lab.client, &server, server_v4(), 4 * MIB, LAST_RELAY_V4);
    lab.assert_relays_alive();
}
