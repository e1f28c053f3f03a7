//! The peer listener refuses anything that does not complete the PSK
//! handshake, forwards nothing for it, counts each refusal by reason, and
//! keeps serving genuine peers.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use splitway_proto::Destination;
use splitway_proto::auth::{self, Dialer, Psk, RejectReason};
use splitway_proto::header::Header;
use support::*;

/// What the test peer does after reading the challenge.
enum Misbehaviour {
    /// Sends these bytes instead of a Response.
    Send(Vec<u8>),
    /// Answers with a Response made with the wrong key, followed by a
    /// pipelined header for the real server.
    WrongKey,
    /// Sends nothing and waits for the acceptor to give up.
    Silent,
    /// Half-closes without answering.
    Close,
}

fn read_challenge(stream: &mut TcpStream) -> [u8; auth::CHALLENGE_LEN] {
    let mut challenge = [0u8; auth::CHALLENGE_LEN];
    stream
        .read_exact(&mut challenge)
        .expect("rs sends its challenge first");
    assert_eq!(challenge[0], auth::FRAME_CHALLENGE);
    assert_eq!(&challenge[1..5], &auth::MAGIC);
    challenge
}

/// Connects to rs's peer port from rc's namespace, misbehaves, and returns
/// whatever rs sent after the challenge until it closed the connection.
fn misbehave(lab: &Lab, peer: SocketAddr, what: Misbehaviour) -> Vec<u8> {
    let mut stream = connect_in(lab.rc(), peer).expect("connect to rs peer port");
    let challenge = read_challenge(&mut stream);
    match what {
        Misbehaviour::Send(bytes) => stream.write_all(&bytes).expect("send garbage"),
        Misbehaviour::WrongKey => {
            let wrong = Psk::from_hex(&"5a".repeat(32)).expect("valid hex key");
            let mut dialer = Dialer::new(wrong, [7u8; auth::NONCE_LEN]);
            let (response, consumed) = dialer
                .on_challenge(&challenge)
                .expect("challenge parses")
                .expect("challenge complete");
            assert_eq!(consumed, challenge.len());
            let mut bytes = response;
            let dst = Destination::Ip(sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
            Header::new(1, dst, sock("10.0.1.1:40000")).encode(&mut bytes);
            bytes.extend_from_slice(b"payload that must never reach the server");
            stream.write_all(&bytes).expect("send wrong-key response");
        }
        Misbehaviour::Silent => {}
        Misbehaviour::Close => stream.shutdown(Shutdown::Write).expect("shutdown(Write)"),
    }
    let mut rest = Vec::new();
    let started = Instant::now();
    match stream.read_to_end(&mut rest) {
        Ok(_) => {}
        // rs may close with our unread bytes queued, which sends RST.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!(
            "rs did not close the connection ({e} after {:?}); got {rest:?}",
            started.elapsed()
        ),
    }
    rest
}

fn assert_refused(rest: &[u8], expected: Option<RejectReason>, case: &str) {
    match rest {
        [] => {}
        [auth::FRAME_REJECT, code] => {
            if let Some(expected) = expected {
                assert_eq!(
                    RejectReason::from_code(*code),
                    expected,
                    "{case}: reject reason"
                );
            }
        }
        other => panic!("{case}: rs sent {other:?} after the challenge, expected at most a Reject"),
    }
}

#[test]
fn unauthenticated_peers_are_refused_and_counted() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[1].timeouts(|t| t.handshake = Some("1s".into()));
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let peer = sock(&lab.peer_addr(1));

    let mut response_like = vec![auth::FRAME_RESPONSE];
    response_like.resize(auth::RESPONSE_LEN, 0);
    let bad_magic = {
        let mut b = response_like.clone();
        b[1..5].copy_from_slice(b"XXXX");
        b
    };
    let bad_version = {
        let mut b = response_like.clone();
        b[1..5].copy_from_slice(&auth::MAGIC);
        b[5] = auth::AUTH_VERSION + 8;
        b
    };
    let cases = [
        (
            "malformed",
            Misbehaviour::Send(b"GET / HTTP/1.1\r\nHost: rs\r\n\r\n".to_vec()),
            Some(RejectReason::Malformed),
        ),
        (
            "bad_magic",
            Misbehaviour::Send(bad_magic),
            Some(RejectReason::Malformed),
        ),
        (
            "bad_version",
            Misbehaviour::Send(bad_version),
            Some(RejectReason::UnsupportedVersion),
        ),
        (
            "bad_mac",
            Misbehaviour::WrongKey,
            Some(RejectReason::AuthFailed),
        ),
        ("timeout", Misbehaviour::Silent, None),
        ("closed", Misbehaviour::Close, None),
    ];
    for (reason, what, reject) in cases {
        let rest = misbehave(&lab, peer, what);
        assert_refused(&rest, reject, reason);
        lab.wait_counter(
            "rs",
            "splitway_peer_auth_failures_total",
            &[("reason", reason)],
            1.0,
            deadline,
        );
    }
    let metrics = lab.metrics("rs");
    for reason in [
        "malformed",
        "bad_magic",
        "bad_version",
        "bad_mac",
        "timeout",
        "closed",
    ] {
        assert_eq!(
            metrics.counter("splitway_peer_auth_failures_total", &[("reason", reason)]),
            1.0,
            "exactly one {reason} failure; metrics:\n{}",
            metrics.text
        );
    }
    assert_eq!(
        metrics.counter("splitway_peer_auth_failures_total", &[]),
        6.0,
        "six refused handshakes in total"
    );
    assert_eq!(
        metrics.counter("splitway_forwarded_bytes_total", &[]),
        0.0,
        "rs forwarded nothing for unauthenticated peers"
    );
    server.assert_no_pending_connection();

    // A genuine peer (rc) still gets through, and is the first connection
    // the server ever sees.
    transfer_client_to_server(
        &lab.client,
        &server,
        sock(&format!("{SERVER_V4}:{SERVER_PORT}")),
        64 * 1024,
        LAST_RELAY_V4,
    );
    deadline.remaining("peer auth tests");
    lab.assert_relays_alive();
}

/// rc holds a different key than rs: rs refuses every leg as bad_mac, rc
/// reports the failure to its client as a reset and counts it.
#[test]
fn mismatched_keys_refuse_the_chain() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    let other_key = lab.dir.join("other-psk.key");
    write_psk(&other_key, 0xBAD_4E7);
    configs[0].psk_file = Some(other_key);
    lab.start_relays(&configs);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);

    match connect_in(&lab.client, dst) {
        Ok(mut stream) => match stream.write_all(b"must not arrive") {
            Ok(()) => {
                expect_reset(&mut stream, "client behind a relay with the wrong key");
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("client write: expected at most a reset, got {e}"),
        },
        // The reset can beat connect()'s own completion check.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("expected a reset, got {e}"),
    }
    lab.wait_counter(
        "rs",
        "splitway_peer_auth_failures_total",
        &[("reason", "bad_mac")],
        1.0,
        deadline,
    );
    lab.wait_counter(
        "rs",
        "splitway_connections_closed_total",
        &[("mode", "peer"), ("reason", "auth_failed")],
        1.0,
        deadline,
    );
    // rc learns from rs's Reject frame that its key is wrong; reporting that
    // as anything but auth_failed would send its operator after the network.
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("mode", "tproxy"), ("reason", "auth_failed")],
        1.0,
        deadline,
    );
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}
