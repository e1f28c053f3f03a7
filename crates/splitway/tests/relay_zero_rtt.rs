//! 0-RTT peer legs (`[accel] zero_rtt`, on unless turned off) through real
//! relays in namespaces: by default the Hello is the first flight of every
//! fresh leg, after the handshake without TCP Fast Open; with it the Hello
//! rides the SYN between relays; a peer without 0-RTT is redialed with the
//! challenge handshake; a replayed or stale Hello is refused before
//! anything is dialed, by every process sharing the peer port (issue #33);
//! and an accepted Hello forwards nothing beyond the bytes its MAC covers
//! until its Confirm arrives.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use splitway_proto::Destination;
use splitway_proto::auth::{AuthError, Dialer, Psk, RejectReason};
use splitway_proto::header::{Header, Reply, ReplyStatus};
use splitway_sys::netns::Netns;
use support::*;

/// These tests count rc's 0-RTT legs and rs's accepted ones exactly: rc's
/// window probe (learned windows: a fresh 0-RTT leg of its own at start)
/// would add one.
fn no_window_probe(configs: &mut [RelayConfig]) {
    configs[0].accel(|a| a.learned_window = Some(false));
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
    no_window_probe(&mut configs);
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
    no_window_probe(&mut configs);
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
    no_window_probe(&mut configs);
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

/// A Hello for the test server with `data` covered by its MAC, and the
/// dialer that sent it.
fn build_hello(psk: &Psk, nonce: u8, timestamp_ms: u64, data: &[u8]) -> (Dialer, Vec<u8>) {
    let mut dialer = Dialer::new(psk.clone(), [nonce; 32]);
    let mut header = Vec::new();
    Header::new(1, Destination::Ip(server_v4()), sock("10.0.1.1:40000")).encode(&mut header);
    let (hello, covered) = dialer.hello(timestamp_ms, &header, data).expect("hello");
    assert_eq!(covered, data.len());
    (dialer, hello)
}

/// Reads rs's answer to a Hello (skipping the Challenge it sends when the
/// Hello did not ride the SYN): `Ok` with what followed a verified proof,
/// or the Reject.
fn read_proof(s: &mut TcpStream, dialer: &mut Dialer) -> Result<Vec<u8>, AuthError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    let proof_len = loop {
        match dialer.on_server_proof(&buf) {
            Ok(Some(n)) => break n,
            Ok(None) => {}
            Err(e) => return Err(e),
        }
        let n = read_some(s, &mut chunk).expect("read from rs");
        assert!(n > 0, "rs closed without proof or reject");
        buf.extend_from_slice(&chunk[..n]);
    };
    buf.drain(..proof_len);
    Ok(buf)
}

/// What rs answers to one Hello sent from rc's namespace: the proof and
/// the Reply, or the Reject.
fn send_hello(
    lab: &Lab,
    psk: &Psk,
    nonce: u8,
    timestamp_ms: u64,
) -> Result<ReplyStatus, AuthError> {
    let (mut dialer, hello) = build_hello(psk, nonce, timestamp_ms, b"");
    let mut s: TcpStream = connect_in(lab.rc(), sock(&lab.peer_addr(1))).expect("connect rs");
    s.write_all(&hello).expect("send hello");
    let mut buf = read_proof(&mut s, &mut dialer)?;
    let confirm = dialer.take_confirm().expect("a confirm after the proof");
    s.write_all(&confirm).expect("send confirm");
    let mut chunk = [0u8; 512];
    loop {
        if let Some((reply, _)) = Reply::decode(&buf).expect("a valid reply") {
            return Ok(reply.status);
        }
        let n = read_some(&mut s, &mut chunk).expect("read reply");
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
    no_window_probe(&mut configs);
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

/// A bpf filesystem of the test's own, mounted before the relays start:
/// `ip netns exec` gives each relay its own /sys, so this is the bpffs
/// both rs processes find (as /sys/fs/bpf is on a host), and the pinned
/// strike register goes with the mount.
struct BpfMount(PathBuf);

impl BpfMount {
    fn new(dir: &Path) -> BpfMount {
        std::fs::create_dir_all(dir).expect("bpffs dir");
        let out = output(Command::new("mount").args(["-t", "bpf", "bpf"]).arg(dir));
        assert!(out.status.success(), "mount bpffs: {out:?}");
        BpfMount(dir.to_owned())
    }
}

impl Drop for BpfMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Admin port of rs's second process.
const SIBLING_ADMIN: u16 = 9091;

fn admin_get(ns: &Netns, port: u16, path: &str) -> Result<String, String> {
    let out = ns
        .command("curl")
        .args(["-sS", "--fail", "--max-time", "3"])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("spawn curl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

/// Starts a second rs process on the same config (same `reuse_port` peer
/// port), with its own admin address, as docs/fleet.md lays a site out.
fn start_sibling(lab: &mut Lab, config: &RelayConfig) {
    let mut raw = config.raw(&lab.psk_path);
    raw.admin = Some(format!("127.0.0.1:{SIBLING_ADMIN}"));
    let path = lab.dir.join("rs-sibling.toml");
    std::fs::write(&path, raw.to_toml()).expect("write sibling config");
    let log = std::fs::File::create(lab.dir.join("rs-sibling.stderr")).expect("log file");
    let child = lab
        .rs()
        .command(SPLITWAY)
        .args(["relay", "--config"])
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup log"))
        .stderr(log)
        .spawn()
        .expect("spawn sibling");
    lab.adopt(child);
    let ns = lab.rs();
    wait_until(
        Deadline::after(Duration::from_secs(15)),
        "rs's sibling to answer on its admin port",
        || admin_get(ns, SIBLING_ADMIN, "/status").ok(),
    );
}

/// Connects from `from` (an address and port the attacker picks) inside `ns`.
fn connect_from(ns: &Netns, from: SocketAddr, to: SocketAddr) -> TcpStream {
    let stream = ns
        .run_in(move || -> std::io::Result<TcpStream> {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            s.set_reuse_address(true)?;
            s.bind(&from.into())?;
            s.connect_timeout(&to.into(), Duration::from_secs(10))?;
            Ok(s.into())
        })
        .expect("enter namespace")
        .unwrap_or_else(|e| panic!("connect {from} -> {to}: {e}"));
    set_timeouts(&stream);
    stream
}

fn zero_rtt(m: &Metrics, outcome: &str) -> f64 {
    m.counter("splitway_zero_rtt_total", &[("outcome", outcome)])
}

/// Issue #33, item 1: rs runs as two processes sharing its peer port
/// (`reuse_port`), rc dials it with 0-RTT Hellos (in the SYN). A Hello
/// captured on the long haul is replayed 50 times from another address,
/// from source ports the attacker picks (so the kernel's reuse_port hash
/// sends replays to both processes), each with the attacker's own request
/// after it. Every replay is refused by whichever process gets it (the
/// host-wide strike register), the server sees no connection for any of
/// them, and the genuine 0-RTT legs carry every byte both ways.
#[test]
fn a_captured_hello_replayed_to_processes_sharing_the_port_is_refused_by_each() {
    require_netns!();
    let mut lab = Lab::two_relays();
    let _bpffs = BpfMount::new(&lab.dir.join("bpffs"));
    for ns in [lab.rc(), lab.rs()] {
        enable_fast_open(ns);
    }
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    no_window_probe(&mut configs);
    configs[0].accel(|a| {
        a.zero_rtt = Some(true);
        a.pool = Some(false);
    });
    configs[1].accel(|a| a.zero_rtt = Some(true));
    configs[1].listeners[0].reuse_port = Some(true);
    lab.start_relays(&configs);
    start_sibling(&mut lab, &configs[1]);
    let sibling_status = admin_get(lab.rs(), SIBLING_ADMIN, "/status").expect("sibling status");
    for status in [
        admin_status(lab.rs()).expect("rs status"),
        typed_status(&sibling_status).expect("typed sibling status"),
    ] {
        let z = &status.accel["zero_rtt"];
        assert_eq!(z.state, "active", "{status:?}");
        assert!(z.reason.contains("refused host-wide"), "{}", z.reason);
    }

    // The genuine path: fresh 0-RTT legs, every byte checked both ways.
    let server = TestServer::bind(&lab.server, server_v4());
    const LEGS: f64 = 4.0;
    for _ in 0..2 {
        transfer_server_to_client(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
        transfer_client_to_server(&lab.client, &server, server_v4(), MIB, LAST_RELAY_V4);
    }
    assert_eq!(
        zero_rtt(&lab.metrics("rc"), "sent"),
        LEGS,
        "rc dialed every leg with a Hello"
    );

    // The capture: a genuine Hello with the client's first bytes, sent once
    // from rc's address the way rc sends one, and confirmed.
    let psk = Psk::from_hex(&std::fs::read_to_string(&lab.psk_path).expect("read psk"))
        .expect("valid psk");
    let rs_peer = sock(&lab.peer_addr(1));
    let first_bytes = b"GET /legit HTTP/1.1\r\nHost: server\r\n\r\n";
    let stamped = unix_ms();
    let (mut dialer, captured) = build_hello(&psk, 0x33, stamped, first_bytes);
    let mut legit = connect_in(lab.rc(), rs_peer).expect("connect rs");
    legit.write_all(&captured).expect("send hello");
    read_proof(&mut legit, &mut dialer).expect("the genuine Hello is accepted");
    legit
        .write_all(&dialer.take_confirm().expect("confirm"))
        .expect("send confirm");
    legit.write_all(b"after the confirm").expect("send more");
    let (mut at_server, peer) = server.accept(Duration::from_secs(10));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let mut expected = first_bytes.to_vec();
    expected.extend_from_slice(b"after the confirm");
    let mut got = vec![0u8; expected.len()];
    at_server.read_exact(&mut got).expect("the genuine bytes");
    assert_eq!(got, expected);

    // The replays, within the window, each from a port of the attacker's
    // choosing, with the attacker's request (and a made-up Confirm) after.
    const REPLAYS: u16 = 50;
    let mut attack = captured.clone();
    attack.extend_from_slice(&[0x07; 33]);
    attack.extend_from_slice(b"GET /attacker HTTP/1.1\r\nHost: server\r\n\r\n");
    for i in 0..REPLAYS {
        let from = sock(&format!("10.0.1.1:{}", 42_000 + i));
        let mut s = connect_from(&lab.client, from, rs_peer);
        s.write_all(&attack).expect("send replay");
        // Parsed as the genuine dialer would (the test holds the key; the
        // attacker does not need it to send the bytes).
        let (mut parser, _) = build_hello(&psk, 0x33, stamped, first_bytes);
        assert_eq!(
            read_proof(&mut s, &mut parser).map(|_| ()),
            Err(AuthError::Rejected(RejectReason::AuthFailed)),
            "replay {i} from {from}"
        );
    }
    server.assert_no_pending_connection();

    // Both processes took replays, and each refused all it took.
    let first = lab.metrics("rs");
    let second =
        Metrics::parse(&admin_get(lab.rs(), SIBLING_ADMIN, "/metrics").expect("sibling metrics"));
    let replays = [zero_rtt(&first, "replay"), zero_rtt(&second, "replay")];
    eprintln!("replays refused per process: {replays:?}");
    assert_eq!(replays[0] + replays[1], f64::from(REPLAYS));
    assert!(
        replays[0] > 0.0 && replays[1] > 0.0,
        "both processes were hit: {replays:?}"
    );
    assert_eq!(
        zero_rtt(&first, "accepted") + zero_rtt(&second, "accepted"),
        LEGS + 1.0,
        "the genuine legs and the captured Hello's first sending"
    );
    drop(legit);
    lab.assert_relays_alive();
}

/// Part 2 of the same issue: a Hello that gets past every strike register
/// (say, replayed to another host of the site) still forwards only the
/// bytes its MAC covers. The attacker's bytes after it are not a valid
/// Confirm (it would need the key and this connection's nonce_s), so rs
/// resets both legs and the server never sees them.
#[test]
fn an_accepted_hello_without_its_confirm_forwards_only_its_covered_bytes() {
    require_netns!();
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    no_window_probe(&mut configs);
    configs[1].accel(|a| a.zero_rtt = Some(true));
    lab.start_relays(&configs);
    let psk = Psk::from_hex(&std::fs::read_to_string(&lab.psk_path).expect("read psk"))
        .expect("valid psk");
    let server = TestServer::bind(&lab.server, server_v4());
    let covered = b"GET / HTTP/1.1\r\nHost: server\r\n\r\n";
    // Never sent before: rs has no record of it, as another host would not.
    let (mut parser, hello) = build_hello(&psk, 0x44, unix_ms(), covered);
    let mut s = connect_from(&lab.client, sock("10.0.1.1:43000"), sock(&lab.peer_addr(1)));
    s.write_all(&hello).expect("send hello");
    read_proof(&mut s, &mut parser).expect("a fresh Hello is accepted");
    let (mut at_server, _) = server.accept(Duration::from_secs(10));
    let mut got = vec![0u8; covered.len()];
    at_server.read_exact(&mut got).expect("the covered bytes");
    assert_eq!(got, covered);
    // The attacker's own bytes, with no Confirm it could compute.
    s.write_all(b"\x07GET /attacker HTTP/1.1\r\nHost: server\r\n\r\n")
        .expect("send attacker bytes");
    let (more, _) = read_until_end(&mut at_server);
    assert_eq!(
        more, 0,
        "nothing beyond the covered bytes reached the server"
    );
    lab.wait_counter(
        "rs",
        "splitway_zero_rtt_total",
        &[("outcome", "unconfirmed")],
        1.0,
        Deadline::after(Duration::from_secs(5)),
    );
    lab.assert_relays_alive();
}

/// `relay --check` on a relay whose peer port is shared (`reuse_port`):
/// with no bpf filesystem in sight (a private mount namespace without any),
/// `zero_rtt` is unavailable and says why and what to do; with one, the
/// host-wide register guards it.
#[test]
fn check_says_whether_a_shared_peer_port_can_take_hellos() {
    require_netns!();
    let dir = TempDir::new();
    let psk = dir.join("psk.key");
    write_psk(&psk, 3);
    let mut cfg = splitway_lab::testbed::config::relay("rs", "127.0.0.1:9090", Some(&psk));
    let mut peer = RawListener::new(ListenMode::Peer, format!("0.0.0.0:{PEER_PORT}"));
    peer.reuse_port = Some(true);
    cfg.listen.push(peer);
    cfg.route.push(RawRoute::new("0.0.0.0/0", "direct"));
    let path = dir.join("rs.toml");
    std::fs::write(&path, cfg.to_toml()).expect("write config");
    let bpffs = dir.join("bpffs");
    std::fs::create_dir_all(&bpffs).expect("bpffs dir");
    let check = |setup: &str| {
        let script = format!(
            "umount -a -t bpf 2>/dev/null; {setup} exec \"$0\" relay --config \"$1\" --check"
        );
        let out = output(
            Command::new("unshare")
                .args(["-m", "sh", "-c", &script, SPLITWAY])
                .arg(&path),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{out:?}");
        text.lines()
            .find(|l| l.starts_with("zero_rtt: "))
            .unwrap_or_else(|| panic!("no zero_rtt line:\n{text}"))
            .to_owned()
    };
    let without = check("");
    assert!(
        without.starts_with("zero_rtt: unavailable")
            && without.contains("reuse_port")
            && without.contains("mount -t bpf"),
        "{without}"
    );
    let with = check(&format!("mount -t bpf bpf '{}' &&", bpffs.display()));
    assert!(
        with.starts_with("zero_rtt: active") && with.contains("host-wide"),
        "{with}"
    );
}

/// A real dialer's Hello carrying client bytes: an HTTP CONNECT client
/// pipelines 6,000 bytes behind its request, so rc's fresh 0-RTT leg puts
/// the first of them (up to 4,096) under the Hello's MAC and the rest after
/// its Confirm. rs forwards both, in order, and the server's answer comes
/// back: every byte arrives, nothing is counted unconfirmed.
#[test]
fn client_bytes_pipelined_behind_a_connect_ride_the_hello_and_arrive_intact() {
    require_netns!();
    let mut lab = Lab::two_relays();
    let mut configs = lab.default_configs(&[SERVER_PORT], false);
    no_window_probe(&mut configs);
    configs[0].accel(|a| {
        a.zero_rtt = Some(true);
        a.pool = Some(false);
    });
    lab.start_relays(&configs);
    let server = TestServer::bind(&lab.server, server_v4());
    let mut pattern = PatternGen::new(33);
    let mut payload = Vec::new();
    while payload.len() < 6_000 {
        payload.extend_from_slice(pattern.next_chunk());
    }
    payload.truncate(6_000);
    let mut request =
        format!("CONNECT {SERVER_V4}:{SERVER_PORT} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes();
    request.extend_from_slice(&payload);
    let mut client = connect_in(
        &lab.client,
        sock(&format!("{ENTRY_V4}:{HTTP_CONNECT_PORT}")),
    )
    .expect("connect rc");
    client.write_all(&request).expect("send request and data");
    let (mut at_server, _) = server.accept(Duration::from_secs(10));
    let mut got = vec![0u8; payload.len()];
    at_server.read_exact(&mut got).expect("the pipelined bytes");
    assert!(got == payload, "the pipelined bytes arrived in order");
    at_server.write_all(b"answer").expect("server answer");
    drop(at_server);
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).expect("client read");
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("\r\n\r\nanswer"),
        "{text}"
    );
    // Both halves closed: the relays account the connection.
    drop(client);
    let rc = lab.metrics("rc");
    let rs = lab.metrics("rs");
    assert_eq!(zero_rtt(&rc, "sent"), 1.0);
    assert_eq!(zero_rtt(&rs, "accepted"), 1.0);
    assert_eq!(zero_rtt(&rs, "unconfirmed"), 0.0);
    lab.assert_forwarded_bytes(
        "rs",
        payload.len() as u64,
        6,
        Deadline::after(Duration::from_secs(10)),
    );
    lab.assert_relays_alive();
}
