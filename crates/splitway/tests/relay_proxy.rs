//! Explicit-proxy listeners (SOCKS5, HTTP CONNECT) driven by curl against a
//! real nginx, and how every listener reports a refused destination.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use support::*;

/// Starts nginx in the server namespace serving `dir/www` on port 80.
fn start_nginx(lab: &mut Lab) {
    let base = lab.dir.path().to_path_buf();
    for sub in ["www", "nginx-tmp"] {
        std::fs::create_dir_all(base.join(sub)).expect("create nginx dir");
    }
    let b = base.display();
    let conf = format!(
        "daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         pid {b}/nginx.pid;\n\
         error_log {b}/nginx-error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n\
           log_format relay '$remote_addr $status $body_bytes_sent';\n\
           access_log {b}/nginx-access.log relay;\n\
           client_body_temp_path {b}/nginx-tmp/body;\n\
           proxy_temp_path {b}/nginx-tmp/proxy;\n\
           fastcgi_temp_path {b}/nginx-tmp/fastcgi;\n\
           uwsgi_temp_path {b}/nginx-tmp/uwsgi;\n\
           scgi_temp_path {b}/nginx-tmp/scgi;\n\
           server {{\n\
             listen {SERVER_V4}:80;\n\
             root {b}/www;\n\
           }}\n\
         }}\n"
    );
    let conf_path = base.join("nginx.conf");
    std::fs::write(&conf_path, conf).expect("write nginx.conf");
    let check = output(lab.server.command("nginx").args([
        "-t",
        "-e",
        &format!("{b}/nginx-error.log"),
        "-p",
        &b.to_string(),
        "-c",
        conf_path.to_str().expect("utf-8"),
    ]));
    assert!(
        check.status.success(),
        "nginx -t failed: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let child = lab
        .server
        .command("nginx")
        .args([
            "-e",
            &format!("{b}/nginx-error.log"),
            "-p",
            &b.to_string(),
            "-c",
            conf_path.to_str().expect("utf-8"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nginx");
    lab.adopt(child);
    let server = &lab.server;
    wait_until(
        Deadline::after(Duration::from_secs(10)),
        "waiting for nginx to listen",
        || listening_ports(server).is_superset_of(&[80]).then_some(()),
    );
}

fn nginx_is_installed() -> bool {
    let found = std::process::Command::new("nginx")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        if std::env::var("SPLITWAY_REQUIRE_NETNS").as_deref() == Ok("1") {
            panic!("nginx is not installed (apt-get install nginx-light)");
        }
        eprintln!("skipping: nginx is not installed");
    }
    found
}

#[test]
fn socks5_and_http_connect_download_from_nginx() {
    require_netns!();
    if !nginx_is_installed() {
        return;
    }
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
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
    for (mode, proxy_args) in &proxies {
        let download = lab.dir.join(&format!("download-{mode}"));
        let out = output(
            lab.client
                .command("curl")
                .args(["-sS", "--fail", "--max-time", "30", "-o"])
                .arg(&download)
                .args(proxy_args)
                .arg(format!("http://{SERVER_V4}/file")),
        );
        assert!(
            out.status.success(),
            "curl via {mode} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            sha256_file(&download),
            served_sha,
            "file downloaded via {mode} differs from the served one"
        );
        lab.wait_counter(
            "rc",
            "splitway_connections_accepted_total",
            // Label values use `_` where config modes use `-`.
            &[("mode", &mode.replace('-', "_"))],
            1.0,
            deadline,
        );
    }
    // nginx saw both requests arrive from the last relay and sent the whole file.
    let access = std::fs::read_to_string(lab.dir.join("nginx-access.log")).unwrap_or_default();
    let expected_line = format!("{LAST_RELAY_V4} 200 {}", served.len);
    assert_eq!(
        access.lines().filter(|l| *l == expected_line).count(),
        2,
        "nginx access log:\n{access}"
    );
    deadline.remaining("proxy downloads");
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
        match http.read(&mut buf) {
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
