//! Safe by default on a cloud host (issue #33), with the attacks as the
//! tests: the README's minimal configs, real sockets, curl as the
//! SOCKS5/CONNECT client.
//!
//! - cloud metadata (169.254.169.254) and services on the relay host's own
//!   addresses are refused on the TPROXY, SOCKS5, CONNECT and peer paths,
//!   counted per reason, and reachable once the operator opts in;
//! - refused clients are reset at accept and hold no descriptor; silent
//!   handshakes are capped per source; a `0.0.0.0` proxy listener without
//!   `allow_clients` serves loopback only;
//! - an unauthenticated flood of the peer port writes a handful of log
//!   lines, with the count of what was not logged;
//! - a proxy request from a relay (nesting) is refused.

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use support::*;

const METADATA_V4: &str = "169.254.169.254";
const SECRET: &str = "instance-credentials-0123456789";

/// An HTTP/1.0 server answering every request with [`SECRET`].
fn serve_secret(server: &TestServer) -> ServeGuard {
    server.serve_forever(|mut s| {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read_exact(&mut byte).is_ok() {
            head.push(byte[0]);
        }
        let _ = write!(
            s,
            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{SECRET}",
            SECRET.len()
        );
    })
}

/// curl in `ns` with `args`; (exit code, body).
fn curl(ns: &splitway_sys::netns::Netns, args: &[&str]) -> (i32, String) {
    let out = ns
        .command("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn socks_url() -> String {
    format!("{ENTRY_V4}:{SOCKS_PORT}")
}

fn connect_url() -> String {
    format!("http://{ENTRY_V4}:{HTTP_CONNECT_PORT}")
}

/// What the three client kinds get for `dst`: the TPROXY client's body
/// (None: reset), curl through SOCKS5 and through CONNECT.
fn three_clients(lab: &Lab, dst: SocketAddr) -> [Option<String>; 3] {
    let url = format!("http://{dst}/");
    let tproxy = connect_in(&lab.client, dst).ok().and_then(|mut s| {
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    });
    let (code, socks) = curl(&lab.client, &["--socks5", &socks_url(), &url]);
    let socks = (code == 0).then_some(socks);
    let (code, connect) = curl(&lab.client, &["-p", "-x", &connect_url(), &url]);
    let connect = (code == 0).then_some(connect);
    [tproxy, socks, connect]
}

fn assert_refused(got: &[Option<String>; 3], what: &str) {
    for (body, client) in got.iter().zip(["tproxy", "socks5", "http-connect"]) {
        assert!(
            body.as_deref().is_none_or(|b| !b.contains(SECRET)),
            "{what}: the {client} client read the secret: {body:?}"
        );
    }
}

fn assert_served(got: &[Option<String>; 3], what: &str) {
    for (body, client) in got.iter().zip(["tproxy", "socks5", "http-connect"]) {
        assert!(
            body.as_deref().is_some_and(|b| b.contains(SECRET)),
            "{what}: the {client} client did not get through: {body:?}"
        );
    }
}

/// The metadata service, on the server side of the chain at
/// 169.254.169.254 (a /32 on the server's interface, routed to by rs), read
/// through the relays by a TPROXY client and by curl through SOCKS5 and
/// CONNECT: refused at rc by default; with rc alone opted in, refused by
/// rs on the header rc sends (the peer path); with both, served.
#[test]
fn cloud_metadata_is_refused_on_every_path_unless_allowed() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    lab.server
        .ip(&["addr", "add", &format!("{METADATA_V4}/32"), "dev", WEST_IF])
        .expect("metadata address");
    lab.rs()
        .ip(&["route", "add", &format!("{METADATA_V4}/32"), "dev", EAST_IF])
        .expect("route to metadata");
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    // rs's completed relay legs are counted below: no window probe.
    configs[0]
        .route("169.254.0.0/16", "rs")
        .accel(|a| a.learned_window = Some(false));
    lab.start_relays(&configs);
    let dst = sock(&format!("{METADATA_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);
    let serving = serve_secret(&server);

    assert_refused(&three_clients(&lab, dst), "default");
    let denied = "splitway_denied_total";
    assert_count(
        &lab,
        "rc",
        denied,
        &[("reason", "link_local")],
        3.0,
        deadline,
    );
    assert_count(
        &lab,
        "rs",
        denied,
        &[("reason", "link_local")],
        0.0,
        deadline,
    );
    // No relay leg carried them.
    assert_count(
        &lab,
        "rs",
        "splitway_connections_closed_total",
        &[("mode", "peer"), ("reason", "completed")],
        0.0,
        deadline,
    );

    // rc opted in: rs still refuses the destination its header names.
    configs[0].policy(|p| p.allow_link_local = Some(true));
    lab.restart_relay("rc", &configs[0]);
    assert_refused(&three_clients(&lab, dst), "rc opted in, rs not");
    assert_count(
        &lab,
        "rs",
        denied,
        &[("reason", "link_local")],
        3.0,
        deadline,
    );

    configs[1].policy(|p| p.allow_link_local = Some(true));
    lab.restart_relay("rs", &configs[1]);
    assert_served(&three_clients(&lab, dst), "both opted in");
    drop(serving);
    lab.assert_relays_alive();
}

/// A service on rc's own client-facing address (10.0.1.2), which a
/// client reaches through the relay as if from inside rc: refused to the
/// TPROXY client (its SYN to 10.0.1.2 is intercepted like any other) and
/// to curl through SOCKS5 and CONNECT, counted as `host_address`; served
/// with `allow_host_addresses`. Loopback clients on rc keep reaching it.
#[test]
fn the_relay_hosts_own_addresses_are_refused_unless_allowed() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::chain(&["rc"]);
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].listen(ListenMode::Socks5, &format!("127.0.0.1:{SOCKS_PORT}"));
    lab.start_relays(&configs);
    let dst = sock(&format!("{ENTRY_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(lab.rc(), dst);
    let serving = serve_secret(&server);

    assert_refused(&three_clients(&lab, dst), "default");
    assert_count(
        &lab,
        "rc",
        "splitway_denied_total",
        &[("reason", "host_address")],
        3.0,
        deadline,
    );
    // A process on rc reaches it without the relay: not refused.
    let (code, body) = curl(
        lab.rc(),
        &[
            "--socks5",
            &format!("127.0.0.1:{SOCKS_PORT}"),
            &format!("http://{dst}/"),
        ],
    );
    assert!(
        code == 0 && body.contains(SECRET),
        "loopback client: {code} {body}"
    );

    // An address added at run time is refused from the next refresh of
    // the list (every 2 s): until then curl still gets through.
    const LATE_V4: &str = "10.0.1.99";
    lab.rc()
        .ip(&["addr", "add", &format!("{LATE_V4}/32"), "dev", WEST_IF])
        .expect("late address");
    let late = sock(&format!("{LATE_V4}:{SERVER_PORT}"));
    let late_server = TestServer::bind(lab.rc(), late);
    let late_serving = serve_secret(&late_server);
    let added = std::time::Instant::now();
    wait_until(deadline, "the new address refused", || {
        let (code, _) = curl(
            &lab.client,
            &["--socks5", &socks_url(), &format!("http://{late}/")],
        );
        (code != 0).then_some(())
    });
    let took = added.elapsed();
    eprintln!("address added at run time: refused after {took:?}");
    assert!(took < Duration::from_secs(4), "refused only after {took:?}");
    drop(late_serving);

    configs[0].policy(|p| p.allow_host_addresses = Some(true));
    lab.restart_relay("rc", &configs[0]);
    assert_served(&three_clients(&lab, dst), "allow_host_addresses");
    drop(serving);
    lab.assert_relays_alive();
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(usize::MAX, |d| d.count())
}

/// The most descriptors `pid` held while `work` ran (sampled every 1 ms).
fn peak_descriptors<T>(pid: u32, work: impl FnOnce() -> T) -> (T, usize) {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = open_descriptors(pid);
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
            peak = peak.max(open_descriptors(pid));
        }
        peak
    });
    let out = work();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    (out, sampler.join().expect("sampler"))
}

/// `n` connections from `src` (an address of `ns`) to `dst` that send
/// nothing: those still open at connect's return (a reset can beat it,
/// but every one reached the relay).
fn silent_connections(
    ns: &splitway_sys::netns::Netns,
    src: &str,
    dst: SocketAddr,
    n: usize,
) -> Vec<TcpStream> {
    let src: IpAddr = src.parse().expect("source address");
    ns.run_in(move || {
        (0..n)
            .filter_map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .expect("socket");
                s.bind(&SocketAddr::new(src, 0).into()).expect("bind");
                match s.connect_timeout(&dst.into(), Duration::from_secs(5)) {
                    Ok(()) => Some(TcpStream::from(s)),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
                    Err(e) => panic!("connect {src} -> {dst}: {e}"),
                }
            })
            .collect()
    })
    .expect("enter namespace")
}

/// How many of `conns` the relay has closed (a reset or EOF is readable).
fn closed_by_relay(conns: &[TcpStream]) -> usize {
    conns
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).expect("nonblocking");
            let mut b = [0u8; 1];
            let closed = match (&**s).read(&mut b) {
                Ok(0) => true,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                Ok(_) => false,
            };
            s.set_nonblocking(false).expect("blocking");
            closed
        })
        .count()
}

/// Issue #33's descriptor exhaustion: silent connections from an address
/// that `allow_clients` does not list, to the SOCKS5 and CONNECT
/// listeners and to a `0.0.0.0` SOCKS5 listener without `allow_clients`
/// (loopback only). Each is reset at accept, so the relay's descriptors
/// stay where they were; then silent connections from an allowed
/// address: at most `handshaking_per_client` (here 16) are held, the rest
/// reset. A legitimate client gets through during both floods.
#[test]
fn refused_and_silent_clients_hold_no_descriptors() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(120));
    const OUTSIDER: &str = "10.0.1.77";
    const SILENT: &str = "10.0.1.78";
    const OPEN_SOCKS_PORT: u16 = 1081;
    let mut lab = Lab::two_relays();
    for a in [OUTSIDER, SILENT] {
        lab.client
            .ip(&["addr", "add", &format!("{a}/24"), "dev", EAST_IF])
            .expect("client address");
    }
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    for l in &mut configs[0].listeners[1..] {
        l.allow_clients = vec![format!("{}/32", link_v4(0, 2, 1)), format!("{SILENT}/32")];
    }
    configs[0]
        .listen(ListenMode::Socks5, &format!("0.0.0.0:{OPEN_SOCKS_PORT}"))
        .limits(|l| l.handshaking_per_client = Some(16));
    lab.start_relays(&configs);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);
    let serving = serve_secret(&server);
    let pid = lab.relay_pid("rc");
    let before = open_descriptors(pid);

    // 3 x 200 connections from the outsider: all reset, none held.
    let (outsider, during) = peak_descriptors(pid, || {
        let mut outsider = Vec::new();
        for port in [SOCKS_PORT, HTTP_CONNECT_PORT, OPEN_SOCKS_PORT] {
            outsider.extend(silent_connections(
                &lab.client,
                OUTSIDER,
                sock(&format!("{ENTRY_V4}:{port}")),
                200,
            ));
        }
        outsider
    });
    let (code, body) = curl(
        &lab.client,
        &["--socks5", &socks_url(), &format!("http://{dst}/")],
    );
    assert!(
        code == 0 && body.contains(SECRET),
        "legitimate client during the flood: {code}"
    );
    let closed = wait_until(deadline, "the outsider's connections reset", || {
        let n = closed_by_relay(&outsider);
        (n == outsider.len()).then_some(n)
    });
    eprintln!(
        "outsider flood: 600 connections ({} open at connect's return, {closed} of them then reset), rc descriptors {before} before, at most {during} during",
        outsider.len()
    );
    assert!(
        during <= before + 20,
        "rc holds {during} descriptors, {before} before"
    );
    assert_count(
        &lab,
        "rc",
        "splitway_denied_total",
        &[("reason", "client")],
        600.0,
        deadline,
    );
    drop(outsider);

    // Loopback clients of the 0.0.0.0 listener are served.
    let (code, body) = curl(
        lab.rc(),
        &[
            "--socks5",
            &format!("127.0.0.1:{OPEN_SOCKS_PORT}"),
            &format!("http://{dst}/"),
        ],
    );
    assert!(
        code == 0 && body.contains(SECRET),
        "loopback client: {code}"
    );

    // An allowed address that only opens connections: 16 held in their
    // handshake, 184 reset at once.
    let (silent, peak) = peak_descriptors(pid, || {
        silent_connections(&lab.client, SILENT, sock(&socks_url()), 200)
    });
    assert_count(
        &lab,
        "rc",
        "splitway_denied_total",
        &[("reason", "handshaking")],
        184.0,
        deadline,
    );
    let held = open_descriptors(pid);
    let (code, body) = curl(
        &lab.client,
        &["--socks5", &socks_url(), &format!("http://{dst}/")],
    );
    assert!(
        code == 0 && body.contains(SECRET),
        "legitimate client during the silent flood: {code}"
    );
    eprintln!(
        "silent flood: 200 connections, rc descriptors {held} after, at most {peak} during (before {before})"
    );
    assert!(
        held <= before + 16 + 20,
        "rc holds {held} descriptors, {before} before"
    );
    let open = silent.len() - closed_by_relay(&silent);
    assert_eq!(open, 16, "held in their handshake");
    drop((silent, serving));
    lab.assert_relays_alive();
}

/// Issue #33's log flood: 2,000 unauthenticated connections to rs's peer
/// port (junk instead of an authentication) write a handful of INFO lines
/// to rs's log, and the next line after the interval carries the count of
/// those not logged. Then 100 silent ones: 64 wait, 36 are reset.
#[test]
fn an_unauthenticated_flood_of_the_peer_port_cannot_flood_the_log() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let peer = sock(&lab.peer_addr(1));
    let log = lab.dir.join("rs.stderr");
    let refused_lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" INFO ") && l.contains("refused"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let before = refused_lines().len();
    let started = std::time::Instant::now();
    let flood = |n: usize| {
        lab.client
            .run_in(move || {
                for _ in 0..n {
                    if let Ok(mut s) = TcpStream::connect_timeout(&peer, Duration::from_secs(5)) {
                        let _ = s.write_all(&[0xff; 64]);
                        let _ = s.shutdown(std::net::Shutdown::Write);
                    }
                }
            })
            .expect("enter namespace");
    };
    flood(2000);
    let closed = "splitway_connections_closed_total";
    let refused = |lab: &Lab| {
        let m = lab.metrics("rs");
        [
            "auth_failed",
            "bad_request",
            "client_reset",
            "handshake_timeout",
        ]
        .iter()
        .map(|r| m.counter(closed, &[("mode", "peer"), ("reason", r)]))
        .sum::<f64>()
    };
    wait_until(deadline, "rs refused the flood", || {
        (refused(&lab) >= 2000.0).then_some(())
    });
    let flood_secs = started.elapsed().as_secs_f64();
    let lines = refused_lines().len() - before;
    eprintln!("2,000 unauthenticated connections in {flood_secs:.1} s: {lines} INFO refusal lines");
    assert!(
        lines <= 2 + flood_secs as usize / 5,
        "{lines} INFO lines for 2,000 refusals in {flood_secs:.1} s"
    );
    // After the interval, the next refusal's line says how many were not
    // logged.
    std::thread::sleep(Duration::from_secs(6));
    flood(1);
    let line = wait_until(deadline, "a refusal line with a count", || {
        refused_lines().into_iter().skip(before).find(|l| {
            l.split("suppressed=")
                .nth(1)
                .and_then(|v| v.split(' ').next())
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|n| n >= 1000)
        })
    });
    eprintln!("{line}");

    // Silent connections to the peer port: 64 (the default cap) wait
    // unauthenticated, the rest are reset at accept.
    let silent = silent_connections(&lab.client, &link_v4(0, 2, 1), peer, 100);
    assert_count(
        &lab,
        "rs",
        "splitway_denied_total",
        &[("reason", "handshaking")],
        36.0,
        deadline,
    );
    assert_eq!(silent.len() - closed_by_relay(&silent), 64, "waiting");
    // rc's pooled legs (another source) still authenticate: a transfer.
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);
    transfer_client_to_server(&lab.client, &server, dst, MIB, LAST_RELAY_V4);
    drop(silent);
    lab.assert_relays_alive();
}

/// Issue #33's nesting: a proxy request from a relay is a chain nested
/// through the relays. rc refuses SOCKS5 from rs's address (its
/// `[[peer]]`), rs refuses it from rc's (an upstream that authenticated
/// there), although both allow lists cover them; an end client of rs's
/// listener is served; `allow_relay_clients` lets rs through rc.
#[test]
fn proxy_requests_from_relays_are_refused_unless_allowed() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(120));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].listeners[1].allow_clients = vec!["10.0.0.0/8".into()];
    configs[1].listener(RawListener {
        allow_clients: vec!["10.0.0.0/8".into()],
        ..RawListener::new(ListenMode::Socks5, format!("0.0.0.0:{SOCKS_PORT}"))
    });
    lab.start_relays(&configs);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let server = TestServer::bind(&lab.server, dst);
    let serving = serve_secret(&server);
    let url = format!("http://{dst}/");
    // rc's pool has authenticated to rs: rs knows rc as an upstream.
    wait_until(deadline, "rc's pooled legs reached rs", || {
        (lab.metrics("rs")
            .counter("splitway_connections_accepted_total", &[("mode", "peer")])
            > 0.0)
            .then_some(())
    });
    let rs_socks = format!("{}:{SOCKS_PORT}", link_v4(1, 2, 2));

    let (code, body) = curl(lab.rs(), &["--socks5", &socks_url(), &url]);
    assert!(
        code != 0 && !body.contains(SECRET),
        "rs through rc: {code} {body}"
    );
    let (code, body) = curl(lab.rc(), &["--socks5", &rs_socks, &url]);
    assert!(
        code != 0 && !body.contains(SECRET),
        "rc through rs: {code} {body}"
    );
    let (code, body) = curl(&lab.client, &["--socks5", &rs_socks, &url]);
    assert!(
        code == 0 && body.contains(SECRET),
        "a client of rs: {code} {body}"
    );
    for relay in ["rc", "rs"] {
        assert_count(
            &lab,
            relay,
            "splitway_denied_total",
            &[("reason", "nesting")],
            1.0,
            deadline,
        );
    }

    configs[0].policy(|p| p.allow_relay_clients = Some(true));
    lab.restart_relay("rc", &configs[0]);
    let (code, body) = curl(lab.rs(), &["--socks5", &socks_url(), &url]);
    assert!(
        code == 0 && body.contains(SECRET),
        "rs through rc, allowed: {code} {body}"
    );
    drop(serving);
    lab.assert_relays_alive();
}

/// IPv6: AWS's metadata address (fd00:ec2::254, not link-local by prefix)
/// to a TPROXY client over IPv6, fe80::/10 through SOCKS5, and multicast
/// through SOCKS5 and CONNECT: each refused before any route, counted by
/// its reason.
#[test]
fn ipv6_metadata_link_local_and_multicast_are_refused() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], true);
    lab.start_relays(&configs);
    tproxy_reset(&lab.client, sock(&format!("[fd00:ec2::254]:{SERVER_PORT}")));
    for url in [
        format!("http://[fe80::1]:{SERVER_PORT}/"),
        format!("http://[ff02::1]:{SERVER_PORT}/"),
        format!("http://224.0.0.1:{SERVER_PORT}/"),
    ] {
        let (code, _) = curl(&lab.client, &["--socks5", &socks_url(), &url]);
        assert_ne!(code, 0, "{url}");
    }
    let (code, _) = curl(
        &lab.client,
        &[
            "-p",
            "-x",
            &connect_url(),
            &format!("http://255.255.255.255:{SERVER_PORT}/"),
        ],
    );
    assert_ne!(code, 0, "CONNECT to broadcast");
    let denied = "splitway_denied_total";
    assert_count(
        &lab,
        "rc",
        denied,
        &[("reason", "link_local")],
        2.0,
        deadline,
    );
    assert_count(
        &lab,
        "rc",
        denied,
        &[("reason", "multicast")],
        3.0,
        deadline,
    );
    lab.assert_relays_alive();
}
