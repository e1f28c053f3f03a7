//! Explicit-proxy listeners (SOCKS5, HTTP CONNECT) driven by curl against a
//! real nginx, and how every listener reports a refused destination.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use support::*;

/// A name only the relays' hosts files know.
const ORIGIN_NAME: &str = "origin.splitway.test";

#[test]
fn socks5_and_http_connect_download_from_nginx() {
    require_netns!();
    if !nginx_is_installed() {
        return;
    }
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    lab.relay_hosts_file(&format!("{SERVER_V4} {ORIGIN_NAME}"));
    let configs = lab.default_configs(&[80], false);
    lab.start_relays(&configs);
    start_nginx(&mut lab);
    let served = write_random_file(&lab.dir.join("www/file"), 5 * MIB + 123, 0xF11E);
    let served_sha = hex::encode(served.sha256);

    let proxies: [(&str, Vec<String>); 2] = [
        (
            "socks5",
            vec![
                "--socks5-hostname".into(),
                format!("{ENTRY_V4}:{SOCKS_PORT}"),
            ],
        ),
        (
            "http-connect",
            vec![
                "-p".into(),
                "-x".into(),
                format!("http://{ENTRY_V4}:{HTTP_CONNECT_PORT}"),
            ],
        ),
    ];
    // By address, then by a name that only the relays can resolve (the
    // client has no entry for it), so the proxies must carry it.
    let targets = [SERVER_V4, ORIGIN_NAME];
    let mut downloads = 0;
    for ((mode, proxy_args), target) in proxies
        .iter()
        .flat_map(|p| targets.iter().map(move |t| (p, t)))
    {
        downloads += 1;
        let download = lab.dir.join(&format!("download-{mode}-{target}"));
        let out = output(
            lab.client
                .command("curl")
                .args(["-sS", "--fail", "--max-time", "30", "-o"])
                .arg(&download)
                .args(proxy_args)
                .arg(format!("http://{target}/file")),
        );
        assert!(
            out.status.success(),
            "curl via {mode} to {target} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            sha256_file(&download),
            served_sha,
            "file downloaded via {mode} from {target} differs from the served one"
        );
    }
    for (mode, _) in &proxies {
        let accepted = lab.wait_counter(
            "rc",
            "splitway_connections_accepted_total",
            // Label values use `_` where config modes use `-`.
            &[("mode", &mode.replace('-', "_"))],
            targets.len() as f64,
            deadline,
        );
        assert_eq!(
            accepted,
            targets.len() as f64,
            "{mode} connections accepted"
        );
    }
    // nginx saw every request arrive from the last relay and sent the whole file.
    let access = std::fs::read_to_string(lab.dir.join("nginx-access.log")).unwrap_or_default();
    let expected_line = format!("{LAST_RELAY_V4} 200 {}", served.len);
    assert_eq!(
        access.lines().filter(|l| *l == expected_line).count(),
        downloads,
        "nginx access log:\n{access}"
    );
    deadline.remaining("proxy downloads");
    lab.assert_relays_alive();
}

/// `http_proxy=` clients send absolute-form requests (`GET http://host/`)
/// to the http-connect listener (#34 item 6): curl with `-x`, curl with
/// `http_proxy=` and wget with `http_proxy=` download through the chain,
/// by address and by a name only the relays resolve, sha256 checked. The
/// default deny-list still refuses the link-local metadata address and the
/// relay's own address, with a 403 whose body says why.
#[test]
fn http_proxy_clients_get_absolute_form_requests_served() {
    require_netns!();
    if !nginx_is_installed() {
        return;
    }
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    lab.relay_hosts_file(&format!("{SERVER_V4} {ORIGIN_NAME}"));
    let configs = lab.default_configs(&[80], false);
    lab.start_relays(&configs);
    start_nginx(&mut lab);
    let served = write_random_file(&lab.dir.join("www/file"), 3 * MIB + 7, 0xAB50);
    let served_sha = hex::encode(served.sha256);
    let proxy = format!("http://{ENTRY_V4}:{HTTP_CONNECT_PORT}");

    let mut downloads = 0;
    for target in [SERVER_V4, ORIGIN_NAME] {
        let url = format!("http://{target}/file");
        for client in ["curl -x", "curl http_proxy", "wget http_proxy"] {
            downloads += 1;
            let download = lab.dir.join(&format!("download-{downloads}"));
            let mut cmd = match client {
                "wget http_proxy" => {
                    let mut c = lab.client.command("wget");
                    c.args(["-q", "--tries=1", "--timeout=30", "-O"])
                        .arg(&download);
                    c
                }
                _ => {
                    let mut c = lab.client.command("curl");
                    c.args(["-sS", "--fail", "--max-time", "30", "-o"])
                        .arg(&download);
                    c
                }
            };
            if client == "curl -x" {
                cmd.args(["-x", &proxy]);
            } else {
                cmd.env("http_proxy", &proxy);
            }
            let out = output(cmd.arg(&url));
            assert!(
                out.status.success(),
                "{client} {url} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                sha256_file(&download),
                served_sha,
                "{client} {url}: the file differs from the served one"
            );
        }
    }
    // One connection per request, each one counted.
    lab.wait_counter(
        "rc",
        "splitway_connections_accepted_total",
        &[("mode", "http_connect")],
        downloads as f64,
        deadline,
    );
    let access = std::fs::read_to_string(lab.dir.join("nginx-access.log")).unwrap_or_default();
    let expected_line = format!("{LAST_RELAY_V4} 200 {}", served.len);
    assert_eq!(
        access.lines().filter(|l| *l == expected_line).count(),
        downloads,
        "nginx access log:\n{access}"
    );

    // Refused by the default deny-list, with the reason in the body.
    for target in ["169.254.169.254", ENTRY_V4] {
        let out = output(
            lab.client
                .command("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "30",
                    "-w",
                    "\n%{http_code}",
                    "-x",
                    &proxy,
                ])
                .arg(format!("http://{target}/latest/meta-data/")),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        assert_eq!(code, "403", "{target}: {text}");
        assert!(
            body.contains("not allowed by the relay's policy"),
            "{target}: the 403 says no reason: {body:?}"
        );
        // The refusal is logged inside the connection's span, which names
        // the connection, its client and its destination once.
        let dst = format!("dst={target}:80}}");
        let log = wait_until(deadline, "rc logs the refusal", || {
            let log = lab.relay_log("rc");
            log.lines()
                .find(|l| l.contains(&dst) && l.contains(" denied "))
                .map(str::to_owned)
        });
        assert!(
            log.contains("conn{") && log.contains("id=") && log.contains("client=10."),
            "the refusal's log line lacks its span: {log}"
        );
        eprintln!("refusal logged: {log}");
    }
    deadline.remaining("http_proxy downloads");
    lab.assert_relays_alive();
}

/// A destination that refuses the connection is reported to each kind of
/// client in its own protocol.
#[test]
fn refused_destination_is_reported_per_protocol() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT, REFUSED_PORT], false);
    lab.start_relays(&configs);
    let refused: SocketAddr = sock(&format!("{SERVER_V4}:{REFUSED_PORT}"));

    // Transparent: rc completed the client's handshake itself, so the
    // refusal can only arrive as a reset, which may land before the
    // non-blocking connect() even reports success.
    match connect_in(&lab.client, refused) {
        Ok(mut stream) => {
            expect_reset(&mut stream, "transparent client of a refused destination");
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("transparent connect to a refused destination: expected a reset, got {e}"),
    }

    // SOCKS5: reply code 5, "connection refused".
    let mut socks =
        connect_in(&lab.client, sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"))).expect("socks connect");
    socks.write_all(&[5, 1, 0]).expect("socks greeting");
    let mut choice = [0u8; 2];
    socks.read_exact(&mut choice).expect("socks method choice");
    assert_eq!(choice, [5, 0], "SOCKS5 method selection");
    let port = REFUSED_PORT.to_be_bytes();
    socks
        .write_all(&[5, 1, 0, 1, 10, 0, 3, 2, port[0], port[1]])
        .expect("socks connect request");
    let mut reply = [0u8; 2];
    socks.read_exact(&mut reply).expect("socks reply");
    assert_eq!(
        reply,
        [5, 5],
        "SOCKS5 reply should be 5 (connection refused)"
    );

    // HTTP CONNECT: 502.
    let mut http = connect_in(
        &lab.client,
        sock(&format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}")),
    )
    .expect("http connect");
    http.write_all(format!("CONNECT {refused} HTTP/1.1\r\nHost: {refused}\r\n\r\n").as_bytes())
        .expect("send CONNECT");
    let mut response = Vec::new();
    let mut buf = [0u8; 1024];
    while !response.windows(4).any(|w| w == b"\r\n\r\n") {
        match read_some(&mut http, &mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading CONNECT response: {e}"),
        }
    }
    let response = String::from_utf8_lossy(&response);
    let status_line = response.lines().next().unwrap_or("");
    assert!(
        status_line.starts_with("HTTP/1.") && status_line.split_whitespace().nth(1) == Some("502"),
        "CONNECT to a refused destination should answer 502, got {status_line:?}"
    );

    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "connect_refused")],
        3.0,
        deadline,
    );

    // The relays still work afterwards.
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    transfer_client_to_server(
        &lab.client,
        &server,
        sock(&format!("{SERVER_V4}:{SERVER_PORT}")),
        64 * 1024,
        LAST_RELAY_V4,
    );
    deadline.remaining("refused tests");
    lab.assert_relays_alive();
}

/// Garbage on the explicit-proxy ports is refused in each protocol's terms
/// and counted as bad_request; nothing reaches the server.
#[test]
fn malformed_proxy_requests_are_refused() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));

    // SOCKS version 4 greeting to the SOCKS5 port: closed without a reply
    // that grants anything.
    let mut socks =
        connect_in(&lab.client, sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"))).expect("socks connect");
    socks
        .write_all(&[4, 1, 0x13, 0x89, 10, 0, 3, 2, 0])
        .expect("send SOCKS4 request");
    let mut reply = Vec::new();
    match socks.read_to_end(&mut reply) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("socks: expected the relay to close, got {e}"),
    }
    assert!(
        !reply.starts_with(&[0, 0x5a]) && !reply.starts_with(&[5, 0]),
        "a SOCKS4 request must not be granted: {reply:?}"
    );

    // Not an HTTP request at all: 400, then closed.
    let mut http = connect_in(
        &lab.client,
        sock(&format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}")),
    )
    .expect("http connect");
    http.write_all(b"\x16\x03\x01\x00\x05hello\r\n\r\n")
        .expect("send garbage");
    let mut response = Vec::new();
    let _ = http.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response);
    let status = response.lines().next().unwrap_or("");
    assert!(
        status.split_whitespace().nth(1) == Some("400"),
        "garbage on the CONNECT port should get 400, got {status:?}"
    );

    for mode in ["socks5", "http_connect"] {
        lab.wait_counter(
            "rc",
            "splitway_connections_closed_total",
            &[("mode", mode), ("reason", "bad_request")],
            1.0,
            deadline,
        );
    }
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}

/// A SOCKS5 client that does not wait for replies: greeting, request and
/// the first payload bytes in one write. The payload must reach the
/// server intact and be counted as forwarded, like any other byte.
#[test]
fn pipelined_socks5_payload_is_forwarded_and_counted() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);

    let payload = b"request line sent before any SOCKS reply arrived\n".repeat(20);
    let mut socks =
        connect_in(&lab.client, sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"))).expect("socks connect");
    let port = SERVER_PORT.to_be_bytes();
    let mut bytes = vec![5, 1, 0, 5, 1, 0, 1, 10, 0, 3, 2, port[0], port[1]];
    bytes.extend_from_slice(&payload);
    socks.write_all(&bytes).expect("pipelined write");
    socks.shutdown(Shutdown::Write).expect("shutdown(Write)");

    let (mut conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let mut received = Vec::new();
    conn.read_to_end(&mut received).expect("server read");
    assert_eq!(received, payload, "pipelined payload at the server");
    conn.write_all(b"ok").expect("server reply");
    drop(conn);

    let mut replies = Vec::new();
    socks.read_to_end(&mut replies).expect("client read");
    assert_eq!(&replies[..2], &[5, 0], "method selection");
    assert_eq!(&replies[2..4], &[5, 0], "CONNECT reply: succeeded");
    assert!(replies.ends_with(b"ok"), "server data after the replies");

    lab.assert_forwarded_bytes("rc", payload.len() as u64, 2, deadline);
    lab.assert_forwarded_bytes("rs", payload.len() as u64, 2, deadline);
    lab.assert_relays_alive();
}

/// Threads of process `pid` (`Threads:` in /proc/PID/status).
fn threads(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("Threads: line")
}

/// Opens `n` SOCKS5 connections at once to `dst` (address type and
/// address, as in the request) port `port`, then checks each: the reply,
/// and 32 bytes echoed back intact.
fn socks_batch(lab: &Lab, dst: &[u8], port: u16, n: usize, batch: usize) {
    let socks = sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"));
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = connect_in(&lab.client, socks).expect("connect to the SOCKS5 listener");
        let mut request = vec![5, 1, 0, 5, 1, 0];
        request.extend_from_slice(dst);
        request.extend_from_slice(&port.to_be_bytes());
        s.write_all(&request).expect("SOCKS5 request");
        streams.push(s);
    }
    for (i, mut s) in streams.into_iter().enumerate() {
        let mut reply = [0u8; 12];
        s.read_exact(&mut reply).expect("SOCKS5 replies");
        assert_eq!(
            &reply[..4],
            &[5, 0, 5, 0],
            "batch {batch} connection {i}: {reply:?}"
        );
        let payload: Vec<u8> = (0..32u8).map(|b| b ^ (i as u8) ^ (batch as u8)).collect();
        s.write_all(&payload).expect("send");
        s.shutdown(Shutdown::Write).expect("shutdown");
        let mut echoed = Vec::new();
        s.read_to_end(&mut echoed).expect("read echo");
        assert_eq!(
            echoed, payload,
            "batch {batch} connection {i}: echo differs"
        );
    }
}

/// Domain-name destinations resolve without creating threads: rc's thread
/// count after 1,000 SOCKS5 connections to a name, 100 at a time, is what
/// it was before the first lookup (getaddrinfo on tokio's blocking pool
/// would have added a thread per concurrent lookup).
#[test]
fn domain_lookups_create_no_threads_across_1000_socks5_connections() {
    require_netns!();
    let mut lab = Lab::two_relays();
    lab.relay_hosts_file(&format!("{SERVER_V4} {ORIGIN_NAME}"));
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let _echo = server.serve_forever(|mut c| {
        let mut buf = Vec::new();
        if c.read_to_end(&mut buf).is_ok() {
            let _ = c.write_all(&buf);
        }
    });
    // Warm up with an address (no lookup): whatever a connection itself
    // needs exists.
    let ip: std::net::Ipv4Addr = SERVER_V4.parse().expect("IPv4");
    let by_address = [&[1u8][..], &ip.octets()].concat();
    socks_batch(&lab, &by_address, SERVER_PORT, 100, 0);
    let by_name = [&[3u8, ORIGIN_NAME.len() as u8][..], ORIGIN_NAME.as_bytes()].concat();
    let pid = lab.relay_pid("rc");
    let before = threads(pid);
    for batch in 1..=10 {
        socks_batch(&lab, &by_name, SERVER_PORT, 100, batch);
    }
    let after = threads(pid);
    assert_eq!(
        after, before,
        "rc's threads went from {before} to {after} over 1,000 name lookups"
    );
    lab.assert_relays_alive();
}
