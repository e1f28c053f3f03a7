//! Policy at the relay's door: explicit proxies accept only loopback
//! clients unless `allow_clients` says otherwise (no open relay), refused
//! ones are reset before their request is read, and the per-client
//! connection limit holds. Every refusal is counted.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::*;

#[test]
fn explicit_listener_without_allow_clients_refuses_remote_clients() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    for l in &mut configs[0].listeners {
        l.allow_clients.clear();
    }
    lab.start_relays(&configs);
    let _server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    // Reset at accept: not even the greeting is read or answered.
    let proxy = sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"));
    // The reset shows at connect or at the first read (nothing written
    // first: a write would consume the reset's error).
    tproxy_reset(&lab.client, proxy);
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("mode", "socks5"), ("reason", "not_allowed")],
        1.0,
        deadline,
    );
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "client")],
        1.0,
        deadline,
    );
    lab.assert_relays_alive();
}

#[test]
fn per_client_limit_refuses_the_extra_connection() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].limits(|l| l.per_client = Some(2));
    lab.start_relays(&configs);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);
    let mut a = connect_in(&lab.client, dst).expect("first");
    let mut b = connect_in(&lab.client, dst).expect("second");
    let (mut sa, _) = server.accept(deadline.remaining("first at server"));
    let (mut sb, _) = server.accept(deadline.remaining("second at server"));
    // The server may accept early-SYN legs before rc has taken a and b from
    // its accept queues, and per-core queues are taken in any order: a byte
    // through each proves both hold their permits before the third arrives
    // (otherwise the third may be admitted and a or b refused).
    a.write_all(b"a").expect("write first");
    b.write_all(b"b").expect("write second");
    for (server_side, who) in [(&mut sa, "first"), (&mut sb, "second")] {
        let mut byte = [0u8; 1];
        server_side
            .read_exact(&mut byte)
            .unwrap_or_else(|e| panic!("{who} connection's byte at the server: {e}"));
    }
    // The third is accepted by the kernel, then reset by the relay: the
    // reset shows at connect (when it beats the connect's completion check)
    // or at the first read, never as a clean EOF.
    match connect_in(&lab.client, dst) {
        Ok(mut c) => {
            expect_reset(&mut c, "third connection over the per-client limit");
        }
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "third connection over the per-client limit: {e}"
        ),
    }
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("mode", "tproxy"), ("reason", "not_allowed")],
        1.0,
        deadline,
    );
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "per_client_limit")],
        1.0,
        deadline,
    );
    drop((a, b));
    lab.assert_relays_alive();
}

/// Key rollover: the downstream relay accepts the current and the previous
/// key, so upstream relays can move to the new key one at a time.
#[test]
fn peer_listener_accepts_previous_key_during_rollover() {
    require_netns!();
    let mut lab = Lab::two_relays();
    let old_key = lab.dir.join("old.key");
    write_psk(&old_key, 0x01d_0001);
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // rc still has the old key; rs has the new one and accepts the old.
    configs[0].psk_file = Some(old_key.clone());
    configs[1].psk_file_previous = Some(old_key.clone());
    lab.start_relays(&configs);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);
    transfer_client_to_server(&lab.client, &server, dst, MIB, LAST_RELAY_V4);
    // rc moves to the new key: still accepted.
    configs[0].psk_file = None;
    lab.restart_relay("rc", &configs[0]);
    transfer_server_to_client(&lab.client, &server, dst, MIB, LAST_RELAY_V4);
    let failures = lab
        .metrics("rs")
        .counter("splitway_peer_auth_failures_total", &[]);
    assert_eq!(
        failures, 0.0,
        "no authentication failure during the rollover"
    );
    lab.assert_relays_alive();
}
