//! Raw clients of the relay's explicit and transparent entry points, for
//! tests that check each protocol's answer byte by byte.

use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use splitway_lab::testbed::proxy as testbed_proxy;

use super::*;

/// SOCKS5 reply 2: connection not allowed by ruleset.
pub const SOCKS_NOT_ALLOWED: u8 = 2;

pub use splitway_lab::testbed::proxy::Target;

/// SOCKS5 CONNECT through rc; returns the reply code and the stream (ready
/// for tunnel data when the code is 0).
pub fn socks5(
    client: &splitway_sys::netns::Netns,
    target: Target<'_>,
) -> (u8, std::net::TcpStream) {
    let proxy = sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"));
    let mut s = connect_in(client, proxy).expect("connect to the SOCKS5 listener");
    let code = testbed_proxy::socks5(&mut s, target).unwrap_or_else(|e| panic!("{e}"));
    (code, s)
}

/// HTTP CONNECT through rc; returns the status and the stream.
pub fn http_connect(
    client: &splitway_sys::netns::Netns,
    target: &str,
) -> (u16, std::net::TcpStream) {
    let proxy = sock(&format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}"));
    let mut s = connect_in(client, proxy).expect("connect to the HTTP CONNECT listener");
    // Byte by byte: nothing after the head may be consumed here.
    let status = testbed_proxy::http_connect(&mut s, target, 1)
        .unwrap_or_else(|e| panic!("CONNECT {target}: {e}"));
    (status, s)
}

/// A transparent client of `dst` gets a reset (possibly before connect()
/// even reports success).
pub fn tproxy_reset(client: &splitway_sys::netns::Netns, dst: SocketAddr) {
    match connect_in(client, dst) {
        Ok(mut s) => {
            expect_reset(&mut s, &format!("transparent client of denied {dst}"));
        }
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "transparent connect to denied {dst}: {e}"
        ),
    }
}

/// Through an established tunnel: `len` bytes each way, sha256-checked at
/// both ends, the server seeing the last relay as its peer.
pub fn round_trip(mut stream: std::net::TcpStream, server: &TestServer, len: u64, seed: u64) {
    let client = std::thread::spawn(move || {
        let sent = send_pattern(&mut stream, len, seed).expect("client send");
        stream.shutdown(Shutdown::Write).expect("client shutdown");
        let got = recv_all(&mut stream).expect("client receive");
        (sent, got)
    });
    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let at_server = recv_all(&mut conn).expect("server receive");
    let from_server = send_pattern(&mut conn, len, seed + 1).expect("server send");
    conn.shutdown(Shutdown::Write).expect("server shutdown");
    let (sent, got) = client.join().expect("client thread");
    assert_eq!(at_server, sent, "client→server through the tunnel");
    assert_eq!(got, from_server, "server→client through the tunnel");
}

/// Waits for `name{labels}` on `relay` to reach `expected`, then checks it
/// is exactly that: every denial counted once.
pub fn assert_count(
    lab: &Lab,
    relay: &str,
    name: &str,
    labels: &[(&str, &str)],
    expected: f64,
    deadline: Deadline,
) {
    lab.wait_counter(relay, name, labels, expected, deadline);
    let now = lab.metrics(relay).counter(name, labels);
    assert_eq!(now, expected, "{relay} {name}{labels:?}");
}
