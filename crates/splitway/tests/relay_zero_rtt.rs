//! 0-RTT peer legs (`[accel] zero_rtt`, on unless turned off) through real
//! relays in namespaces: by default the Hello is the first flight of every
//! fresh leg, after the handshake without TCP Fast Open; with it the Hello
//! rides the SYN between relays; a peer without 0-RTT is redialed with the
//! challenge handshake; and a replayed or stale Hello is refused before
//! anything is dialed.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use splitway_proto::Destination;
use splitway_proto::auth::{AuthError, Dialer, Psk, RejectReason};
use splitway_proto::header::{Header, Reply, ReplyStatus};
use splitway_sys::netns::Netns;
use support::*;

fn server_v4() -> SocketAddr {
    sock(&format!("{SERVER_V4}:{SERVER_PORT}"))
}

fn enable_fast_open(ns: &Netns) {
    let out = output(
        ns.command("sysctl")
            .args(["-qw", "net.ipv4.tcp_fastopen=3"]),
    );
    assert!(out.status.success(), "sysctl tcp_fastopen: {out:?}");
}

fn tcp_ext(ns: &Netns, name: &str) -> u64 {
    ns.tcp_ext().expect("TcpExt counters")[name]
}

fn handshakes(m: &Metrics, side: &str, handshake: &str) -> f64 {
    m.counter(
        "splitway_peer_handshakes_total",
        &[("side", side), ("handshake", handshake)],
    )
}

#[test]
fn by_default_every_fresh_leg_opens_with_the_hello_even_without_tfo() {
    require_netns!();
    let mut lab = Lab::two_relays();
    // The namespaces' own default, net.ipv4.tcp_fastopen = 1: rs takes no
    // SYN data, so every Hello goes in the first segment after the
    // handshake. No `[accel]` key but the pool's (off, so that every leg is
    // fresh): zero_rtt is on by default.
    for ns in [lab.rc(), lab.rs()] {
        let out = output(
            ns.command("sysctl")
                .args(["-qw", "net.ipv4.tcp_fastopen=1"]),
        );
        assert!(out.status.success(), "sysctl tcp_fastopen: {out:?}");
    }
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].accel(|a| a.pool = Some(false));
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    const LEGS: u64 = 4;
    for _ in 0..LEGS / 2 {
        transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
        transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    }
    let rc = lab.metrics("rc");
    let rs = lab.metrics("rs");
    assert_eq!(
        handshakes(&rc, "dial", "hello"),
        LEGS as f64,
        "rc dialed with the Hello"
    );
    assert_eq!(
        handshakes(&rs, "accept", "hello"),
        LEGS as f64,
        "rs took Hellos after the handshake"
    );
    for (m, side) in [(&rc, "dial"), (&rs, "accept")] {
        assert_eq!(
            handshakes(m, side, "challenge"),
            0.0,
            "{side}: no challenge"
        );
        assert_eq!(
            handshakes(m, side, "hello_syn"),
            0.0,
            "{side}: no SYN data without TFO"
        );
    }
    assert_eq!(
        rc.counter("splitway_zero_rtt_total", &[("outcome", "fallback")]),
        0.0
    );
    // Status reports what runs: 0-RTT active, TFO on peer legs unavailable
    // (rs lacks the server bit), with the reason.
    let status = admin_status(lab.rs()).expect("rs status");
    assert_eq!(status.accel["zero_rtt"].state, "active", "{status:?}");
    assert_eq!(status.accel["zero_rtt"].requested, "auto", "{status:?}");
    assert_eq!(status.accel["tfo_peer"].state, "unavailable", "{status:?}");
    assert!(
        status.accel["tfo_peer"].reason.contains("server bit"),
        "{status:?}"
    );
    assert_eq!(
        rs.counter(
            "splitway_accel_state",
            &[("accel", "tfo_peer"), ("state", "unavailable")]
        ),
        1.0
    );
    lab.assert_relays_alive();
}

#[test]
fn hello_rides_the_syn_between_relays_and_every_byte_arrives() {
    require_netns!();
    let mut lab = Lab::two_relays();
    for ns in [lab.rc(), lab.rs()] {
        enable_fast_open(ns);
    }
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // Explicitly on, and no pool: every leg is a fresh one.
    for c in &mut configs {
        c.accel(|a| {
            a.zero_rtt = Some(true);
            a.pool = Some(false);
        });
    }
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let passive_before = tcp_ext(lab.rs(), "TCPFastOpenPassive");
    const LEGS: u64 = 4;
    for _ in 0..LEGS / 2 {
        transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
        transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    }
    let rc = lab.metrics("rc");
    let rs = lab.metrics("rs");
    let zero_rtt =
        |m: &Metrics, outcome| m.counter("splitway_zero_rtt_total", &[("outcome", outcome)]);
    assert_eq!(
        zero_rtt(&rc, "sent"),
        LEGS as f64,
        "every leg was a 0-RTT leg"
    );
    assert_eq!(zero_rtt(&rc, "fallback"), 0.0);
    assert_eq!(zero_rtt(&rs, "accepted"), LEGS as f64);
    // The first leg only fetches rs's TFO cookie; every later Hello is SYN
    // data that rs's kernel accepted into a new socket at the SYN.
    let passive = tcp_ext(lab.rs(), "TCPFastOpenPassive") - passive_before;
    assert!(
        passive >= LEGS - 1,
        "Hellos in the SYN: {passive} of {LEGS} legs (TCPFastOpenPassive)"
    );
    // Both ends saw it too (TCPI_OPT_SYN_DATA), and counted it.
    for (m, side) in [(&rc, "dial"), (&rs, "accept")] {
        let syn = handshakes(m, side, "hello_syn");
        let after = handshakes(m, side, "hello");
        assert_eq!(syn + after, LEGS as f64, "{side}");
        assert!(syn >= (LEGS - 1) as f64, "{side}: {syn} Hellos in the SYN");
    }
    assert_eq!(
        rc.counter(
            "splitway_accel_state",
            &[("accel", "tfo_peer"), ("state", "active")]
        ),
        1.0
    );
    lab.assert_relays_alive();
}

#[test]
fn a_peer_without_zero_rtt_is_redialed_with_the_challenge() {
    require_netns!();
    let mut lab = Lab::two_relays();
    enable_fast_open(lab.rc());
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].accel(|a| {
        a.zero_rtt = Some(true);
        a.pool = Some(false);
    });
    // An rs that does not take Hellos (as an older version would not).
    configs[1].accel(|a| a.zero_rtt = Some(false));
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    let rc = lab.metrics("rc");
    assert_eq!(
        rc.counter("splitway_zero_rtt_total", &[("outcome", "fallback")]),
        2.0
    );
    assert_eq!(
        rc.counter("splitway_zero_rtt_total", &[("outcome", "sent")]),
        0.0
    );
    assert_eq!(handshakes(&rc, "dial", "challenge"), 2.0);
    assert_eq!(handshakes(&rc, "dial", "hello"), 0.0);
    lab.assert_relays_alive();
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// What rs answers to one Hello sent from rc's namespace: the proof and
/// the Reply, or the Reject.
fn send_hello(
    lab: &Lab,
    psk: &Psk,
    nonce: u8,
    timestamp_ms: u64,
) -> Result<ReplyStatus, AuthError> {
    let mut dialer = Dialer::new(psk.clone(), [nonce; 32]);
    let mut header = Vec::new();
    Header::new(1, Destination::Ip(server_v4()), sock("10.0.1.1:40000")).encode(&mut header);
    let hello = dialer.hello(timestamp_ms, &header).expect("hello");
    let mut s: TcpStream = connect_in(lab.rc(), sock(&lab.peer_addr(1))).expect("connect rs");
    s.write_all(&hello).expect("send hello");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    let proof_len = loop {
        match dialer.on_server_proof(&buf) {
            Ok(Some(n)) => break n,
            Ok(None) => {}
            Err(e) => return Err(e),
        }
        let n = s.read(&mut chunk).expect("read from rs");
        assert!(n > 0, "rs closed without proof or reject");
        buf.extend_from_slice(&chunk[..n]);
    };
    buf.drain(..proof_len);
    loop {
        if let Some((reply, _)) = Reply::decode(&buf).expect("a valid reply") {
            return Ok(reply.status);
        }
        let n = s.read(&mut chunk).expect("read reply");
        assert!(n > 0, "rs closed before its reply");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn replayed_and_stale_hellos_are_refused_before_anything_is_dialed() {
    require_netns!();
    let mut lab = Lab::two_relays();
    enable_fast_open(lab.rs());
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[1].accel(|a| a.zero_rtt = Some(true));
    lab.start_relays(&configs);
    let psk = Psk::from_hex(&std::fs::read_to_string(&lab.psk_path).expect("read psk"))
        .expect("valid psk");
    let server = TestServer::bind(&lab.server, server_v4());

    let now = unix_ms();
    assert_eq!(send_hello(&lab, &psk, 7, now), Ok(ReplyStatus::Ok));
    let (_conn, peer) = server.accept(Duration::from_secs(10));
    assert_peer_ip(peer, LAST_RELAY_V4);

    // The same bytes again (a captured SYN replayed): refused, nothing dialed.
    assert_eq!(
        send_hello(&lab, &psk, 7, now),
        Err(AuthError::Rejected(RejectReason::AuthFailed))
    );
    // Stamped before rs started, or too far ahead of its clock.
    for ts in [now - 60_000, now + 60_000] {
        assert_eq!(
            send_hello(&lab, &psk, 8, ts),
            Err(AuthError::Rejected(RejectReason::Stale))
        );
    }
    // A wrong key never gets as far as the window.
    let other = Psk::from_bytes(&[0x42; 32]).expect("key");
    assert_eq!(
        send_hello(&lab, &other, 9, unix_ms()),
        Err(AuthError::Rejected(RejectReason::AuthFailed))
    );
    server.assert_no_pending_connection();
    let rs = lab.metrics("rs");
    let zero_rtt = |outcome| rs.counter("splitway_zero_rtt_total", &[("outcome", outcome)]);
    assert_eq!(zero_rtt("accepted"), 1.0);
    assert_eq!(zero_rtt("replay"), 1.0);
    assert_eq!(zero_rtt("stale"), 2.0);
    assert_eq!(
        rs.counter(
            "splitway_peer_auth_failures_total",
            &[("reason", "bad_mac")]
        ),
        1.0
    );
    lab.assert_relays_alive();
}
