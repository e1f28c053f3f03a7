//! Transparent (TPROXY) relaying through real `splitway relay` processes in
//! network namespaces: client — rc — rs — server, sha256-checked transfers.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;

const SIZES: [u64; 4] = [0, 1, 64 * 1024, 100 * MIB];

fn server_v4() -> SocketAddr {
    sock(&format!("{SERVER_V4}:{SERVER_PORT}"))
}

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
    let forwarded = lab
        .metrics("rs")
        .counter("splitway_forwarded_bytes_total", &[]);
    let payload: u64 = SIZES.iter().sum::<u64>() * 2;
    assert!(
        forwarded >= payload as f64,
        "rs forwarded {forwarded} bytes, less than the {payload} payload bytes"
    );
    lab.assert_relays_alive();
}

fn transfer_100mib_with_data_path(data_path: &str) {
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    for cfg in &mut configs {
        cfg.extra(&format!("[forwarding]\ndata_path = {data_path:?}"));
    }
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 100 * MIB, LAST_RELAY_V4);
    deadline.remaining("client→server 100 MiB");
    transfer_server_to_client(&lab.client, &server, server_v4(), 100 * MIB, LAST_RELAY_V4);
    deadline.remaining("server→client 100 MiB");
    lab.assert_relays_alive();
}

#[test]
fn transparent_100mib_copy_data_path() {
    require_netns!();
    transfer_100mib_with_data_path("copy");
}

#[test]
fn transparent_100mib_splice_data_path() {
    require_netns!();
    transfer_100mib_with_data_path("splice");
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
         \t\tmeta l4proto tcp socket transparent 1 meta mark set 1 accept\n\
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
    lab.wait_counter(
        "r2",
        "splitway_forwarded_bytes_total",
        &[],
        (16 * MIB) as f64,
        deadline,
    );
    lab.assert_relays_alive();
}
