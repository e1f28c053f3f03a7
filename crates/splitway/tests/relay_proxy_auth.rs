//! Proxy credentials on explicit listeners (#34 item 7): SOCKS5
//! username/password (RFC 1929) and HTTP `Proxy-Authorization: Basic`, from
//! a listener's `auth_file`, driven by curl, wget and ncat against nginx.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};
use support::*;

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// How a client reaches the origin through rc.
#[derive(Clone, Copy, Debug)]
enum Client {
    CurlSocks,
    CurlConnect,
    CurlAbsolute,
    Wget,
    NcatSocks,
    NcatConnect,
}

const ALL: [Client; 6] = [
    Client::CurlSocks,
    Client::CurlConnect,
    Client::CurlAbsolute,
    Client::Wget,
    Client::NcatSocks,
    Client::NcatConnect,
];

/// The command that fetches `/file` from nginx through rc with `creds`
/// (`user:password`, or none), writing the body (curl, wget) or the whole
/// response (ncat) to `out`.
fn fetch(lab: &Lab, client: Client, creds: Option<&str>, out: &Path) -> Command {
    let socks = format!("{ENTRY_V4}:{SOCKS_PORT}");
    let http = format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}");
    let url = format!("http://{SERVER_V4}/file");
    let curl = |proxy: String, tunnel: bool| {
        let mut c = lab.client.command("curl");
        c.args(["-sS", "--fail", "--max-time", "30", "-o"])
            .arg(out)
            .args(["-x", &proxy]);
        if tunnel {
            c.arg("-p");
        }
        if let Some(creds) = creds {
            c.args(["--proxy-user", creds]);
        }
        c.arg(&url);
        c
    };
    match client {
        Client::CurlSocks => curl(format!("socks5h://{socks}"), false),
        Client::CurlConnect => curl(format!("http://{http}"), true),
        Client::CurlAbsolute => curl(format!("http://{http}"), false),
        Client::Wget => {
            let mut c = lab.client.command("wget");
            c.args(["-q", "--tries=1", "--timeout=30", "-O"])
                .arg(out)
                .env("http_proxy", format!("http://{http}"));
            if let Some((user, password)) = creds.and_then(|c| c.split_once(':')) {
                c.arg(format!("--proxy-user={user}"))
                    .arg(format!("--proxy-password={password}"));
            }
            c.arg(&url);
            c
        }
        Client::NcatSocks | Client::NcatConnect => {
            let (proxy, kind) = match client {
                Client::NcatSocks => (socks, "socks5"),
                _ => (http, "http"),
            };
            let mut c = lab.client.command("sh");
            let auth = creds.map_or(String::new(), |c| format!("--proxy-auth {c}"));
            c.arg("-c").arg(format!(
                "printf 'GET /file HTTP/1.0\\r\\nHost: {SERVER_V4}\\r\\n\\r\\n' | ncat --no-shutdown --wait 30 --proxy {proxy} --proxy-type {kind} {auth} {SERVER_V4} 80 > '{}'",
                out.display()
            ));
            c
        }
    }
}

/// The body a client wrote: all of curl's and wget's output, ncat's after
/// the response head.
fn body(client: Client, out: &Path) -> Vec<u8> {
    let bytes = std::fs::read(out).unwrap_or_default();
    match client {
        Client::NcatSocks | Client::NcatConnect => {
            match bytes.windows(4).position(|w| w == b"\r\n\r\n") {
                Some(end) => bytes[end + 4..].to_vec(),
                None => Vec::new(),
            }
        }
        _ => bytes,
    }
}

fn write_users(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the users file");
}

/// Every client downloads with the file's credentials (sha256 checked) and
/// fails without them or with a wrong password, each refusal counted; HTTP
/// clients get a 407 that asks for Basic and says why. A reload re-reads
/// the file: the old password is refused and the new one works.
#[test]
fn proxy_clients_need_the_users_files_credentials_and_a_reload_rereads_it() {
    require_netns!();
    if !nginx_is_installed() {
        return;
    }
    let deadline = Deadline::after(Duration::from_secs(150));
    let mut lab = Lab::two_relays();
    let users = lab.dir.join("proxy-users");
    write_users(&users, "# who may use rc's proxies\nalice:s3cret\n");
    let mut configs = lab.default_configs(&[80], false);
    for l in &mut configs[0].listeners {
        if matches!(l.mode, ListenMode::Socks5 | ListenMode::HttpConnect) {
            l.auth_file = Some(users.display().to_string());
        }
    }
    // This test's wrong tries are clients', not a guesser's: no cut-off
    // (the next test has it).
    configs[0].sections.limits = Some(RawLimits {
        credential_failures: Some(0),
        ..RawLimits::default()
    });
    lab.start_relays(&configs);
    start_nginx(&mut lab);
    let served = write_random_file(&lab.dir.join("www/file"), 2 * MIB + 17, 0xA07);
    let mut downloads = 0;
    let mut refusals = 0.0;

    let mut round = |lab: &Lab, creds: Option<&str>, accepted: bool, refusals: &mut f64| {
        for client in ALL {
            let out = lab
                .dir
                .join(&format!("out-{client:?}-{}", creds.unwrap_or("none")));
            let run = output(&mut fetch(lab, client, creds, &out));
            let got = body(client, &out);
            // ncat's HTTP proxy client sends its credentials only when a
            // 407 asks for them: one refused connection first.
            if matches!(client, Client::NcatConnect) && creds.is_some() {
                *refusals += 1.0;
            }
            if accepted {
                assert!(
                    run.status.success() && sha256(&got) == served.sha256,
                    "{client:?} with {creds:?}: {} bytes, {}: {}",
                    got.len(),
                    run.status,
                    String::from_utf8_lossy(&run.stderr)
                );
                downloads += 1;
            } else {
                assert!(
                    got.len() < 1024,
                    "{client:?} with {creds:?} downloaded through rc: {} bytes",
                    got.len()
                );
                *refusals += 1.0;
            }
        }
    };
    round(&lab, Some("alice:s3cret"), true, &mut refusals);
    round(&lab, None, false, &mut refusals);
    round(&lab, Some("alice:wrong"), false, &mut refusals);
    round(&lab, Some("mallory:s3cret"), false, &mut refusals);
    let counted = lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "credentials")],
        refusals,
        deadline,
    );
    assert_eq!(counted, refusals, "every refusal counted once");
    for mode in ["socks5", "http_connect"] {
        let failed = lab.metrics("rc").counter(
            "splitway_connections_closed_total",
            &[("mode", mode), ("reason", "auth_failed")],
        );
        assert!(failed > 0.0, "{mode}: no auth_failed close counted");
    }

    // What an HTTP client is told: 407, Basic, and why.
    let proxy = format!("http://{ENTRY_V4}:{HTTP_CONNECT_PORT}");
    for (creds, why) in [
        (None, "proxy authentication required"),
        (Some("alice:wrong"), "wrong user name or password"),
    ] {
        let mut c = lab.client.command("curl");
        c.args(["-sS", "-D", "-", "--max-time", "30", "-x", &proxy]);
        if let Some(creds) = creds {
            c.args(["--proxy-user", creds]);
        }
        let text =
            String::from_utf8_lossy(&output(c.arg(format!("http://{SERVER_V4}/file"))).stdout)
                .into_owned();
        assert!(text.starts_with("HTTP/1.1 407 "), "{text}");
        assert!(
            text.contains("Proxy-Authenticate: Basic realm=\"splitway\""),
            "{text}"
        );
        assert!(text.contains(why), "the 407 does not say {why:?}: {text}");
        refusals += 1.0;
    }
    let log = lab.relay_log("rc");
    assert!(
        log.contains(
            "proxy credentials refused for user \\\"alice\\\": wrong user name or password"
        ) || log
            .contains("proxy credentials refused for user \"alice\": wrong user name or password"),
        "rc does not log the refused user:\n{log}"
    );
    assert!(
        !log.contains("s3cret") && !log.contains("wrong\""),
        "a password was logged"
    );

    // A reload re-reads the file: alice's new password, and bob.
    write_users(&users, "alice:n3w-pass\nbob:b0b\n");
    let out = lab.ctl("rc", &["reload"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("auth_file: {} (1 user,", users.display()))
            && said.contains("(2 users"),
        "the reload does not show the changed users:\n{said}"
    );
    let ok = lab.dir.join("after-reload");
    for (creds, accepted) in [
        ("alice:s3cret", false),
        ("alice:n3w-pass", true),
        ("bob:b0b", true),
    ] {
        for client in [Client::CurlSocks, Client::CurlConnect] {
            let _ = std::fs::remove_file(&ok);
            let run = output(&mut fetch(&lab, client, Some(creds), &ok));
            assert_eq!(
                run.status.success() && sha256(&body(client, &ok)) == served.sha256,
                accepted,
                "{client:?} with {creds} after the reload: {}",
                String::from_utf8_lossy(&run.stderr)
            );
            if !accepted {
                refusals += 1.0;
            }
        }
    }
    let counted = lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "credentials")],
        refusals,
        deadline,
    );
    assert_eq!(counted, refusals);
    // nginx served exactly the accepted downloads.
    let access = std::fs::read_to_string(lab.dir.join("nginx-access.log")).unwrap_or_default();
    let line = format!("{LAST_RELAY_V4} 200 {}", served.len);
    assert_eq!(
        access.lines().filter(|l| *l == line).count(),
        downloads + 4,
        "nginx access log:\n{access}"
    );
    deadline.remaining("proxy credentials");
    lab.assert_relays_alive();
}

/// A password-guessing burst over SOCKS5 from one address: the first
/// `limits.credential_failures` (10) guesses are refused in the protocol,
/// every later one is reset at accept; each is counted, the log carries a
/// line per reason, five seconds and source /24, and a neighbour with the
/// right password is served, every byte both ways.
#[test]
fn a_password_guessing_burst_is_cut_off_counted_and_does_not_flood_the_log() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::two_relays();
    let users = lab.dir.join("proxy-users");
    write_users(&users, "alice:s3cret\n");
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    for l in &mut configs[0].listeners {
        if l.mode == ListenMode::Socks5 {
            l.auth_file = Some(users.display().to_string());
        }
    }
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, sock(&format!("{SERVER_V4}:{SERVER_PORT}")));
    let socks = sock(&format!("{ENTRY_V4}:{SOCKS_PORT}"));
    let log_before = lab.relay_log("rc").len();
    const GUESSES: usize = 200;
    const ANSWERED: usize = 10;
    let guessing = std::time::Instant::now();
    let mut answered = 0;
    for i in 0..GUESSES {
        let mut hello = vec![5, 1, 2, 1, 5];
        hello.extend_from_slice(b"alice");
        let password = format!("guess{i}");
        hello.push(password.len() as u8);
        hello.extend_from_slice(password.as_bytes());
        match socks5_answer(&lab, socks, &hello, None) {
            Some(answer) => {
                assert_eq!(answer, [5, 2, 1, 1], "guess {i}: method 02, then refused");
                answered += 1;
            }
            None => assert!(i >= ANSWERED, "guess {i} was reset, not answered"),
        }
    }
    eprintln!(
        "{GUESSES} guesses in {:.2?}: {answered} refused in the protocol, the rest reset at accept",
        guessing.elapsed()
    );
    assert_eq!(answered, ANSWERED);
    for (reason, n) in [("credentials", ANSWERED), ("guessing", GUESSES - ANSWERED)] {
        let labels = [("reason", reason)];
        let counted = lab.wait_counter("rc", "splitway_denied_total", &labels, n as f64, deadline);
        assert_eq!(counted, n as f64, "{reason}");
    }
    let log = lab.relay_log("rc");
    let info_lines: Vec<&str> = log[log_before..]
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("refused"))
        .collect();
    eprintln!(
        "{} info lines:\n{}",
        info_lines.len(),
        info_lines.join("\n")
    );
    assert!(
        (2..=4).contains(&info_lines.len()),
        "{} info lines for {GUESSES} refusals:\n{}",
        info_lines.len(),
        info_lines.join("\n")
    );
    assert!(!log.contains("guess1"), "a password was logged");

    // The guesser's address is cut off even with the right password; a
    // neighbour on its /24 is not, and is served every byte both ways.
    let mut right = vec![5, 1, 2, 1, 5];
    right.extend_from_slice(b"alice\x06s3cret");
    assert_eq!(socks5_answer(&lab, socks, &right, None), None);
    let neighbour: std::net::Ipv4Addr = "10.0.1.9".parse().unwrap();
    add_client_address(&lab, neighbour);
    let mut s = connect_from(&lab.client, &neighbour.to_string(), socks);
    let mut hello = right.clone();
    hello.extend_from_slice(&[5, 1, 0, 1]);
    hello.extend_from_slice(&SERVER_V4.parse::<std::net::Ipv4Addr>().unwrap().octets());
    hello.extend_from_slice(&SERVER_PORT.to_be_bytes());
    let upload: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    hello.extend_from_slice(&upload);
    s.write_all(&hello)
        .expect("greeting, credentials, request, data");
    s.shutdown(std::net::Shutdown::Write).expect("half-close");
    let mut answer = [0u8; 4 + 10];
    s.read_exact(&mut answer).expect("accepted");
    assert_eq!(&answer[..6], &[5, 2, 1, 0, 5, 0], "{answer:?}");
    let (mut at_server, _) = server.accept(Duration::from_secs(10));
    let mut received = Vec::new();
    at_server.read_to_end(&mut received).expect("server reads");
    assert_eq!(sha256(&received), sha256(&upload), "upload differs");
    let download: Vec<u8> = upload.iter().rev().copied().collect();
    at_server.write_all(&download).expect("server writes");
    drop(at_server);
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("client reads");
    assert_eq!(sha256(&got), sha256(&download), "download differs");
    deadline.remaining("password guessing");
    lab.assert_relays_alive();
}

/// Sends `hello` to the SOCKS5 listener (from `source`, if given) and
/// reads its answer to the end: `None` when the relay reset the connection
/// without a byte.
fn socks5_answer(
    lab: &Lab,
    socks: std::net::SocketAddr,
    hello: &[u8],
    source: Option<std::net::Ipv4Addr>,
) -> Option<Vec<u8>> {
    let mut s = match source {
        Some(ip) => connect_from(&lab.client, &ip.to_string(), socks),
        None => match connect_in(&lab.client, socks) {
            Ok(s) => s,
            // Reset at accept before connect() returned.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("connect to the SOCKS5 listener: {e}"),
        },
    };
    // A reset can come before the write or after it.
    let _ = s.write_all(hello);
    let mut answer = Vec::new();
    match s.read_to_end(&mut answer) {
        Ok(_) if !answer.is_empty() => Some(answer),
        Ok(_) => None,
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
            assert!(answer.is_empty(), "reset after {answer:?}");
            None
        }
    }
}

/// Gives the client namespace a second address on its link.
fn add_client_address(lab: &Lab, ip: std::net::Ipv4Addr) {
    let out = output(lab.client.command("ip").args(["-o", "-4", "addr", "show"]));
    let text = String::from_utf8_lossy(&out.stdout);
    let dev = text
        .lines()
        .find(|l| l.contains("10.0.1.1/"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no 10.0.1.1 in the client namespace:\n{text}"))
        .to_owned();
    let out =
        output(
            lab.client
                .command("ip")
                .args(["addr", "add", &format!("{ip}/24"), "dev", &dev]),
        );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
