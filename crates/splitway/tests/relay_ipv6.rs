//! Relay legs over IPv6 (issue #32): the pool, early SYN, 0-RTT Hellos in
//! the SYN, and both client families carried over an IPv6-only long haul
//! (an IPv4 site reaching IPv4 servers across IPv6 relay legs).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;

fn server_v6() -> SocketAddr {
    sock(&format!("[{SERVER_V6}]:{SERVER_PORT}"))
}

/// The two-relay lab with rc dialing rs over the link's IPv6 address and
/// rs's peer listener on `[::]`; rc intercepts both families.
fn ipv6_legs(lab: &Lab) -> Vec<RelayConfig> {
    ipv6_legs_for(lab, &[SERVER_PORT])
}

/// [`ipv6_legs`] intercepting `ports`.
fn ipv6_legs_for(lab: &Lab, ports: &[u16]) -> Vec<RelayConfig> {
    let mut configs = lab.default_configs(ports, true);
    let rs_v6 = link_v6(1, 2, 2);
    configs[0].peers[0].addr = format!("[{rs_v6}]:{PEER_PORT}");
    for l in &mut configs[1].listeners {
        if l.mode == ListenMode::Peer {
            l.addr = format!("[::]:{PEER_PORT}");
        }
    }
    configs
}

/// IPv6 and IPv4 clients, both ways, 4 MiB each, over pooled IPv6 relay
/// legs started at the client's SYN: every byte arrives (sha256), rs sees
/// its legs come from rc's IPv6 address, and the pool and early SYN were
/// used.
#[test]
fn ipv6_relay_legs_with_pool_and_early_syn_carry_both_families() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let mut configs = ipv6_legs(&lab);
    configs[0].accel(|a| a.early_syn = Some(true));
    lab.start_relays(&configs);
    wait_until(deadline, "rc's pool to rs filled over IPv6", || {
        let st = admin_status(lab.relay_ns("rc")).ok()?;
        (st.peers.first()?.pool.as_ref()?.level > 0).then_some(())
    });
    let server6 = TestServer::bind(&lab.server, server_v6());
    let server4 = TestServer::bind(&lab.server, server_v4());
    for _ in 0..2 {
        transfer_client_to_server(&lab.client, &server6, server_v6(), 4 * MIB, LAST_RELAY_V6);
        transfer_server_to_client(&lab.client, &server6, server_v6(), 4 * MIB, LAST_RELAY_V6);
        transfer_client_to_server(&lab.client, &server4, server_v4(), 4 * MIB, LAST_RELAY_V4);
        transfer_server_to_client(&lab.client, &server4, server_v4(), 4 * MIB, LAST_RELAY_V4);
    }
    deadline.remaining("transfers over IPv6 relay legs");
    let rc = lab.metrics("rc");
    let taken = rc.counter("splitway_pool_events_total", &[("event", "taken")]);
    let hits = rc.counter("splitway_early_syn_total", &[("outcome", "hit")]);
    eprintln!("rc: {taken} pooled legs taken, {hits} early-SYN hits over IPv6 legs");
    assert!(taken >= 1.0, "no pooled IPv6 leg was used");
    assert!(hits >= 1.0, "no connection's leg started at its SYN");
    let rs_v4_link = link_v4(1, 2, 1);
    let rs_log = lab.relay_log("rs");
    let rc_v6 = link_v6(1, 2, 1);
    assert!(
        rs_log.contains(&format!("client=[{rc_v6}]:")),
        "rs logged no leg from rc's IPv6 address {rc_v6}"
    );
    assert!(
        !rs_log.contains(&format!("client={rs_v4_link}:")),
        "a leg came over IPv4"
    );
    let payload = 2 * 2 * 4 * MIB;
    lab.assert_forwarded_bytes("rs", payload, payload, deadline);
    lab.assert_relays_alive();
}

/// Fresh IPv6 legs (no pool) open with the 0-RTT Hello, in the SYN once
/// rs's TFO cookie is held, and carry every byte.
#[test]
fn zero_rtt_hellos_ride_the_syn_over_ipv6() {
    require_netns!();
    let mut lab = Lab::two_relays();
    for ns in [lab.rc(), lab.rs()] {
        enable_fast_open(ns);
    }
    let mut configs = ipv6_legs(&lab);
    configs[0].accel(|a| a.learned_window = Some(false));
    for c in &mut configs {
        c.accel(|a| {
            a.zero_rtt = Some(true);
            a.pool = Some(false);
        });
    }
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v6());
    const LEGS: u64 = 4;
    for _ in 0..LEGS / 2 {
        transfer_server_to_client(&lab.client, &server, server_v6(), MIB, LAST_RELAY_V6);
        transfer_client_to_server(&lab.client, &server, server_v6(), MIB, LAST_RELAY_V6);
    }
    let rc = lab.metrics("rc");
    let rs = lab.metrics("rs");
    let zero_rtt =
        |m: &Metrics, outcome| m.counter("splitway_zero_rtt_total", &[("outcome", outcome)]);
    assert_eq!(zero_rtt(&rc, "sent"), LEGS as f64, "every leg a 0-RTT leg");
    assert_eq!(zero_rtt(&rc, "fallback"), 0.0);
    assert_eq!(zero_rtt(&rs, "accepted"), LEGS as f64);
    for (m, side) in [(&rc, "dial"), (&rs, "accept")] {
        let syn = m.counter(
            "splitway_peer_handshakes_total",
            &[("side", side), ("handshake", "hello_syn")],
        );
        assert!(
            syn >= (LEGS - 1) as f64,
            "{side}: {syn} Hellos in the SYN over IPv6"
        );
    }
    lab.assert_relays_alive();
}

/// Strict mode over IPv6 (ip6tables' NFQUEUE and the inet reject table):
/// an IPv6 client's SYN to a refusing IPv6 server is refused at connect and
/// never reaches the listener; one to a listening server is released and
/// carries 4 MiB each way over IPv6 relay legs.
#[test]
fn strict_mode_over_ipv6() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let mut configs = ipv6_legs_for(&lab, &[SERVER_PORT, REFUSED_PORT]);
    configs[0].accel(|a| a.strict = Some(true));
    for cfg in &mut configs {
        cfg.timeouts(|t| t.connect = Some("1s".into()));
    }
    lab.start_relays(&configs);
    let refused = sock(&format!("[{SERVER_V6}]:{REFUSED_PORT}"));
    for _ in 0..3 {
        assert_refused_at_connect(&lab, refused, "refused IPv6 server");
    }
    lab.wait_counter(
        "rc",
        "splitway_strict_syn_total",
        &[("outcome", "refused")],
        3.0,
        deadline,
    );
    assert_eq!(
        tproxy_accepted(&lab),
        0.0,
        "a refused SYN reached the listener"
    );
    let server = TestServer::bind(&lab.server, server_v6());
    transfer_client_to_server(&lab.client, &server, server_v6(), 4 * MIB, LAST_RELAY_V6);
    transfer_server_to_client(&lab.client, &server, server_v6(), 4 * MIB, LAST_RELAY_V6);
    lab.wait_counter(
        "rc",
        "splitway_strict_syn_total",
        &[("outcome", "released")],
        2.0,
        deadline,
    );
    assert_eq!(tproxy_accepted(&lab), 2.0, "one accept per transfer");
    assert_eq!(strict_count(&lab, "timeout"), 0.0);
    lab.assert_forwarded_bytes("rs", 4 * MIB, 4 * MIB, deadline);
    lab.assert_relays_alive();
}
