//! Explicit capture with the destination in the SYN (issue #18): `splitway
//! agent` in the client namespace's cgroup redirects an unchanged
//! application's connect() to a `mode = "syn-option"` relay listener and
//! writes the destination into the SYN; the relay reads it from the saved
//! SYN. A SYN without the option is reset and counted; a destination refused
//! by `[policy]` is never dialed.

mod support;

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use splitway_sys::netns::Netns;
use support::*;

const SYNOPT_PORT: u16 = 7200;
/// Port the relay's `[policy]` does not allow: a refused destination.
const DENIED_PORT: u16 = 5002;
const CHILD_ENV: &str = "SPLITWAY_SYNOPT_CHILD";

/// A cgroup v2 directory of its own, removed on drop (after its processes
/// have exited: the child is waited for before).
struct Cgroup(PathBuf);

impl Cgroup {
    fn create(tag: &str) -> Option<Cgroup> {
        let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() > 2 && f[2] == "cgroup2")
            .map(|f| PathBuf::from(f[1]))?;
        let dir = root.join(format!("splitway-test-synopt-{tag}-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("create cgroup {}: {e}", dir.display()));
        Some(Cgroup(dir))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The agent's pinned programs, disabled (detached) on drop.
struct AgentPins(PathBuf);

impl AgentPins {
    fn run(&self, args: &[&str]) -> std::process::Output {
        output(
            Command::new(SPLITWAY)
                .arg("agent")
                .arg("--pin-dir")
                .arg(&self.0)
                .args(args),
        )
    }
}

impl Drop for AgentPins {
    fn drop(&mut self) {
        let _ = self.run(&["disable"]);
    }
}

/// Runs this test binary's `child_client` in `ns`, inside `cgroup` (the
/// shell joins the cgroup, then execs: the test runner itself never does).
fn spawn_child(
    cgroup: &Path,
    ns: &str,
    dst: SocketAddr,
    len: u64,
    seed: u64,
) -> std::process::Child {
    let exe = std::env::current_exe().expect("test binary path");
    Command::new("sh")
        .args(["-c", "echo $$ > \"$1\" && shift && exec \"$@\"", "sh"])
        .arg(cgroup.join("cgroup.procs"))
        .args(["ip", "netns", "exec", ns])
        .arg(exe)
        .args([
            "child_client",
            "--exact",
            "--ignored",
            "--nocapture",
            "--quiet",
        ])
        .env(CHILD_ENV, format!("{dst} {len} {seed}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child client")
}

/// The unchanged application: a plain TcpStream to the server's address,
/// no proxy settings. Sends `len` bytes, half-closes, reads the answer to
/// EOF, prints both digests.
#[test]
#[ignore = "run by the syn-option test inside its cgroup"]
fn child_client() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut fields = spec.split(' ');
    let dst: SocketAddr = fields.next().unwrap().parse().unwrap();
    let len: u64 = fields.next().unwrap().parse().unwrap();
    let seed: u64 = fields.next().unwrap().parse().unwrap();
    let mut stream = TcpStream::connect_timeout(&dst, Duration::from_secs(10)).expect("connect");
    set_timeouts(&stream);
    let sent = send_pattern(&mut stream, len, seed).expect("send");
    stream.shutdown(Shutdown::Write).expect("half-close");
    let got = recv_all(&mut stream).expect("receive");
    println!("SENT {sent}");
    println!("GOT {got}");
}

#[test]
fn agent_destination_rides_the_syn_through_a_syn_option_listener() {
    require_netns!();
    let Some(cgroup) = Cgroup::create("v4") else {
        eprintln!("skipping: no cgroup2 mount");
        return;
    };
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::chain(&["rc"]);
    let relay_addr = format!("{ENTRY_V4}:{SYNOPT_PORT}");
    let mut cfg = RelayConfig::new("rc");
    cfg.listen(ListenMode::SynOption, &relay_addr);
    cfg.listeners[0].allow_clients = vec!["10.0.1.0/24".into()];
    cfg.route("0.0.0.0/0", "direct");
    cfg.policy(|p| p.allow_ports = Some(vec![toml::Value::Integer(SERVER_PORT.into())]));
    lab.start_relays(&[cfg]);

    let server = TestServer::bind(&lab.server, sock(&format!("0.0.0.0:{SERVER_PORT}")));
    let denied_server = TestServer::bind(&lab.server, sock(&format!("0.0.0.0:{DENIED_PORT}")));

    let pins = AgentPins(PathBuf::from(format!(
        "/sys/fs/bpf/splitway-test-agent-{}",
        std::process::id()
    )));
    let route = format!("10.0.3.0/24={relay_addr}");
    let enable = pins.run(&[
        "enable",
        "--cgroup",
        cgroup.0.to_str().unwrap(),
        "--route",
        &route,
    ]);
    assert!(
        enable.status.success(),
        "agent enable: {}",
        String::from_utf8_lossy(&enable.stderr)
    );
    // Idempotent: enabling again replaces the routes, attaches nothing twice.
    let again = pins.run(&[
        "enable",
        "--cgroup",
        cgroup.0.to_str().unwrap(),
        "--route",
        &route,
    ]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("routes replaced"));

    // 1. Through the relay, sha256 both ways.
    let (up, down) = (3 * MIB + 17, 2 * MIB + 5);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, up, 0x5A1);
    let (mut conn, peer) = server.accept(deadline.remaining("server accept"));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let got_up = recv_all(&mut conn).expect("server receive");
    let sent_down = send_pattern(&mut conn, down, 0x5A2).expect("server send");
    drop(conn);
    let out = child.wait_with_output().expect("child client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("SENT {got_up}")),
        "client→server bytes differ: server got {got_up}; child: {stdout}"
    );
    assert!(
        stdout.contains(&format!("GOT {sent_down}")),
        "server→client bytes differ: server sent {sent_down}; child: {stdout}"
    );
    lab.wait_counter(
        "rc",
        "splitway_connections_accepted_total",
        &[("mode", "syn_option")],
        1.0,
        deadline,
    );

    // 2. Refused by [policy]: reset, and the server never sees a dial.
    let child = spawn_child(
        &cgroup.0,
        lab.client.name(),
        sock(&format!("{SERVER_V4}:{DENIED_PORT}")),
        10,
        1,
    );
    let out = child.wait_with_output().expect("child client");
    assert!(
        !out.status.success(),
        "a refused destination must fail the client"
    );
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "port")],
        1.0,
        deadline,
    );
    denied_server.assert_no_pending_connection();

    // 3. No option (a client outside the agent's cgroup): reset, counted.
    // The reset may land before connect() even reports success.
    match connect_in(&lab.client, sock(&relay_addr)) {
        Ok(mut plain) => {
            expect_reset(&mut plain, "client without the destination option");
        }
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "client without the destination option: {e}"
        ),
    }
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "syn_option")],
        1.0,
        deadline,
    );
    server.assert_no_pending_connection();

    // The agent counted what it did.
    let status = pins.run(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "agent status: {text}");
    assert!(text.contains("redirected_v4 2"), "agent status: {text}");
    assert!(text.contains("options_written 2"), "agent status: {text}");
    assert!(text.contains("options_no_space 0"), "agent status: {text}");

    // Probe: the largest option an IPv4 SYN still had room for.
    let probe = pins.run(&[
        "enable",
        "--probe",
        "--cgroup",
        cgroup.0.to_str().unwrap(),
        "--route",
        &route,
    ]);
    assert!(probe.status.success());
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 10, 1);
    let _refused = child.wait_with_output().expect("child client");
    let free = agent_stat(&pins, "probe_max_option_len");
    println!("MEASURED ipv4 SYN free option space: {free} bytes (IPv4 form 11)");
    assert!(
        (11..=40).contains(&free),
        "free option space {free}: the IPv4 form must fit"
    );

    // Disabled: detached (an application connects directly again) and
    // idempotent.
    let off = pins.run(&["disable"]);
    assert!(off.status.success());
    let off = pins.run(&["disable"]);
    assert!(String::from_utf8_lossy(&off.stdout).contains("was not enabled"));
    assert_eq!(pins.run(&["status"]).status.code(), Some(3));
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 1000, 7);
    let (mut conn, peer) = server.accept(deadline.remaining("direct accept"));
    assert_eq!(
        peer.ip().to_string(),
        "10.0.1.1",
        "after disable the client reaches the server directly"
    );
    let got = recv_all(&mut conn).expect("server receive");
    assert_eq!(got.len, 1000);
    drop(conn);
    let _ = child.wait_with_output();
    lab.assert_relays_alive();
    let _ = &mut lab;
}

/// Reads one counter line (`name value`) of `agent status`.
fn agent_stat(pins: &AgentPins, name: &str) -> u64 {
    let status = pins.run(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in agent status:\n{text}"))
}

/// IPv6: the compact indexed option (prefix known to both ends) fits a
/// Linux SYN and reaches the server; the full 23-byte form does not fit
/// beside timestamps (counted by the agent) and the relay refuses the
/// option-less SYN cleanly. Probe mode measures the free option space.
#[test]
fn ipv6_indexed_option_fits_and_full_form_goes_direct() {
    require_netns!();
    let Some(cgroup) = Cgroup::create("v6") else {
        eprintln!("skipping: no cgroup2 mount");
        return;
    };
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::chain(&["rc"]);
    let relay_addr = format!("[fd00:1::2]:{SYNOPT_PORT}");
    let mut cfg = RelayConfig::new("rc");
    cfg.listen(ListenMode::SynOption, &relay_addr);
    cfg.listeners[0].allow_clients = vec!["fd00:1::/64".into()];
    cfg.route("::/0", "direct");
    cfg.listener(RawListener {
        allow_clients: vec!["fd00:1::/64".into()],
        syn_option_prefixes: vec!["5=fd00:3::/64".into()],
        ..RawListener::new(ListenMode::SynOption, "[fd00:1::2]:7201")
    });
    lab.start_relays(&[cfg]);
    let server = TestServer::bind(&lab.server, sock(&format!("[::]:{SERVER_PORT}")));
    let pins = AgentPins(PathBuf::from(format!(
        "/sys/fs/bpf/splitway-test-agent6-{}",
        std::process::id()
    )));
    let cg = cgroup.0.to_str().unwrap();
    let dst = sock(&format!("[{SERVER_V6}]:{SERVER_PORT}"));

    // Indexed form (15 bytes: index 5, 8-byte suffix, port) to port 7201.
    let enable = pins.run(&[
        "enable",
        "--cgroup",
        cg,
        "--route",
        "fd00:3::/64=[fd00:1::2]:7201#5",
    ]);
    assert!(
        enable.status.success(),
        "{}",
        String::from_utf8_lossy(&enable.stderr)
    );
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, MIB + 3, 0x6A1);
    let (mut conn, peer) = server.accept(deadline.remaining("server accept"));
    assert_eq!(
        peer.ip().to_string(),
        LAST_RELAY_V6,
        "the relay dialed the server"
    );
    let got_up = recv_all(&mut conn).expect("server receive");
    let sent_down = send_pattern(&mut conn, MIB + 9, 0x6A2).expect("server send");
    drop(conn);
    let out = child.wait_with_output().expect("child client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("SENT {got_up}")),
        "server got {got_up}; child: {stdout}"
    );
    assert!(
        stdout.contains(&format!("GOT {sent_down}")),
        "server sent {sent_down}; child: {stdout}"
    );
    assert_eq!(agent_stat(&pins, "redirected_v6"), 1);
    assert_eq!(agent_stat(&pins, "options_written"), 1);

    // Full form (23 bytes, 24 padded) to port 7200: no room beside Linux's
    // options (20 free), so the agent does not redirect: the connect goes
    // direct and is counted.
    let full_route = format!("fd00:3::/64={relay_addr}");
    let replace = pins.run(&["enable", "--cgroup", cg, "--route", &full_route]);
    assert!(replace.status.success());
    assert_eq!(agent_stat(&pins, "option_space"), 20);
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 1000, 3);
    let (mut conn, peer) = server.accept(deadline.remaining("direct accept"));
    assert_eq!(
        peer.ip().to_string(),
        "fd00:1::1",
        "without room for the option the client goes direct"
    );
    assert_eq!(recv_all(&mut conn).expect("server receive").len, 1000);
    drop(conn);
    let out = child.wait_with_output().expect("child client");
    assert!(out.status.success(), "the direct connection works");
    assert_eq!(agent_stat(&pins, "fallback_direct"), 1);
    assert_eq!(agent_stat(&pins, "redirected_v6"), 1, "not redirected");

    // Told there is room (--option-space 40), the agent redirects anyway:
    // the SYN leaves without the option and the relay refuses it cleanly.
    let forced = pins.run(&[
        "enable",
        "--cgroup",
        cg,
        "--route",
        &full_route,
        "--option-space",
        "40",
    ]);
    assert!(forced.status.success());
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 10, 1);
    let out = child.wait_with_output().expect("child client");
    assert!(
        !out.status.success(),
        "a SYN without room for the option must be refused"
    );
    assert_eq!(agent_stat(&pins, "options_no_space"), 1);
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "syn_option")],
        1.0,
        deadline,
    );
    server.assert_no_pending_connection();

    // Probe: the largest option the SYN still had room for.
    let probe = pins.run(&[
        "enable",
        "--probe",
        "--cgroup",
        cg,
        "--route",
        &format!("fd00:3::/64={relay_addr}"),
    ]);
    assert!(probe.status.success());
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 10, 1);
    let _refused = child.wait_with_output().expect("child client");
    let free = agent_stat(&pins, "probe_max_option_len");
    println!(
        "MEASURED ipv6 SYN free option space: {free} bytes (full form 23, indexed /64 form 15, IPv4 form 11)"
    );
    assert!(
        (15..23).contains(&free),
        "free option space {free}: the indexed form must fit and the full form must not"
    );
    lab.assert_relays_alive();
}

/// Under SYN cookies the kernel keeps no SYN for the accepted socket, so the
/// option is lost: the relay refuses (reset, counted), it never guesses.
#[test]
fn syn_cookies_lose_the_option_and_the_relay_refuses_cleanly() {
    require_netns!();
    let Some(cgroup) = Cgroup::create("cookies") else {
        eprintln!("skipping: no cgroup2 mount");
        return;
    };
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::chain(&["rc"]);
    // 2: every SYN is answered with a cookie, as under a flood.
    lab.rc()
        .sysctl("net.ipv4.tcp_syncookies", "2")
        .expect("sysctl tcp_syncookies");
    let relay_addr = format!("{ENTRY_V4}:{SYNOPT_PORT}");
    let mut cfg = RelayConfig::new("rc");
    cfg.listen(ListenMode::SynOption, &relay_addr);
    cfg.listeners[0].allow_clients = vec!["10.0.1.0/24".into()];
    cfg.route("0.0.0.0/0", "direct");
    lab.start_relays(&[cfg]);
    let server = TestServer::bind(&lab.server, sock(&format!("0.0.0.0:{SERVER_PORT}")));
    let pins = AgentPins(PathBuf::from(format!(
        "/sys/fs/bpf/splitway-test-agentc-{}",
        std::process::id()
    )));
    let route = format!("10.0.3.0/24={relay_addr}");
    let enable = pins.run(&[
        "enable",
        "--cgroup",
        cgroup.0.to_str().unwrap(),
        "--route",
        &route,
    ]);
    assert!(
        enable.status.success(),
        "{}",
        String::from_utf8_lossy(&enable.stderr)
    );
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 10, 1);
    let out = child.wait_with_output().expect("child client");
    assert!(
        !out.status.success(),
        "a connection whose option was lost must be refused"
    );
    assert_eq!(
        agent_stat(&pins, "options_written"),
        1,
        "the agent did write the option"
    );
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "syn_option")],
        1.0,
        deadline,
    );
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}

/// A middlebox strips the option: the relay refuses cleanly, and an agent
/// with `--fallback direct` sends that destination's next connection to the
/// server directly instead of to the relay again.
#[test]
fn a_stripped_option_is_refused_and_the_agent_falls_back_to_direct() {
    require_netns!();
    let Some(cgroup) = Cgroup::create("strip") else {
        eprintln!("skipping: no cgroup2 mount");
        return;
    };
    let deadline = Deadline::after(Duration::from_secs(60));
    let mut lab = Lab::chain(&["rc"]);
    let relay_addr = format!("{ENTRY_V4}:{SYNOPT_PORT}");
    let mut cfg = RelayConfig::new("rc");
    cfg.listen(ListenMode::SynOption, &relay_addr);
    cfg.listeners[0].allow_clients = vec!["10.0.1.0/24".into()];
    cfg.route("0.0.0.0/0", "direct");
    lab.start_relays(&[cfg]);
    let server = TestServer::bind(&lab.server, sock(&format!("0.0.0.0:{SERVER_PORT}")));
    // The middlebox: the client host's own egress drops our option.
    let strip = lab
        .client
        .exec(
            "iptables",
            &[
                "-t",
                "mangle",
                "-A",
                "POSTROUTING",
                "-p",
                "tcp",
                "--syn",
                "-j",
                "TCPOPTSTRIP",
                "--strip-options",
                "253",
            ],
        )
        .expect("iptables TCPOPTSTRIP");
    assert!(
        strip.status.success(),
        "TCPOPTSTRIP: {}",
        String::from_utf8_lossy(&strip.stderr)
    );
    let pins = AgentPins(PathBuf::from(format!(
        "/sys/fs/bpf/splitway-test-agents-{}",
        std::process::id()
    )));
    let route = format!("10.0.3.0/24={relay_addr}");
    let enable = pins.run(&[
        "enable",
        "--cgroup",
        cgroup.0.to_str().unwrap(),
        "--route",
        &route,
        "--fallback",
        "direct",
    ]);
    assert!(
        enable.status.success(),
        "{}",
        String::from_utf8_lossy(&enable.stderr)
    );
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));

    // 1. The option was written and stripped: refused, nothing dialed.
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 10, 1);
    let out = child.wait_with_output().expect("child client");
    assert!(
        !out.status.success(),
        "a connection whose option was stripped must be refused"
    );
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "syn_option")],
        1.0,
        deadline,
    );
    server.assert_no_pending_connection();
    assert_eq!(agent_stat(&pins, "options_written"), 1);
    assert_eq!(
        agent_stat(&pins, "refusals_seen"),
        1,
        "the agent saw the refusal"
    );

    // 2. The same destination now goes direct, every byte both ways.
    let (up, down) = (MIB + 3, MIB + 7);
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, up, 0x51);
    let (mut conn, peer) = server.accept(deadline.remaining("direct accept"));
    assert_eq!(
        peer.ip().to_string(),
        "10.0.1.1",
        "after the refusal the client reaches the server directly"
    );
    let got_up = recv_all(&mut conn).expect("server receive");
    let sent_down = send_pattern(&mut conn, down, 0x52).expect("server send");
    drop(conn);
    let out = child.wait_with_output().expect("child client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "direct fallback failed: {stdout}");
    assert!(stdout.contains(&format!("SENT {got_up}")), "{stdout}");
    assert!(stdout.contains(&format!("GOT {sent_down}")), "{stdout}");
    assert_eq!(agent_stat(&pins, "fallback_refused"), 1);
    assert_eq!(
        agent_stat(&pins, "redirected_v4"),
        1,
        "only the first went to the relay"
    );
    lab.assert_relays_alive();
    let _ = &mut lab;
}

/// The agent's commands say what is wrong, and touch nothing when refused.
#[test]
fn agent_commands_refuse_bad_input_clearly() {
    require_netns!();
    let pins = AgentPins(PathBuf::from(format!(
        "/sys/fs/bpf/splitway-test-agente-{}",
        std::process::id()
    )));
    let not_cgroup = std::env::temp_dir();
    let out = pins.run(&[
        "enable",
        "--cgroup",
        not_cgroup.to_str().unwrap(),
        "--route",
        "10.0.0.0/8=192.0.2.1:7200",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("not a cgroup v2 directory"), "{err}");
    for (route, why) in [
        ("10.0.0.0/33=192.0.2.1:7200", "prefix length is 0..=32"),
        ("10.0.0.0/8=[2001:db8::1]:7200", "address family differs"),
        (
            "10.0.0.0/8=192.0.2.1:7200#3",
            "only IPv6 routes take a prefix index",
        ),
        (
            "2001:db8::/48=[2001:db8::1]:7200#200",
            "prefix index is 0..=127",
        ),
        ("10.0.0.0/8", "expected PREFIX=RELAY"),
    ] {
        let out = pins.run(&["enable", "--cgroup", "/", "--route", route]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{route} accepted");
        assert!(err.contains(why), "{route}: {err}");
    }
    assert!(!pins.0.exists(), "a refused enable pinned something");
    let status = pins.run(&["status"]);
    assert_eq!(status.status.code(), Some(3), "status of a disabled agent");
}

/// Drops the first SYN-ACK from `port` arriving in `ns`: the client
/// retransmits its SYN a second later, so the relay surely read the first
/// SYN's event before the accept (on a veth pair either may come first).
fn drop_first_syn_ack(ns: &Netns, port: u16) {
    let script = format!(
        "table inet swsynopt {{\n chain input {{\n  type filter hook input priority 0;\n  \
         tcp sport {port} tcp flags & (syn | ack) == syn | ack numgen inc mod 1000000 == 0 drop\n }}\n}}\n"
    );
    nft(ns, &script);
}

/// Early SYN for a syn-option listener with `watch`: the tc detector finds
/// the agent's option in the client's SYN, so the relay dials the server
/// before accept, and the accepted socket takes that leg (`hit`). A SYN
/// without the option and a client outside the listener's `allow_clients`
/// start nothing: the server sees no dial.
#[test]
fn early_syn_dials_at_the_syn_for_a_watched_syn_option_listener() {
    require_netns!();
    let Some(cgroup) = Cgroup::create("early") else {
        eprintln!("skipping: no cgroup2 mount");
        return;
    };
    let deadline = Deadline::after(Duration::from_secs(90));
    let mut lab = Lab::chain(&["rc"]);
    let relay_addr = format!("{ENTRY_V4}:{SYNOPT_PORT}");
    // Port 7201 admits no one the lab has: its SYNs must dial nothing.
    let closed_addr = format!("{ENTRY_V4}:{}", SYNOPT_PORT + 1);
    let mut cfg = RelayConfig::new("rc");
    cfg.route("0.0.0.0/0", "direct");
    for (addr, allow) in [(&relay_addr, "10.0.1.0/24"), (&closed_addr, "192.0.2.0/24")] {
        cfg.listener(RawListener {
            allow_clients: vec![allow.into()],
            watch: vec![WEST_IF.into()],
            ..RawListener::new(ListenMode::SynOption, addr.as_str())
        });
    }
    cfg.accel(|a| a.pool = Some(false));
    lab.start_relays(&[cfg]);
    let status = admin_status(lab.relay_ns("rc")).expect("relay status");
    assert!(
        status.features.early_syn,
        "early SYN must be on by the auto rule: {status:?}"
    );

    let server = TestServer::bind(&lab.server, sock(&format!("0.0.0.0:{SERVER_PORT}")));
    let pins = AgentPins(PathBuf::from(format!(
        "/sys/fs/bpf/splitway-test-agent-early-{}",
        std::process::id()
    )));
    let enable = |to: &str| {
        let route = format!("10.0.3.0/24={to}");
        let out = pins.run(&[
            "enable",
            "--cgroup",
            cgroup.0.to_str().unwrap(),
            "--route",
            &route,
        ]);
        assert!(
            out.status.success(),
            "agent enable: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    enable(&relay_addr);
    let early = |outcome: &str| {
        lab.metrics("rc")
            .counter("splitway_early_syn_total", &[("outcome", outcome)])
    };

    // 1. Started at the SYN, taken at accept; sha256 both ways. The first
    // SYN-ACK is lost: the leg is at the server before the handshake ends.
    drop_first_syn_ack(&lab.client, SYNOPT_PORT);
    let (up, down) = (MIB + 3, 2 * MIB + 1);
    let dst = sock(&format!("{SERVER_V4}:{SERVER_PORT}"));
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, up, 0xE51);
    let (mut conn, peer) = server.accept(deadline.remaining("server accept"));
    assert_peer_ip(peer, LAST_RELAY_V4);
    let got_up = recv_all(&mut conn).expect("server receive");
    let sent_down = send_pattern(&mut conn, down, 0xE52).expect("server send");
    drop(conn);
    let out = child.wait_with_output().expect("child client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child client failed: {stdout}");
    assert!(
        stdout.contains(&format!("SENT {got_up}")),
        "client→server bytes differ: server got {got_up}; child: {stdout}"
    );
    assert!(
        stdout.contains(&format!("GOT {sent_down}")),
        "server→client bytes differ: server sent {sent_down}; child: {stdout}"
    );
    lab.wait_counter(
        "rc",
        "splitway_early_syn_total",
        &[("outcome", "hit")],
        1.0,
        deadline,
    );
    assert_eq!(early("started"), 1.0, "one leg started at the SYN");
    assert_eq!(early("miss"), 0.0, "the accept found its early leg");
    assert!(
        early("duplicate") >= 1.0,
        "the retransmitted SYN carried the option too"
    );

    // 2. No option (outside the agent's cgroup): the detector reports
    // nothing, accept refuses it, nothing is dialed.
    match connect_in(&lab.client, sock(&relay_addr)) {
        Ok(mut plain) => {
            expect_reset(&mut plain, "client without the destination option");
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "syn_option")],
        1.0,
        deadline,
    );

    // 3. A client the listener does not admit: its SYN carries a valid
    // option, yet starts nothing; accept refuses it.
    enable(&closed_addr);
    let child = spawn_child(&cgroup.0, lab.client.name(), dst, 10, 1);
    let out = child.wait_with_output().expect("child client");
    assert!(!out.status.success(), "a refused client must fail");
    lab.wait_counter(
        "rc",
        "splitway_early_syn_total",
        &[("outcome", "denied")],
        1.0,
        deadline,
    );
    lab.wait_counter(
        "rc",
        "splitway_denied_total",
        &[("reason", "client")],
        1.0,
        deadline,
    );
    assert_eq!(early("started"), 1.0, "refused SYNs start no leg");
    server.assert_no_pending_connection();
    lab.assert_relays_alive();
}
