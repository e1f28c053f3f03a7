//! Faults around a relay chain: a relay crashing or restarting under
//! traffic, a peer unreachable then back, refusals through pooled legs and
//! longer chains, half-closes and resets under concurrent load, and a slow
//! reader that must not make a relay buffer without bound.
//!
//! What the single-connection tests in relay_tcp_semantics.rs,
//! relay_proxy.rs and relay_accel.rs already cover is not repeated here.
//!
//! Every byte that arrives is checked against what was sent: whole streams
//! by sha256, streams cut short on purpose byte for byte against the
//! sender's pattern. With `SPLITWAY_FAULTS_LONG=1` the same tests move much
//! more data (≥ 10 GB over the file); each test prints the bytes it checked
//! and the running total.

mod support;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use socket2::SockRef;
use support::*;

fn long_mode() -> bool {
    std::env::var("SPLITWAY_FAULTS_LONG").as_deref() == Ok("1")
}

/// `short` bytes by default (CI), `long` with `SPLITWAY_FAULTS_LONG=1`.
fn size(short: u64, long: u64) -> u64 {
    if long_mode() { long } else { short }
}

static CHECKED: AtomicU64 = AtomicU64::new(0);

/// Adds to the suite's count of verified bytes and prints it.
fn count_checked(test: &str, bytes: u64) {
    let total = CHECKED.fetch_add(bytes, Ordering::SeqCst) + bytes;
    eprintln!(
        "[relay_faults] {test}: {bytes} bytes checked ({:.2} GB); suite total so far {total} bytes ({:.2} GB){}",
        bytes as f64 / 1e9,
        total as f64 / 1e9,
        if long_mode() { " [long mode]" } else { "" }
    );
}

/// Reads are bounded tighter than the harness default: a reader waiting
/// for a verdict must get one well inside the test's deadline.
const FAULT_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// A read that ended in an error which is a genuine connection failure,
/// not our own read timeout.
fn assert_connection_error(e: &io::Error, who: &str, after: u64) {
    assert!(
        !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{who}: no verdict after {after} bytes: the read timed out ({e}) instead of seeing a reset"
    );
}

/// Whether the connection was reset (TCP state CLOSE) rather than ended
/// by the peer's FIN.
fn reset_seen(s: &TcpStream) -> bool {
    const TCP_CLOSE: u8 = 7;
    splitway_sys::sock::tcp_info(s).is_ok_and(|i| i.state == TCP_CLOSE)
}

/// Writes the pattern of `seed` until a write fails or `stop` is set;
/// returns the bytes written and the error, if any.
fn write_until_error(
    stream: &mut TcpStream,
    seed: u64,
    stop: &AtomicBool,
) -> (u64, Option<io::Error>) {
    let mut pattern = PatternGen::new(seed);
    let mut sent = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let chunk = pattern.next_chunk();
        if let Err(e) = stream.write_all(chunk) {
            return (sent, Some(e));
        }
        sent += chunk.len() as u64;
    }
    (sent, None)
}

/// Reads and checks the pattern of `seed` until EOF or error; calls
/// `at(received)` after each read (to inject a fault mid-stream).
fn check_until_end(
    stream: &mut TcpStream,
    seed: u64,
    who: &str,
    mut at: impl FnMut(u64),
) -> (u64, io::Result<()>) {
    let mut check = PatternCheck::new(seed);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (check.checked, Ok(())),
            Ok(n) => {
                check.feed(&buf[..n], who);
                at(check.checked);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (check.checked, Err(e)),
        }
    }
}

/// SOCKS5 CONNECT to an IPv4 destination through the entry relay: the
/// stream once the relay answered success, or the reply code it sent.
fn socks_connect(lab: &Lab, dst: SocketAddr) -> Result<TcpStream, u8> {
    let SocketAddr::V4(dst) = dst else {
        panic!("socks_connect takes IPv4 destinations")
    };
    let mut s = connect_in(&lab.client, sock(&format!("{ENTRY_V4}:{SOCKS_PORT}")))
        .expect("connect to the SOCKS listener");
    s.write_all(&[5, 1, 0]).expect("socks greeting");
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).expect("socks method choice");
    assert_eq!(choice, [5, 0], "SOCKS5 method selection");
    let mut req = vec![5, 1, 0, 1];
    req.extend_from_slice(&dst.ip().octets());
    req.extend_from_slice(&dst.port().to_be_bytes());
    s.write_all(&req).expect("socks connect request");
    // VER REP RSV ATYP(IPv4) ADDR(4) PORT(2)
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).expect("socks reply");
    assert_eq!(reply[0], 5, "SOCKS version in reply {reply:?}");
    if reply[1] == 0 { Ok(s) } else { Err(reply[1]) }
}

/// A transparent connection whose setup failed downstream must be reset:
/// either the connect itself or the first read reports it.
fn expect_transparent_reset(lab: &Lab, dst: SocketAddr, what: &str) {
    match connect_in(&lab.client, dst) {
        Ok(mut s) => {
            s.set_read_timeout(Some(FAULT_READ_TIMEOUT))
                .expect("timeout");
            expect_reset(&mut s, what);
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("{what}: expected a reset, got {e}"),
    }
}

/// Full sha256-checked transfers both ways through the chain; returns the
/// bytes checked.
fn transfers_both_ways(lab: &Lab, server: &TestServer, len: u64) -> u64 {
    transfer_server_to_client(&lab.client, server, server_v4(), len, LAST_RELAY_V4);
    transfer_client_to_server(&lab.client, server, server_v4(), len, LAST_RELAY_V4);
    2 * len
}

// ---------------------------------------------------------------------------
// (a) the next relay crashes mid-transfer
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Dir {
    Download,
    Upload,
}

/// rs dies (SIGKILL) in the middle of a transfer. Whoever is receiving must
/// see the connection fail, never a clean EOF that would pass for the end of
/// a shorter transfer; the prefix that did arrive must be intact. After a
/// restart the chain works again.
fn next_relay_killed_mid_transfer(dir: Dir) {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(if long_mode() { 900 } else { 60 }));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let kill_after = size(8 * MIB, 1024 * MIB);
    let seed = 0xFA_0A00 + dir as u64;

    let client = connect_in(&lab.client, server_v4()).expect("connect");
    let (conn, peer) = server.accept(Duration::from_secs(20));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let (mut receiver, mut sender, who) = match dir {
        Dir::Download => (client, conn, "client (download)"),
        Dir::Upload => {
            client.set_read_timeout(None).expect("timeout");
            (conn, client, "server (upload)")
        }
    };
    receiver
        .set_read_timeout(Some(FAULT_READ_TIMEOUT))
        .expect("timeout");
    let stop = Arc::new(AtomicBool::new(false));
    let stop_sender = stop.clone();
    let sending = std::thread::spawn(move || write_until_error(&mut sender, seed, &stop_sender));

    let mut killed = false;
    let (received, end) = check_until_end(&mut receiver, seed, who, |got| {
        if !killed && got >= kill_after {
            lab.kill_relay("rs");
            killed = true;
        }
    });
    stop.store(true, Ordering::SeqCst);
    assert!(
        killed,
        "{who}: the stream ended after {received} bytes, before rs was killed: {end:?}"
    );
    match end {
        Ok(()) => panic!(
            "{who}: clean EOF after {received} bytes although rs was killed mid-transfer: a truncated stream passes for a complete one"
        ),
        Err(e) => {
            assert_connection_error(&e, who, received);
            eprintln!("{who}: {received} bytes intact, then {e} ({:?})", e.kind());
        }
    }
    let (sent, send_end) = sending.join().expect("sender thread");
    eprintln!("sender: {sent} bytes written, ended with {send_end:?}");
    assert!(received <= sent);
    deadline.remaining("waiting for the crash verdict");

    lab.restart_relay("rs", &configs[1]);
    let recovered = transfers_both_ways(&lab, &server, size(4 * MIB, 1024 * MIB));
    deadline.remaining("transfers after the restart");
    lab.assert_relays_alive();
    count_checked(
        &format!("next_relay_killed_mid_{dir:?}"),
        received + recovered,
    );
}

#[test]
fn next_relay_killed_mid_download() {
    next_relay_killed_mid_transfer(Dir::Download);
}

#[test]
fn next_relay_killed_mid_upload() {
    next_relay_killed_mid_transfer(Dir::Upload);
}

// ---------------------------------------------------------------------------
// (b) a peer unreachable, then back
// ---------------------------------------------------------------------------

fn status(lab: &Lab, relay: &str) -> splitway_api::Status {
    admin_status(lab.relay_ns(relay)).expect("GET /status")
}

fn rc_pool(lab: &Lab) -> splitway_api::Pool {
    status(lab, "rc").peers[0]
        .pool
        .clone()
        .expect("rc /status has a pool")
}

/// rs crashes: every new connection fails in its own protocol (SOCKS5 host
/// unreachable, a reset for transparent clients) without waiting long, the
/// pool cannot refill; once rs is back the pool refills to its watermark and
/// connections succeed again.
#[test]
fn peer_unreachable_then_back() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(if long_mode() { 600 } else { 60 }));
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    configs[0].accel(|a| a.pool = Some(true));
    configs[0].peers[0].pool = Some(pool_bounds(2, 4));
    lab.start_relays(&configs);
    wait_until(deadline, "pool filled", || {
        (rc_pool(&lab).level >= 4).then_some(())
    });
    let server = TestServer::bind(&lab.server, server_v4());
    let mut checked = transfers_both_ways(&lab, &server, size(MIB, 512 * MIB));

    lab.kill_relay("rs");
    // More attempts than pooled connections: the dead pooled legs are
    // skipped or fail, and fresh dials are refused by rs's empty port.
    for attempt in 0..6 {
        let started = Instant::now();
        match socks_connect(&lab, server_v4()) {
            Ok(_) => panic!("SOCKS attempt {attempt}: success while rs is down"),
            Err(code) => assert_eq!(
                code, 4,
                "SOCKS attempt {attempt}: reply should be 4 (host unreachable), got {code}"
            ),
        }
        expect_transparent_reset(&lab, server_v4(), "transparent client while rs is down");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a refused peer should fail fast, took {:?}",
            started.elapsed()
        );
    }
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "connect_unreachable")],
        12.0,
        deadline,
    );
    wait_until(deadline, "rc's pool noticing rs is gone", || {
        (rc_pool(&lab).dial_failures >= 1).then_some(())
    });
    server.assert_no_pending_connection();

    lab.restart_relay("rs", &configs[1]);
    wait_until(deadline, "pool refilled after rs came back", || {
        let st = status(&lab, "rc");
        let pool = st.peers[0].pool.as_ref()?;
        (pool.level >= pool.high).then_some(())
    });
    checked += transfers_both_ways(&lab, &server, size(MIB, 512 * MIB));
    // And through SOCKS5.
    let mut s = socks_connect(&lab, server_v4()).expect("SOCKS after rs came back");
    let (mut conn, _) = server.accept(Duration::from_secs(20));
    let len = size(MIB, 256 * MIB);
    // The server reads while the client writes: more than the socket
    // buffers hold is in flight.
    let receiving = std::thread::spawn(move || recv_all(&mut conn).expect("server receive"));
    let sent = send_pattern(&mut s, len, 0xB0B).expect("socks client send");
    s.shutdown(Shutdown::Write).expect("shutdown(Write)");
    let got = receiving.join().expect("server thread");
    assert_eq!(got, sent, "SOCKS upload after rs came back");
    checked += len;
    deadline.remaining("peer back");
    lab.assert_relays_alive();
    count_checked("peer_unreachable_then_back", checked);
}

// ---------------------------------------------------------------------------
// (c) refusals the single-hop tests do not reach
// ---------------------------------------------------------------------------

/// A refusing server is reported as "connection refused" (SOCKS5 5) and as
/// a reset (transparent) through a three-relay chain, where the refusal has
/// to cross two relay hops, and through pooled legs, where the header rides
/// an already-open connection. A server that accepts and then resets at
/// once is a reset too, never a clean close.
#[test]
fn refusals_through_three_relays_and_pooled_legs() {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::chain(&["rc", "rm", "rs"]);
    let mut configs = lab.default_configs(&[SERVER_PORT, REFUSED_PORT], false);
    for cfg in &mut configs[..2] {
        cfg.accel(|a| a.pool = Some(true));
        cfg.peers[0].pool = Some(pool_bounds(2, 4));
    }
    lab.start_relays(&configs);
    wait_until(deadline, "pools filled", || {
        let rc = status(&lab, "rc").peers[0].pool.as_ref()?.level;
        let rm = status(&lab, "rm").peers[0].pool.as_ref()?.level;
        (rc >= 4 && rm >= 4).then_some(())
    });
    let refused = sock(&format!("{SERVER_V4}:{REFUSED_PORT}"));
    for _ in 0..3 {
        assert_eq!(
            socks_connect(&lab, refused).err(),
            Some(5),
            "SOCKS5 reply through three relays should be 5 (connection refused)"
        );
        expect_transparent_reset(&lab, refused, "transparent client of a refused port");
    }
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "connect_refused")],
        6.0,
        deadline,
    );
    let taken = lab
        .metrics("rc")
        .counter("splitway_pool_events_total", &[("event", "taken")]);
    assert!(taken >= 1.0, "the refusals should have used pooled legs");

    // Accept, then reset before a single byte.
    let server = TestServer::bind(&lab.server, server_v4());
    let guard = server.serve_forever(|conn| {
        SockRef::from(&conn)
            .set_linger(Some(Duration::ZERO))
            .expect("SO_LINGER 0");
        drop(conn);
    });
    for _ in 0..3 {
        expect_transparent_reset(
            &lab,
            server_v4(),
            "transparent client of a resetting server",
        );
        // The reset may overtake the last relay's success Reply (held back
        // with MSG_MORE for the server's first bytes, then discarded by the
        // abortive close): the SOCKS client then gets an error reply
        // instead of success followed by a reset. Either is a failure.
        match socks_connect(&lab, server_v4()) {
            Ok(mut s) => {
                s.set_read_timeout(Some(FAULT_READ_TIMEOUT))
                    .expect("timeout");
                expect_reset(&mut s, "SOCKS client of a resetting server");
            }
            Err(code) => eprintln!("SOCKS client of a resetting server: reply {code}"),
        }
    }
    // The guard shuts the listening socket down: listen anew.
    drop(guard);
    drop(server);
    let server = TestServer::bind(&lab.server, server_v4());

    // The chain still carries data.
    let len = size(2 * MIB, 256 * MIB);
    transfer_client_to_server(&lab.client, &server, server_v4(), len, LAST_RELAY_V4);
    deadline.remaining("refusals");
    lab.assert_relays_alive();
    count_checked("refusals_through_three_relays_and_pooled_legs", len);
}

// ---------------------------------------------------------------------------
// (d) half-close under load
// ---------------------------------------------------------------------------

/// Request header of the load tests: role, upload length, download length,
/// seed (client's stream uses seed, the server's seed + 1).
const LOAD_HEADER: usize = 25;

fn load_header(role: u8, up: u64, down: u64, seed: u64) -> [u8; LOAD_HEADER] {
    let mut h = [0u8; LOAD_HEADER];
    h[0] = role;
    h[1..9].copy_from_slice(&up.to_be_bytes());
    h[9..17].copy_from_slice(&down.to_be_bytes());
    h[17..25].copy_from_slice(&seed.to_be_bytes());
    h
}

fn parse_load_header(h: &[u8; LOAD_HEADER]) -> (u8, u64, u64, u64) {
    let u = |r: std::ops::Range<usize>| u64::from_be_bytes(h[r].try_into().expect("8 bytes"));
    (h[0], u(1..9), u(9..17), u(17..25))
}

/// Server side of one half-close connection, in both roles:
/// role 0, the client half-closes first: the server keeps sending its larger
/// download after the client's EOF;
/// role 1, the server half-closes first: it sends a small download and
/// shuts down while the client is still uploading.
/// Records (seed, what it received, what it sent).
fn half_close_server(mut conn: TcpStream, results: &Mutex<Vec<(u64, StreamDigest, StreamDigest)>>) {
    let mut h = [0u8; LOAD_HEADER];
    conn.read_exact(&mut h).expect("load header");
    let (_role, _up, down, seed) = parse_load_header(&h);
    let mut writer = conn.try_clone().expect("dup");
    let sending = std::thread::spawn(move || {
        let sent = send_pattern(&mut writer, down, seed + 1).expect("server send");
        writer
            .shutdown(Shutdown::Write)
            .expect("server shutdown(Write)");
        sent
    });
    let received = recv_all(&mut conn).expect("server receive");
    let sent = sending.join().expect("server sender");
    results.lock().unwrap().push((seed, received, sent));
}

/// Many connections at once, half of them transparent and half SOCKS5,
/// each closing one direction while the other still carries data. Every
/// byte of both directions arrives, and each EOF arrives where it was sent.
#[test]
fn half_close_both_ways_under_load() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(if long_mode() { 900 } else { 60 }));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let results = Arc::new(Mutex::new(Vec::new()));
    let r = results.clone();
    let _guard = server.serve_forever(move |conn| half_close_server(conn, &r));

    let connections = 32u64;
    let big = size(2 * MIB, 64 * MIB);
    let small = size(256 * 1024, 8 * MIB);
    let lab = Arc::new(lab);
    let clients: Vec<_> = (0..connections)
        .map(|i| {
            let lab = lab.clone();
            std::thread::spawn(move || {
                let role = (i % 2) as u8;
                // role 0: small upload, then the client's EOF, big download
                // after it; role 1: the reverse.
                let (up, down) = if role == 0 {
                    (small, big)
                } else {
                    (big, small)
                };
                let seed = 0xD0_0000 + i * 16;
                let mut s = if i % 4 < 2 {
                    connect_in(&lab.client, server_v4()).expect("transparent connect")
                } else {
                    socks_connect(&lab, server_v4()).expect("SOCKS connect")
                };
                s.write_all(&load_header(role, up, down, seed))
                    .expect("load header");
                let mut writer = s.try_clone().expect("dup");
                let sending = std::thread::spawn(move || {
                    let sent = send_pattern(&mut writer, up, seed).expect("client send");
                    writer
                        .shutdown(Shutdown::Write)
                        .expect("client shutdown(Write)");
                    sent
                });
                let received = recv_all(&mut s).expect("client receive");
                let sent = sending.join().expect("client sender");
                (seed, sent, received)
            })
        })
        .collect();
    let mut checked = 0;
    let client_results: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().expect("client thread"))
        .collect();
    let server_results = wait_until(deadline, "every server side finishing", || {
        let r = results.lock().unwrap();
        (r.len() == connections as usize).then(|| r.clone())
    });
    for (seed, client_sent, client_received) in client_results {
        let (_, server_received, server_sent) = server_results
            .iter()
            .find(|(s, _, _)| *s == seed)
            .unwrap_or_else(|| panic!("no server record for connection {seed:#x}"));
        assert_eq!(
            *server_received, client_sent,
            "connection {seed:#x}: upload"
        );
        assert_eq!(
            client_received, *server_sent,
            "connection {seed:#x}: download"
        );
        checked += client_sent.len + client_received.len;
    }
    deadline.remaining("half-close load");
    let mut lab = Arc::into_inner(lab).expect("client threads joined");
    lab.assert_relays_alive();
    count_checked("half_close_both_ways_under_load", checked);
}

// ---------------------------------------------------------------------------
// (e) resets mid-transfer, both directions busy, many at once
// ---------------------------------------------------------------------------

/// One side of a reset-test connection: streams its pattern until told to
/// stop, reads and checks the other's; aborts (RST) itself once it has
/// received `abort_after` bytes if `aborts`. Returns (bytes checked, how
/// the read ended).
fn reset_side(
    mut s: TcpStream,
    send_seed: u64,
    recv_seed: u64,
    aborts: bool,
    abort_after: u64,
    who: String,
) -> (u64, io::Result<()>) {
    s.set_read_timeout(Some(FAULT_READ_TIMEOUT))
        .expect("timeout");
    let stop = Arc::new(AtomicBool::new(false));
    let mut writer = s.try_clone().expect("dup");
    let stop_writer = stop.clone();
    let sending =
        std::thread::spawn(move || write_until_error(&mut writer, send_seed, &stop_writer));
    let mut check = PatternCheck::new(recv_seed);
    let mut buf = vec![0u8; 64 * 1024];
    let end = loop {
        match s.read(&mut buf) {
            // The kernel reports a reset once, to whichever call comes
            // first: if our writer took it, the read sees only the end of
            // input. The TCP state tells a reset (CLOSE) from a FIN
            // (CLOSE_WAIT).
            Ok(0) if reset_seen(&s) => {
                break Err(io::Error::from(io::ErrorKind::ConnectionReset));
            }
            Ok(0) => break Ok(()),
            Ok(n) => {
                check.feed(&buf[..n], &who);
                if aborts && check.checked >= abort_after {
                    // Stop our writer first: its duplicate descriptor
                    // would keep the socket open past our close. Its
                    // current write completes, the peer keeps reading.
                    stop.store(true, Ordering::SeqCst);
                    let _ = sending.join();
                    SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .expect("SO_LINGER 0");
                    drop(s); // abortive close: RST
                    return (check.checked, Ok(()));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    stop.store(true, Ordering::SeqCst);
    let _ = sending.join();
    (check.checked, end)
}

/// Connections streaming in both directions at once, half aborted by the
/// client, half by the server, half transparent and half SOCKS5: each
/// abort reaches the other end as a reset (never a clean EOF), after an
/// intact prefix.
#[test]
fn resets_mid_transfer_under_load_reach_the_other_end() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(if long_mode() { 900 } else { 60 }));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let connections = 8u64;
    let abort_after = size(2 * MIB, 256 * MIB);
    let results = Arc::new(Mutex::new(Vec::new()));
    let r = results.clone();
    let _guard = server.serve_forever(move |mut conn| {
        let mut h = [0u8; LOAD_HEADER];
        conn.read_exact(&mut h).expect("load header");
        let (role, _, _, seed) = parse_load_header(&h);
        let server_aborts = role == 1;
        let out = reset_side(
            conn,
            seed + 1,
            seed,
            server_aborts,
            abort_after,
            format!("server {seed:#x}"),
        );
        r.lock().unwrap().push((seed, server_aborts, out.0, out.1));
    });
    let lab = Arc::new(lab);
    let clients: Vec<_> = (0..connections)
        .map(|i| {
            let lab = lab.clone();
            std::thread::spawn(move || {
                let role = (i % 2) as u8;
                let seed = 0xE0_0000 + i * 16;
                let mut s = if i % 4 < 2 {
                    connect_in(&lab.client, server_v4()).expect("transparent connect")
                } else {
                    socks_connect(&lab, server_v4()).expect("SOCKS connect")
                };
                s.write_all(&load_header(role, 0, 0, seed))
                    .expect("load header");
                let client_aborts = role == 0;
                let (checked, end) = reset_side(
                    s,
                    seed,
                    seed + 1,
                    client_aborts,
                    abort_after,
                    format!("client {seed:#x}"),
                );
                (seed, client_aborts, checked, end)
            })
        })
        .collect();
    let mut checked = 0;
    let mut verdicts = Vec::new();
    for c in clients {
        verdicts.push(c.join().expect("client thread"));
    }
    let server_side = wait_until(deadline, "every server side finishing", || {
        let mut r = results.lock().unwrap();
        (r.len() == connections as usize).then(|| std::mem::take(&mut *r))
    });
    verdicts.extend(server_side);
    for (seed, aborted, got, end) in verdicts {
        checked += got;
        if aborted {
            continue;
        }
        match end {
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            Err(e) => {
                assert_connection_error(&e, "reset receiver", got);
                panic!("connection {seed:#x}: expected ECONNRESET after {got} bytes, got {e}");
            }
            Ok(()) => panic!(
                "connection {seed:#x}: the other end's abort arrived as a clean EOF after {got} bytes"
            ),
        }
    }
    deadline.remaining("reset load");
    let lab = Arc::into_inner(lab).expect("client threads joined");
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "client_reset")],
        (connections / 2) as f64,
        deadline,
    );
    lab.wait_counter(
        "rc",
        "splitway_connections_closed_total",
        &[("reason", "upstream_reset")],
        (connections / 2) as f64,
        deadline,
    );
    let mut lab = lab;
    lab.assert_relays_alive();
    count_checked("resets_mid_transfer_under_load", checked);
}

// ---------------------------------------------------------------------------
// (f) a relay restarted with connections in flight
// ---------------------------------------------------------------------------

/// Each relay in turn is restarted (SIGTERM: drain, then the harness's kill
/// after 5 s) while streams in both directions are in flight: each in-flight
/// stream's receiver sees a failure, never a clean EOF; connections opened
/// after the restart succeed.
#[test]
fn relay_restarted_with_connections_in_flight() {
    require_netns!();
    let _heavy = heavy_lock();
    let deadline = Deadline::after(Duration::from_secs(if long_mode() { 900 } else { 80 }));
    let mut lab = Lab::two_relays();
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let mut checked = 0;
    for (round, relay) in ["rs", "rc"].into_iter().enumerate() {
        let in_flight = 4u64;
        let warm = size(MIB, 256 * MIB);
        // Receivers read on their own threads; each reports once it has
        // `warm` bytes so that the restart happens mid-stream.
        let (tx, rx) = std::sync::mpsc::channel();
        let mut streams = Vec::new();
        for i in 0..in_flight {
            let dir = if i % 2 == 0 {
                Dir::Download
            } else {
                Dir::Upload
            };
            let seed = 0xF0_0000 + (round as u64) * 256 + i * 16;
            let client = connect_in(&lab.client, server_v4()).expect("connect");
            let (conn, _) = server.accept(Duration::from_secs(20));
            let (mut receiver, mut sender) = match dir {
                Dir::Download => (client, conn),
                Dir::Upload => (conn, client),
            };
            receiver
                .set_read_timeout(Some(FAULT_READ_TIMEOUT))
                .expect("timeout");
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let sending = std::thread::spawn(move || write_until_error(&mut sender, seed, &s));
            let tx = tx.clone();
            let receiving = std::thread::spawn(move || {
                let mut told = false;
                let who = format!("{dir:?} receiver {seed:#x}");
                check_until_end(&mut receiver, seed, &who, |got| {
                    if !told && got >= warm {
                        let _ = tx.send(());
                        told = true;
                    }
                })
            });
            streams.push((dir, seed, stop, sending, receiving));
        }
        drop(tx);
        for _ in 0..in_flight {
            rx.recv_timeout(deadline.remaining("streams warming up"))
                .expect("every stream under way before the restart");
        }
        let config = if relay == "rs" {
            &configs[1]
        } else {
            &configs[0]
        };
        lab.restart_relay(relay, config);
        for (dir, seed, stop, sending, receiving) in streams {
            let (got, end) = receiving.join().expect("receiver thread");
            stop.store(true, Ordering::SeqCst);
            let _ = sending.join();
            checked += got;
            match end {
                Ok(()) => panic!(
                    "restart of {relay}: {dir:?} {seed:#x} ended with a clean EOF after {got} bytes mid-stream"
                ),
                Err(e) => {
                    assert_connection_error(&e, &format!("{dir:?} after {relay} restart"), got)
                }
            }
        }
        checked += transfers_both_ways(&lab, &server, size(2 * MIB, 512 * MIB));
        deadline.remaining("restart round");
    }
    lab.assert_relays_alive();
    count_checked("relay_restarted_with_connections_in_flight", checked);
}

// ---------------------------------------------------------------------------
// Slow reader, bounded memory
// ---------------------------------------------------------------------------

/// Read rate of the slow client.
const SLOW_RATE: f64 = 1e6;
/// How much a relay's RSS may grow over its post-warm-up baseline while a
/// fast server feeds a slow reader. Socket buffers are kernel memory, so
/// a relay that respects backpressure grows by its small per-connection
/// buffers only; one that queued in user space would grow by about the
/// server's rate minus 1 MB/s, gigabytes over the run.
const RSS_GROWTH_BOUND: u64 = 32 * MIB;

fn slow_reader_bounded_memory(relays: &[&str]) {
    require_netns!();
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::chain(relays);
    let configs = lab.default_configs(&[SERVER_PORT], false);
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let mut client = connect_in(&lab.client, server_v4()).expect("connect");
    let (mut conn, _) = server.accept(Duration::from_secs(20));
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let seed = 0x510 + relays.len() as u64;
    let sending = std::thread::spawn(move || write_until_error(&mut conn, seed, &s));
    let pids: Vec<(String, u32)> = relays
        .iter()
        .map(|r| (r.to_string(), lab.relay_pid(r)))
        .collect();

    let run = Duration::from_secs(12);
    let warm_up = Duration::from_secs(2);
    let started = Instant::now();
    let mut check = PatternCheck::new(seed);
    let mut buf = vec![0u8; 16 * 1024];
    let mut next_sample = Duration::ZERO;
    let mut samples: Vec<(f64, Vec<u64>)> = Vec::new();
    while started.elapsed() < run {
        // Token bucket: read only what SLOW_RATE allows so far.
        let allowed = (started.elapsed().as_secs_f64() * SLOW_RATE) as u64;
        let budget = allowed.saturating_sub(check.checked).min(buf.len() as u64) as usize;
        if budget == 0 {
            std::thread::sleep(Duration::from_millis(5));
        } else {
            let n = client.read(&mut buf[..budget]).expect("slow client read");
            assert!(n > 0, "the server never stops sending; EOF is a failure");
            check.feed(&buf[..n], "slow client");
        }
        if started.elapsed() >= next_sample {
            let rss: Vec<u64> = pids
                .iter()
                .map(|(name, pid)| {
                    vm_rss_bytes(*pid).unwrap_or_else(|| panic!("VmRSS of relay {name}"))
                })
                .collect();
            samples.push((started.elapsed().as_secs_f64(), rss));
            next_sample += Duration::from_millis(500);
        }
    }
    stop.store(true, Ordering::SeqCst);
    SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(client);
    let (sent, _) = sending.join().expect("server thread");
    deadline.remaining("slow reader");
    lab.assert_relays_alive();

    let base_index = samples
        .iter()
        .position(|(t, _)| *t >= warm_up.as_secs_f64())
        .expect("a sample after warm-up");
    for (i, (name, _)) in pids.iter().enumerate() {
        let series: Vec<String> = samples
            .iter()
            .map(|(t, rss)| format!("{t:.1}s:{:.1}", rss[i] as f64 / MIB as f64))
            .collect();
        eprintln!("relay {name} VmRSS MiB: {}", series.join(" "));
        let base = samples[base_index].1[i];
        let peak = samples[base_index..]
            .iter()
            .map(|(_, r)| r[i])
            .max()
            .unwrap_or(base);
        eprintln!(
            "relay {name}: baseline after warm-up {:.1} MiB, peak {:.1} MiB, growth {:.1} MiB (bound {} MiB); client read {} bytes at ~1 MB/s while the server wrote {} bytes",
            base as f64 / MIB as f64,
            peak as f64 / MIB as f64,
            peak.saturating_sub(base) as f64 / MIB as f64,
            RSS_GROWTH_BOUND / MIB,
            check.checked,
            sent
        );
        assert!(
            peak <= base + RSS_GROWTH_BOUND,
            "relay {name}'s RSS grew from {base} to {peak} bytes behind a slow reader"
        );
    }
    count_checked(&format!("slow_reader via {relays:?}"), check.checked);
}

#[test]
fn slow_reader_bounded_memory_one_relay() {
    slow_reader_bounded_memory(&["rc"]);
}

#[test]
fn slow_reader_bounded_memory_relay_pair() {
    slow_reader_bounded_memory(&["rc", "rs"]);
}
