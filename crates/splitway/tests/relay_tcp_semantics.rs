//! TCP semantics across the relay chain: each half of a connection closes
//! independently, and an abortive close (RST) reaches the other end as a
//! reset rather than a clean EOF.

mod support;

use std::net::Shutdown;
use std::time::Duration;

use socket2::SockRef;
use support::*;

fn lab_with_relays() -> (Lab, TestServer) {
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    (lab, server)
}

#[test]
fn half_close_in_both_directions() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut lab, server) = lab_with_relays();

    // Client finishes its request with shutdown(Write) and still gets the
    // whole response, which the server only starts after seeing EOF.
    let request_len = 300 * 1024;
    let response_len = 2 * MIB;
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let client_side = std::thread::spawn(move || {
        let sent = send_pattern(&mut client, request_len, 11).expect("client send request");
        client
            .shutdown(Shutdown::Write)
            .expect("client shutdown(Write)");
        let received = recv_all(&mut client).expect("client receive response");
        (sent, received)
    });
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let request = recv_all(&mut conn).expect("server read request to EOF");
    let response = send_pattern(&mut conn, response_len, 12).expect("server send response");
    drop(conn);
    let (sent, received) = client_side.join().expect("client thread");
    assert_eq!(request, sent, "request after client half-close");
    assert_eq!(received, response, "response after client half-close");
    deadline.remaining("client half-close");

    // Server sends everything and half-closes first; the client keeps
    // sending long after it has seen EOF, and all of it arrives.
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let client_side = std::thread::spawn(move || {
        let received = recv_all(&mut client).expect("client receive until server EOF");
        let sent = send_pattern(&mut client, 3 * MIB, 21).expect("client send after EOF");
        client
            .shutdown(Shutdown::Write)
            .expect("client shutdown(Write)");
        (received, sent)
    });
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let server_sent = send_pattern(&mut conn, MIB, 22).expect("server send");
    conn.shutdown(Shutdown::Write)
        .expect("server shutdown(Write)");
    let server_received = recv_all(&mut conn).expect("server receive after its half-close");
    let (client_received, client_sent) = client_side.join().expect("client thread");
    assert_eq!(
        client_received, server_sent,
        "data before server half-close"
    );
    assert_eq!(server_received, client_sent, "data after server half-close");
    deadline.remaining("server half-close");
    lab.assert_relays_alive();
}

#[test]
fn server_reset_reaches_client() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut lab, server) = lab_with_relays();
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let client_side = std::thread::spawn(move || expect_reset(&mut client, "client"));
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    send_pattern(&mut conn, 256 * 1024, 31).expect("server send before abort");
    SockRef::from(&conn)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(conn); // abortive close: RST
    let received_before_reset = client_side.join().expect("client thread");
    assert!(received_before_reset <= 256 * 1024);
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "upstream_reset")],
        1.0,
        deadline,
    );
    lab.assert_relays_alive();
}

#[test]
fn client_reset_reaches_server() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut lab, server) = lab_with_relays();
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    send_pattern(&mut client, 256 * 1024, 41).expect("client send before abort");
    SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(client); // abortive close: RST
    let received_before_reset = expect_reset(&mut conn, "server");
    assert!(received_before_reset <= 256 * 1024);
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "client_reset")],
        1.0,
        deadline,
    );
    lab.assert_relays_alive();
}
