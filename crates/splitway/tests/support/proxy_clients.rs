//! Raw clients of the relay's explicit and transparent entry points, for
//! tests that check each protocol's answer byte by byte.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use super::*;

/// SOCKS5 reply 2: connection not allowed by ruleset.
pub const SOCKS_NOT_ALLOWED: u8 = 2;

pub enum Target<'a> {
    Ip(SocketAddr),
    Name(&'a str, u16),
}

/// SOCKS5 CONNECT through rc; returns the reply code and the stream (ready
/// for tunnel data when the code is 0).
pub fn socks5(
    client: &splitway_sys::netns::Netns,
    target: Target<'_>,
) -> (u8, std::net::TcpStream) {
    let proxy = sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"));
    let mut s = connect_in(client, proxy).expect("connect to the SOCKS5 listener");
    s.write_all(&[5, 1, 0]).expect("greeting");
    let mut method = [0u8; 2];
    s.read_exact(&mut method).expect("method selection");
    assert_eq!(method, [5, 0], "no-auth selected");
    let mut req = vec![5, 1, 0];
    let port = match target {
        Target::Ip(SocketAddr::V4(a)) => {
            req.push(1);
            req.extend_from_slice(&a.ip().octets());
            a.port()
        }
        Target::Ip(SocketAddr::V6(a)) => {
            req.push(4);
            req.extend_from_slice(&a.ip().octets());
            a.port()
        }
        Target::Name(host, port) => {
            req.push(3);
            req.push(host.len() as u8);
            req.extend_from_slice(host.as_bytes());
            port
        }
    };
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).expect("request");
    let mut head = [0u8; 4];
    s.read_exact(&mut head).expect("reply head");
    assert_eq!(head[0], 5, "SOCKS version in the reply");
    let rest = match head[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        other => panic!("unexpected BND.ADDR type {other}"),
    };
    let mut bound = vec![0u8; rest];
    s.read_exact(&mut bound).expect("reply address");
    (head[1], s)
}

/// HTTP CONNECT through rc; returns the status and the stream.
pub fn http_connect(
    client: &splitway_sys::netns::Netns,
    target: &str,
) -> (u16, std::net::TcpStream) {
    let proxy = sock(&format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}"));
    let mut s = connect_in(client, proxy).expect("connect to the HTTP CONNECT listener");
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .expect("send CONNECT");
    // Byte by byte: nothing after the head may be consumed here.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => head.push(byte[0]),
            Err(e) => panic!("reading the CONNECT response for {target}: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
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
