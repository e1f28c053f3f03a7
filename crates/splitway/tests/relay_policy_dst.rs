//! Destination policy (`[policy]`): the first relay refuses a forbidden
//! destination or port in each client protocol's terms before any relay
//! leg is used; a downstream relay applies its own policy to the headers it
//! receives. Every denial is counted by reason; allowed traffic arrives
//! sha256-intact.

mod support;

use std::time::Duration;

use support::*;

/// Resolves (in the relays' hosts files) to the server.
const ORIGIN_NAME: &str = "origin.splitway.test";
/// Resolves to the server's second address, which policy denies.
const DENIED_NAME: &str = "denied.splitway.test";
const DENIED_V4: &str = "10.0.3.3";
/// A port inside an allowed range ("5100-5110").
const RANGE_PORT: u16 = 5105;
/// The relays' admin API: a host-local destination.
const ADMIN: &str = "127.0.0.1:9090";

fn add_denied_server_address(lab: &Lab) {
    lab.server
        .ip(&["addr", "add", &format!("{DENIED_V4}/24"), "dev", WEST_IF])
        .expect("second server address");
}

#[test]
fn first_relay_refuses_denied_destinations_and_ports_before_any_relay_leg() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    lab.relay_hosts_file(&format!(
        "{SERVER_V4} {ORIGIN_NAME}\n{DENIED_V4} {DENIED_NAME}"
    ));
    add_denied_server_address(&lab);
    let mut configs = lab.default_configs(&[SERVER_PORT, REFUSED_PORT, RANGE_PORT], false);
    configs[0]
        .policy(|p| {
            p.allow_destinations = Some(vec!["10.0.3.0/24".into()]);
            p.deny_destinations = Some(vec!["10.0.3.3/32".into()]);
            p.allow_ports = Some(vec![
                toml::Value::Integer(5001),
                toml::Value::String("5100-5110".into()),
                toml::Value::Integer(9090),
            ]);
        })
        // rs's accepted legs below count relay legs: none pooled, no
        // window probe.
        .accel(|a| {
            a.pool = Some(false);
            a.learned_window = Some(false);
        });
    lab.start_relays(&configs);
    let allowed = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let in_range = sock(&format!("{SERVER_V4}:{RANGE_PORT}"));
    let denied_dst = sock(&format!("{DENIED_V4}:{SERVER_PORT}"));
    let denied_port = sock(&format!("{SERVER_V4}:{REFUSED_PORT}"));
    let server = TestServer::bind(&lab.server, allowed);
    let range_server = TestServer::bind(&lab.server, in_range);
    let denied_server = TestServer::bind(&lab.server, denied_dst);

    // Allowed: each protocol, an IP, a name, a port inside a range.
    let (code, s) = socks5(&lab.client, Target::Ip(allowed));
    assert_eq!(code, 0, "SOCKS5 to an allowed destination");
    round_trip(s, &server, MIB, 0xA110_0001);
    let (status, s) = http_connect(&lab.client, &format!("{ORIGIN_NAME}:{RANGE_PORT}"));
    assert_eq!(status, 200, "CONNECT to an allowed name and ranged port");
    round_trip(s, &range_server, 256 * 1024, 0xA110_0002);
    transfer_client_to_server(&lab.client, &server, allowed, 256 * 1024, LAST_RELAY_V4);
    let allowed_connections = 3.0;

    // Denied port: checked before the name is even resolved. Without the
    // policy this port is refused by the server (SOCKS 5, HTTP 502).
    let (code, _) = socks5(&lab.client, Target::Ip(denied_port));
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 to a denied port");
    let (code, _) = socks5(&lab.client, Target::Name(ORIGIN_NAME, REFUSED_PORT));
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 to a name on a denied port");
    let (status, _) = http_connect(&lab.client, &denied_port.to_string());
    assert_eq!(status, 403, "CONNECT to a denied port");
    tproxy_reset(&lab.client, denied_port);

    // Denied destination: deny list (by address, and by a name resolving
    // there), and outside the allow list (without the policy: no route,
    // SOCKS 3).
    let (code, _) = socks5(&lab.client, Target::Ip(denied_dst));
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 to a denied prefix");
    let (status, _) = http_connect(&lab.client, &format!("{DENIED_NAME}:{SERVER_PORT}"));
    assert_eq!(
        status, 403,
        "CONNECT to a name resolving into a denied prefix"
    );
    tproxy_reset(&lab.client, denied_dst);
    let (code, _) = socks5(
        &lab.client,
        Target::Ip(sock(&format!("10.0.1.1:{SERVER_PORT}"))),
    );
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 outside allow_destinations");

    // Host-local: rc's own admin API, from a client on another host.
    let (code, _) = socks5(&lab.client, Target::Ip(sock(ADMIN)));
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 to the relay's admin API");

    let denied = "splitway_denied_total";
    assert_count(&lab, "rc", denied, &[("reason", "port")], 4.0, deadline);
    assert_count(
        &lab,
        "rc",
        denied,
        &[("reason", "destination")],
        4.0,
        deadline,
    );
    assert_count(&lab, "rc", denied, &[("reason", "local")], 1.0, deadline);
    let closed = "splitway_connections_closed_total";
    for (mode, n) in [("socks5", 5.0), ("http_connect", 2.0), ("tproxy", 2.0)] {
        assert_count(
            &lab,
            "rc",
            closed,
            &[("mode", mode), ("reason", "not_allowed")],
            n,
            deadline,
        );
    }
    // No relay leg was opened for a denied connection, and nothing reached
    // a denied server.
    assert_count(
        &lab,
        "rs",
        "splitway_connections_accepted_total",
        &[("mode", "peer")],
        allowed_connections,
        deadline,
    );
    denied_server.assert_no_pending_connection();
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}

#[test]
fn downstream_relay_enforces_its_own_policy() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    add_denied_server_address(&lab);
    let mut configs = lab.default_configs(&[SERVER_PORT, REFUSED_PORT], false);
    // rc lets everything through, even host-local destinations, and routes
    // loopback to rs: only rs's policy stands in the way.
    configs[0]
        .route("127.0.0.0/8", "rs")
        .policy(|p| p.allow_local_destinations = Some(true));
    configs[1].policy(|p| {
        p.deny_destinations = Some(vec!["10.0.3.3/32".into()]);
        p.allow_ports = Some(vec![toml::Value::Integer(5001), toml::Value::Integer(9090)]);
    });
    lab.start_relays(&configs);
    let allowed = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let denied_dst = sock(&format!("{DENIED_V4}:{SERVER_PORT}"));
    let denied_port = sock(&format!("{SERVER_V4}:{REFUSED_PORT}"));
    let server = TestServer::bind(&lab.server, allowed);
    let denied_server = TestServer::bind(&lab.server, denied_dst);

    let (code, s) = socks5(&lab.client, Target::Ip(allowed));
    assert_eq!(code, 0, "SOCKS5 to a destination both relays allow");
    round_trip(s, &server, MIB, 0xD0_0001);
    transfer_client_to_server(&lab.client, &server, allowed, 256 * 1024, LAST_RELAY_V4);

    // rs answers NotAllowed; rc turns it into each client protocol's answer.
    let (code, _) = socks5(&lab.client, Target::Ip(denied_dst));
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5, denied by rs");
    let (status, _) = http_connect(&lab.client, &denied_dst.to_string());
    assert_eq!(status, 403, "CONNECT, denied by rs");
    tproxy_reset(&lab.client, denied_dst);
    // Port: rs refuses it by policy (a refused connect would be SOCKS 5).
    let (code, _) = socks5(&lab.client, Target::Ip(denied_port));
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 to a port rs denies");
    // rs's loopback, asked for by rc (another host): refused by default.
    let (code, _) = socks5(&lab.client, Target::Ip(sock(ADMIN)));
    assert_eq!(code, SOCKS_NOT_ALLOWED, "SOCKS5 to rs's admin API");

    let denied = "splitway_denied_total";
    assert_count(
        &lab,
        "rs",
        denied,
        &[("reason", "destination")],
        3.0,
        deadline,
    );
    assert_count(&lab, "rs", denied, &[("reason", "port")], 1.0, deadline);
    assert_count(&lab, "rs", denied, &[("reason", "local")], 1.0, deadline);
    assert_count(
        &lab,
        "rs",
        "splitway_connections_closed_total",
        &[("mode", "peer"), ("reason", "not_allowed")],
        5.0,
        deadline,
    );
    // rc refused nothing itself: it counts what rs refused.
    assert_count(
        &lab,
        "rc",
        denied,
        &[("reason", "downstream")],
        5.0,
        deadline,
    );
    assert_count(
        &lab,
        "rc",
        denied,
        &[("reason", "destination")],
        0.0,
        deadline,
    );
    denied_server.assert_no_pending_connection();
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}
