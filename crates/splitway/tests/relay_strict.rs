//! Strict mode (`[accel] strict = true`) through real `splitway relay`
//! processes in network namespaces: the client's handshake completes only
//! once the server accepted, so a refused server is refused at connect and
//! a blackholed one times out, as without relays.

mod support;

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

/// A port the server namespace silently drops.
const BLACKHOLE_PORT: u16 = 5010;

fn server_v4() -> SocketAddr {
    sock(&format!("{SERVER_V4}:{SERVER_PORT}"))
}

/// A lab whose entry relay runs strict mode on the test ports, with short
/// connect timeouts so a blackhole resolves within the test's budget.
fn strict_lab(relays: &[&str]) -> Lab {
    let mut lab = Lab::chain(relays);
    let mut configs = lab.default_configs(&[SERVER_PORT, REFUSED_PORT, BLACKHOLE_PORT], false);
    configs[0].extra("[accel]\nstrict = true\n\n[timeouts]\nconnect = \"1s\"");
    for cfg in &mut configs[1..] {
        cfg.extra("[timeouts]\nconnect = \"1s\"");
    }
    lab.start_relays(&configs);
    lab
}

fn strict_count(lab: &Lab, outcome: &str) -> f64 {
    lab.metrics("rc")
        .counter("splitway_strict_syn_total", &[("outcome", outcome)])
}

fn accepted(lab: &Lab) -> f64 {
    lab.metrics("rc")
        .counter("splitway_connections_accepted_total", &[("mode", "tproxy")])
}

/// The refusal must come as the answer to the SYN (connect fails), never as
/// a reset after a completed handshake.
fn assert_refused_at_connect(lab: &Lab, dst: SocketAddr, what: &str) {
    match connect_in(&lab.client, dst) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
        Err(e) => panic!("{what}: expected ECONNREFUSED from connect, got {e}"),
        Ok(_) => panic!("{what}: connect succeeded although the server refuses"),
    }
}

#[test]
fn strict_refused_server_is_refused_at_connect_through_a_chain() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let lab = strict_lab(&["rc", "rs"]);
    let refused = sock(&format!("{SERVER_V4}:{REFUSED_PORT}"));
    for _ in 0..3 {
        assert_refused_at_connect(&lab, refused, "refused server behind rc → rs");
    }
    lab.wait_counter(
        "rc",
        "splitway_strict_syn_total",
        &[("outcome", "refused")],
        3.0,
        deadline,
    );
    assert_eq!(
        accepted(&lab),
        0.0,
        "no refused connection may reach the listener"
    );
    assert_eq!(strict_count(&lab, "released"), 0.0);
}

#[test]
fn strict_listening_server_carries_bytes_both_ways() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(90));
    for relays in [&["rc"][..], &["rc", "rs"][..]] {
        let mut lab = strict_lab(relays);
        let server = TestServer::bind(&lab.server, server_v4());
        // The server sees the last relay (10.0.3.1 in either chain).
        let last_hop = LAST_RELAY_V4;
        let len = 4 * MIB;
        transfer_client_to_server(&lab.client, &server, server_v4(), len, last_hop);
        transfer_server_to_client(&lab.client, &server, server_v4(), len, last_hop);
        deadline.remaining(&format!("transfers through {relays:?}"));
        lab.wait_counter(
            "rc",
            "splitway_strict_syn_total",
            &[("outcome", "released")],
            2.0,
            deadline,
        );
        // Each accepted connection found its leg ready (it was set up while
        // the SYN was held).
        lab.wait_counter(
            "rc",
            "splitway_early_syn_total",
            &[("outcome", "hit")],
            2.0,
            deadline,
        );
        assert_eq!(accepted(&lab), 2.0, "one accept per transfer");
        lab.assert_forwarded_bytes("rc", len, len, deadline);
        lab.assert_relays_alive();
    }
}

#[test]
fn strict_blackholed_destination_times_out_at_connect() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let lab = strict_lab(&["rc"]);
    for cmd in [
        "add table inet swt_blackhole",
        "add chain inet swt_blackhole input { type filter hook input priority 0 ; }",
        "add rule inet swt_blackhole input tcp dport 5010 drop",
    ] {
        lab.server
            .exec("nft", &[cmd])
            .expect("install blackhole in the server namespace");
    }
    let dst = sock(&format!("{SERVER_V4}:{BLACKHOLE_PORT}"));
    let started = Instant::now();
    let r = lab
        .client
        .run_in(move || std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(4)))
        .expect("enter namespace");
    match r {
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
        Err(e) => panic!("blackholed server: expected a connect timeout, got {e}"),
        Ok(_) => panic!("blackholed server: connect succeeded"),
    }
    assert!(started.elapsed() >= Duration::from_secs(4));
    // The relay's own 1 s connect timeout made it drop the held SYN.
    lab.wait_counter(
        "rc",
        "splitway_strict_syn_total",
        &[("outcome", "timeout")],
        1.0,
        deadline,
    );
    assert_eq!(
        accepted(&lab),
        0.0,
        "the client's handshake never completed"
    );
}

fn strict_rules(ns: &splitway_sys::netns::Netns) -> (String, String) {
    let ipt = ns
        .exec("iptables", &["-t", "raw", "-S"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let nft = ns
        .exec("nft", &["list", "tables"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    (ipt, nft)
}

#[test]
fn strict_rules_removed_on_exit_and_a_second_strict_relay_refuses_to_start() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = strict_lab(&["rc"]);
    let (ipt, nft) = strict_rules(lab.rc());
    assert!(ipt.contains("NFQUEUE"), "queue rule installed:\n{ipt}");
    assert!(nft.contains("swstrict_"), "reject table installed:\n{nft}");

    // A second strict relay in the namespace finds the queue taken: it
    // must refuse to start, say why, and leave none of its rules.
    let mut second = RelayConfig::new("second");
    second.listen_intercept("tproxy", "0.0.0.0:7001", &[WEST_IF], &[5011]);
    second.route("0.0.0.0/0", "direct");
    second.extra("[accel]\nstrict = true");
    let path = lab.dir.join("second.toml");
    std::fs::write(
        &path,
        second
            .render(&lab.psk_path)
            .replace("127.0.0.1:9090", "127.0.0.1:9091"),
    )
    .expect("write config");
    let mut child = lab
        .rc()
        .command(SPLITWAY)
        .args(["relay", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn second relay");
    let status = wait_until(deadline, "second relay exits", || child.try_wait().ok()?);
    let mut out = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut out)
        .ok();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut out)
        .ok();
    assert!(!status.success(), "second strict relay started:\n{out}");
    assert!(out.contains("accel.strict"), "error names the key:\n{out}");
    let (ipt, nft) = strict_rules(lab.rc());
    assert_eq!(
        ipt.matches("NFQUEUE").count(),
        1,
        "only the first relay's queue rule remains:\n{ipt}"
    );
    assert!(
        !nft.contains("splitway_second"),
        "second's TPROXY table removed:\n{nft}"
    );

    // The first relay still works, then removes everything on SIGTERM.
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_client_to_server(&lab.client, &server, server_v4(), 1, LAST_RELAY_V4);
    lab.stop_relay("rc");
    let (ipt, nft) = strict_rules(lab.rc());
    assert!(
        !ipt.contains("NFQUEUE") && !ipt.contains("swstrict"),
        "left behind:\n{ipt}"
    );
    assert!(
        !nft.contains("swstrict") && !nft.contains("splitway_"),
        "left behind:\n{nft}"
    );
    let _ = std::io::stdout().flush();
}
