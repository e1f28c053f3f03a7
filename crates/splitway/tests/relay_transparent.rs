//! Transparent (TPROXY) relaying through real `splitway relay` processes in
//! network namespaces: client — rc — rs — server, sha256-checked transfers.

mod support;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use support::*;

const SIZES: [u64; 4] = [0, 1, 64 * 1024, 100 * MIB];

/// Both directions of every size through relay-installed interception.
#[test]
fn transparent_all_sizes_both_directions() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[80, SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    for len in SIZES {
        transfer_client_to_server(&lab.client, &server, server_v4(), len, LAST_RELAY_V4);
        deadline.remaining(&format!("client→server {len} B"));
        transfer_server_to_client(&lab.client, &server, server_v4(), len, LAST_RELAY_V4);
        deadline.remaining(&format!("server→client {len} B"));
    }
    let n = SIZES.len() as f64 * 2.0;
    let accepted = lab.wait_counter(
        "rc",
        "splitway_connections_accepted_total",
        &[("mode", "tproxy")],
        n,
        deadline,
    );
    assert_eq!(
        accepted, n,
        "rc accepted exactly one connection per transfer"
    );
    let completed = lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "completed")],
        n,
        deadline,
    );
    assert_eq!(completed, n, "every transfer closed as completed");
    let payload: u64 = SIZES.iter().sum();
    for relay in ["rc", "rs"] {
        lab.assert_forwarded_bytes(relay, payload, payload, deadline);
    }
    lab.assert_relays_alive();
}

fn transfer_100mib_with_data_path(data_path: DataPath) {
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    for cfg in &mut configs {
        cfg.data_path(data_path);
    }
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 100 * MIB, LAST_RELAY_V4);
    deadline.remaining("client→server 100 MiB");
    transfer_server_to_client(&lab.client, &server, server_v4(), 100 * MIB, LAST_RELAY_V4);
    deadline.remaining("server→client 100 MiB");
    // The configured data path carried the bulk: all of it for copy; for
    // splice everything but what arrived with the connection's first
    // read, which is copied (header, early data).
    let (used, unused) = match data_path {
        DataPath::Copy => ("copy", "splice"),
        DataPath::Auto | DataPath::Splice => ("splice", "copy"),
    };
    for relay in ["rc", "rs"] {
        let metrics = lab.metrics(relay);
        for direction in ["to_server", "to_client"] {
            let bytes = |path| {
                metrics.counter(
                    "splitway_forwarded_bytes_total",
                    &[("direction", direction), ("path", path)],
                )
            };
            assert!(
                bytes(used) >= (99 * MIB) as f64,
                "{relay} {direction}: only {} bytes went by {used}; metrics:\n{}",
                bytes(used),
                metrics.text
            );
            if used == "copy" {
                assert_eq!(
                    bytes(unused),
                    0.0,
                    "{relay} {direction} spliced with data_path=copy"
                );
            }
        }
    }
    lab.assert_relays_alive();
}

/// `auto` (the default) must move bulk data by splice: fails if it never
/// switches from copying.
#[test]
fn transparent_100mib_auto_data_path_switches_to_splice() {
    require_netns!();
    transfer_100mib_with_data_path(DataPath::Auto);
}

#[test]
fn transparent_100mib_copy_data_path() {
    require_netns!();
    transfer_100mib_with_data_path(DataPath::Copy);
}

#[test]
fn transparent_100mib_splice_data_path() {
    require_netns!();
    transfer_100mib_with_data_path(DataPath::Splice);
}

/// TPROXY rules installed by hand (as kernel-facts.md describes) instead of
/// by the relay's `intercept`.
#[test]
fn transparent_with_manual_nft_rules() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[], false);
    configs[0].listeners[0].intercept = None;
    let rules = format!(
        "table inet swt_tproxy {{\n\
         \tchain prerouting {{\n\
         \t\ttype filter hook prerouting priority mangle; policy accept;\n\
         \t\tmeta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn socket transparent 1 meta mark set 1 accept\n\
         \t\tiifname \"{WEST_IF}\" meta nfproto ipv4 meta l4proto tcp th dport {{ 80, {SERVER_PORT} }} tproxy ip to :{TPROXY_PORT} meta mark set 1 accept\n\
         \t}}\n\
         }}\n"
    );
    let rules_path = lab.dir.join("tproxy.nft");
    std::fs::write(&rules_path, rules).expect("write nft rules");
    let rc = lab.rc();
    rc.exec("nft", &["-f", rules_path.to_str().expect("utf-8 path")])
        .expect("install nft TPROXY rules");
    rc.ip(&["rule", "add", "fwmark", "1", "lookup", "100"])
        .expect("ip rule");
    rc.ip(&[
        "route",
        "add",
        "local",
        "0.0.0.0/0",
        "dev",
        "lo",
        "table",
        "100",
    ])
    .expect("local route");
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(
        &lab.client,
        &server,
        server_v4(),
        1024 * 1024,
        LAST_RELAY_V4,
    );
    transfer_server_to_client(
        &lab.client,
        &server,
        server_v4(),
        1024 * 1024,
        LAST_RELAY_V4,
    );
    deadline.remaining("manual-rules transfers");
    lab.assert_relays_alive();
}

#[test]
fn transparent_ipv6() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], true);
    lab.start_relays(&configs);
    let dst = sock(&format!("[{SERVER_V6}]:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);
    transfer_client_to_server(&lab.client, &server, dst, 4 * MIB, LAST_RELAY_V6);
    transfer_server_to_client(&lab.client, &server, dst, 4 * MIB, LAST_RELAY_V6);
    deadline.remaining("IPv6 transfers");
    // The same dual-stack listener also serves intercepted IPv4.
    let server4 = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server4, server_v4(), 4 * MIB, LAST_RELAY_V4);
    transfer_server_to_client(&lab.client, &server4, server_v4(), 4 * MIB, LAST_RELAY_V4);
    deadline.remaining("IPv4 transfers through the dual-stack listener");
    lab.assert_relays_alive();
}

/// client — r1 — r2 — r3 — server: a middle relay both accepts and dials peers.
#[test]
fn transparent_three_relay_chain() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::chain(&["r1", "r2", "r3"]);
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 8 * MIB, LAST_RELAY_V4);
    transfer_server_to_client(&lab.client, &server, server_v4(), 8 * MIB, LAST_RELAY_V4);
    deadline.remaining("3-relay chain transfers");
    for relay in ["r1", "r2", "r3"] {
        lab.assert_forwarded_bytes(relay, 8 * MIB, 8 * MIB, deadline);
    }
    lab.assert_relays_alive();
}

/// The longest matching route prefix decides: a /32 `direct` inside a /24
/// sent via rs. Which way a connection went shows in the address the
/// server sees: rs's server-facing 10.0.3.1 via the peer, rc's own
/// 10.0.12.1 when rc dials directly (rs then only routes packets).
#[test]
fn longest_prefix_route_wins() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    lab.server
        .ip(&["addr", "add", "10.0.3.3/24", "dev", WEST_IF])
        .expect("second server address");
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].route("10.0.3.3/32", "direct");
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("0.0.0.0:{SERVER_PORT}")));
    let via_peer = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let direct = sock(&format!("10.0.3.3:{SERVER_PORT}"));
    transfer_client_to_server(&lab.client, &server, direct, 64 * 1024, "10.0.12.1");
    transfer_client_to_server(&lab.client, &server, via_peer, 64 * 1024, LAST_RELAY_V4);
    transfer_server_to_client(&lab.client, &server, direct, 64 * 1024, "10.0.12.1");
    deadline.remaining("route tests");
    lab.assert_relays_alive();
}

/// Two relays that route the destination to each other: the header's TTL
/// ends the loop, the client sees a reset and the relays stay up.
#[test]
fn routing_loop_is_cut_by_ttl() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].listen(ListenMode::Peer, &format!("0.0.0.0:{PEER_PORT}"));
    configs[1].routes.clear();
    configs[1].peer("rc", &format!("10.0.12.1:{PEER_PORT}"));
    configs[1].route("0.0.0.0/0", "rc");
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    match connect_in(&lab.client, dst) {
        Ok(mut stream) => {
            expect_reset(&mut stream, "client of a looping route");
        }
        // The reset can beat connect()'s own completion check.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("expected a reset, got {e}"),
    }
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "ttl_exceeded")],
        1.0,
        deadline,
    );
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}

/// Many connections at once, each with its own data: every one arrives
/// intact and separately (the server echoes each stream's digest back).
#[test]
fn many_concurrent_connections() {
    require_netns!();
    const CONNECTIONS: u64 = 64;
    const LEN: u64 = 256 * 1024;
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());

    echo_digests_concurrently(&lab, &server, CONNECTIONS, |i| LEN + i);
    deadline.remaining("concurrent connections");
    let accepted = lab.wait_counter(
        "rc",
        "splitway_connections_accepted_total",
        &[("mode", "tproxy")],
        CONNECTIONS as f64,
        deadline,
    );
    assert_eq!(accepted, CONNECTIONS as f64);
    lab.assert_relays_alive();
}

/// Opens `n` connections to `server`, all before any sends (a burst of
/// handshakes at the relays), then connection `i` sends `len(i)` bytes and
/// half-closes; the server echoes each stream's digest and length, which
/// must match what was sent.
fn echo_digests_concurrently(lab: &Lab, server: &TestServer, n: u64, len: impl Fn(u64) -> u64) {
    let streams: Vec<_> = (0..n)
        .map(|_| connect_in(&lab.client, server_v4()).expect("connect"))
        .collect();
    let clients: Vec<_> = (0..n)
        .zip(streams)
        .map(|(i, mut stream)| {
            let len = len(i);
            std::thread::spawn(move || {
                let sent = send_pattern(&mut stream, len, 1000 + i).expect("client send");
                stream.shutdown(Shutdown::Write).expect("shutdown(Write)");
                let mut echoed = Vec::new();
                stream.read_to_end(&mut echoed).expect("read digest echo");
                (sent, echoed)
            })
        })
        .collect();
    let handlers: Vec<_> = (0..n)
        .map(|_| {
            let (mut conn, peer) = server.accept(Duration::from_secs(20));
            assert_peer_ip(peer, LAST_RELAY_V4);
            std::thread::spawn(move || {
                let received = recv_all(&mut conn).expect("server receive");
                let mut echo = received.sha256.to_vec();
                echo.extend_from_slice(&received.len.to_be_bytes());
                conn.write_all(&echo).expect("echo digest");
            })
        })
        .collect();
    for h in handlers {
        h.join().expect("server handler");
    }
    for c in clients {
        let (sent, echoed) = c.join().expect("client thread");
        let mut expected = sent.sha256.to_vec();
        expected.extend_from_slice(&sent.len.to_be_bytes());
        assert_eq!(echoed, expected, "stream of {sent} arrived altered");
    }
}

/// A relay that dies after accepting a transparent client but before
/// forwarding (here: while its dial to a blackholed server hangs) resets
/// the client: the accepted socket inherited SO_LINGER 0 from its listener.
/// A FIN would tell the client the server had answered and closed cleanly.
#[test]
fn relay_killed_before_forwarding_resets_the_client() {
    require_netns!();
    const BLACKHOLE_PORT: u16 = 5010;
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::chain(&["rc"]);
    let mut configs = lab.default_configs(&[BLACKHOLE_PORT], false);
    // The dial must still hang when the relay is killed.
    configs[0].timeouts(|t| t.connect = Some("30s".into()));
    lab.start_relays(&configs);
    blackhole_port(&lab.server, BLACKHOLE_PORT);
    let dst = sock(&format!("{SERVER_V4}:{BLACKHOLE_PORT}"));
    // Nothing written: a socket closed with unread bytes resets anyway, so
    // only an empty receive queue tells SO_LINGER 0 from a plain close.
    let mut client = connect_in(&lab.client, dst).expect("the relay accepts");
    lab.wait_counter(
        "rc",
        "splitway_connections_accepted_total",
        &[("mode", "tproxy")],
        1.0,
        deadline,
    );
    lab.kill_relay("rc");
    expect_reset(&mut client, "client of a relay killed before forwarding");
}

/// A relay pair starting under load: rc has no pool, so the very first
/// connections dial rs together before any leg of rc's has authenticated
/// there; rs's per-address handshake cap (4 here) must not reset them
/// (the legs over it wait for the source's first authentication). Every
/// connection carries its bytes both ways.
#[test]
fn a_burst_before_the_first_authentication_is_not_reset() {
    require_netns!();
    const CONNECTIONS: u64 = 64;
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // No pool and no window probe (either would authenticate a leg at
    // start), and the challenge round trip (no 0-RTT Hello): the first
    // legs are all in their handshake at rs together.
    configs[0].sections.accel = Some(RawAccel {
        pool: Some(false),
        zero_rtt: Some(false),
        learned_window: Some(false),
        ..RawAccel::default()
    });
    configs[1].sections.limits = Some(RawLimits {
        handshaking_per_client: Some(4),
        ..RawLimits::default()
    });
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    echo_digests_concurrently(&lab, &server, CONNECTIONS, |i| 4096 + i);
    let refused = lab
        .metrics("rs")
        .counter("splitway_denied_total", &[("reason", "handshaking")]);
    assert_eq!(refused, 0.0, "rs reset legs of rc's first burst");
    lab.assert_relays_alive();
}
