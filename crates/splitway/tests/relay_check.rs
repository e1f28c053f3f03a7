//! `splitway relay --config FILE --check`: validates without starting
//! anything, reports every error by its key, and accepts a good config.

mod support;

use std::path::Path;
use std::process::Command;

use splitway_lab::testbed::config::{
    self as testbed, DataPath, Intercept, ListenMode, RawAccel, RawConfig, RawForwarding,
    RawListener, RawPeer, RawRoute, RawTimeouts,
};

use splitway_sys::netns::{self, Netns};
use support::*;

/// A fresh namespace for `--check` to test against, removed on drop: its
/// own free ports, and the interface `west` the configs intercept on.
fn check_host() -> Netns {
    let ns = Netns::create(&netns::unique_name("swchk")).expect("create netns");
    ns.ip(&[
        "link", "add", "west", "type", "veth", "peer", "name", "westpeer",
    ])
    .expect("add west");
    ns
}

fn check(config: &str) -> (bool, String) {
    let dir = TempDir::new();
    let psk = dir.join("psk.key");
    write_psk(&psk, 9);
    let path = dir.join("relay.toml");
    std::fs::write(&path, config.replace("@PSK@", psk.to_str().expect("utf-8"))).expect("write");
    let host = check_host();
    let out = output(
        host.command(SPLITWAY)
            .args(["relay", "--config"])
            .arg(&path)
            .arg("--check"),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A valid config of an entry relay, typed; its key file is `@PSK@`.
fn good() -> RawConfig {
    let mut cfg = testbed::relay("rc", "127.0.0.1:9090", Some(Path::new("@PSK@")));
    let mut tproxy = RawListener::new(ListenMode::Tproxy, "0.0.0.0:7000");
    tproxy.intercept = Some(Intercept {
        interfaces: vec!["west".into()],
        ports: vec![80, 5001],
    });
    cfg.listen = vec![
        tproxy,
        RawListener::new(ListenMode::Socks5, "127.0.0.1:1080"),
        RawListener::new(ListenMode::HttpConnect, "127.0.0.1:3128"),
    ];
    let mut rs = RawPeer::new("rs", "10.0.12.2:7100");
    rs.congestion = Some("bbr".into());
    rs.nodelay = Some(true);
    rs.keepalive = Some("30s".into());
    cfg.peer.push(rs);
    cfg.route = vec![
        RawRoute::new("10.0.3.0/24", "rs"),
        RawRoute::new("fd00:3::/64", "rs"),
        RawRoute::new("0.0.0.0/0", "direct"),
    ];
    cfg.timeouts = Some(RawTimeouts {
        connect: Some("10s".into()),
        handshake: Some("10s".into()),
        idle: Some("5m".into()),
        pooled_header: None,
    });
    cfg.forwarding = Some(RawForwarding {
        data_path: Some(DataPath::Auto),
    });
    cfg
}

#[test]
fn check_accepts_a_good_config() {
    let (ok, text) = check(&good().to_toml());
    assert!(ok, "--check rejected a valid config:\n{text}");
}

#[test]
fn check_lists_every_error_by_key() {
    // TOML text on purpose: unknown keys and malformed values are what a
    // typed RawConfig cannot express.
    let bad = r#"
name = "rc"
psk_file = "@PSK@"
surprise_option = true

[[listen]]
mode = "socks5"
addr = "127.0.0.1:1080"

[[listen]]
mode = "tproxy"
addr = "not-an-address"

[[peer]]
name = "rs"
addr = "10.0.12.2"

[[route]]
dst = "10.0.3.0/24"
via = "nowhere"

[[route]]
dst = "10.0.3.0/33"
via = "direct"
"#;
    let (ok, text) = check(bad);
    assert!(!ok, "--check accepted an invalid config:\n{text}");
    for key in [
        "surprise_option",
        "listen[1].addr",
        "peer[0].addr",
        "route[0].via",
        "route[1].dst",
    ] {
        assert!(
            text.contains(key),
            "--check output does not name {key}:\n{text}"
        );
    }
}

/// An interface `intercept` names that the host lacks would intercept
/// nothing: `--check` and a start both refuse it (78), naming the key and
/// what the host has instead.
#[test]
fn a_missing_interface_is_an_error_at_check_and_at_start() {
    let mut cfg = good();
    cfg.listen[0].intercept = Some(Intercept {
        interfaces: vec!["west".into(), "eth9".into()],
        ports: vec![80],
    });
    let (ok, text) = check(&cfg.to_toml());
    assert!(!ok, "{text}");
    assert!(
        text.contains("listen[0].intercept.interfaces[1]: no interface `eth9` here, so nothing would be intercepted (this host has `west`, `westpeer`: name the one clients reach it on)"),
        "{text}"
    );
    assert!(!text.contains("interfaces[0]"), "west exists: {text}");
    // A start refuses before it installs or binds anything.
    let dir = TempDir::new();
    let psk = dir.join("psk.key");
    write_psk(&psk, 9);
    let path = dir.join("relay.toml");
    let text = cfg.to_toml().replace("@PSK@", psk.to_str().expect("utf-8"));
    std::fs::write(&path, text).expect("write");
    let host = check_host();
    let out = output(
        host.command(SPLITWAY)
            .args(["relay", "--config"])
            .arg(&path),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("relay stopped:") && stderr.contains("no interface `eth9` here"),
        "{stderr}"
    );
}

/// A listening address another program holds fails `--check`, naming the
/// program: here this test itself, holding the SOCKS5 port in the namespace.
#[test]
fn check_names_who_holds_a_listening_port() {
    let host = check_host();
    let held = host
        .run_in(|| std::net::TcpListener::bind("127.0.0.1:1080"))
        .expect("thread")
        .expect("bind in netns");
    let dir = TempDir::new();
    let psk = dir.join("psk.key");
    write_psk(&psk, 9);
    let path = dir.join("relay.toml");
    let text = good()
        .to_toml()
        .replace("@PSK@", psk.to_str().expect("utf-8"));
    std::fs::write(&path, text).expect("write");
    let out = output(
        host.command(SPLITWAY)
            .args(["relay", "--check", "--config"])
            .arg(&path),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "listen[1].addr: 127.0.0.1:1080 is in use by {}",
            holder_name()
        )) && stderr.contains(&format!("(pid {})", std::process::id())),
        "{stderr}"
    );
    drop(held);
}

/// This process's name as the kernel keeps it (15 bytes at most).
fn holder_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .expect("comm")
        .trim()
        .to_owned()
}

/// The shipped examples: on a host without `eth0`, rc.toml says exactly
/// what to change; with one, both pass (rs.toml needs nothing of the host).
#[test]
fn the_shipped_examples_pass_check_or_say_what_to_change() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/etc-splitway");
    let dir = TempDir::new();
    for name in ["rc.toml", "rs.toml"] {
        std::fs::copy(examples.join(name), dir.join(name)).expect("copy example");
    }
    write_psk(&dir.join("psk.key"), 9);
    let run = |host: &Netns, name: &str| {
        let out = output(
            host.command(SPLITWAY)
                .args(["relay", "--check", "--config"])
                .arg(dir.join(name)),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let bare = Netns::create(&netns::unique_name("swchk")).expect("create netns");
    let (code, text) = run(&bare, "rc.toml");
    assert_eq!(code, Some(78), "{text}");
    assert!(
        text.contains("rc.toml: listen[0].intercept.interfaces[0]: no interface `eth0` here, so nothing would be intercepted (this host has only lo: name the interface clients arrive on)"),
        "{text}"
    );
    let (code, text) = run(&bare, "rs.toml");
    assert_eq!(code, Some(0), "{text}");
    let host = Netns::create(&netns::unique_name("swchk")).expect("create netns");
    host.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0peer",
    ])
    .expect("add eth0");
    let (code, text) = run(&host, "rc.toml");
    assert_eq!(code, Some(0), "{text}");
}

/// `splitway relay --check | head -1`: the reader goes away after a line;
/// the command ends as `cat` would (SIGPIPE), not with a panic (101).
#[test]
fn check_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = TempDir::new();
    let path = dir.join("relay.toml");
    let mut cfg = testbed::relay("rc", "off", None);
    cfg.listen = vec![RawListener::new(ListenMode::Socks5, "127.0.0.1:1080")];
    cfg.route = vec![RawRoute::new("0.0.0.0/0", "direct")];
    std::fs::write(&path, cfg.to_toml()).expect("write");
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(SPLITWAY)
        .args(["relay", "--check", "--config"])
        .arg(&path)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run splitway");
    let stderr = String::from_utf8_lossy(&out.stderr);
    const SIGPIPE: i32 = 13;
    assert_eq!(
        out.status.signal(),
        Some(SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `--version`: the version, the commit, the build date and which BPF
/// programs this binary holds (or that a SPLITWAY_BPF_SKIP build has none).
#[test]
fn version_names_commit_date_and_bpf_programs() {
    for args in [&["--version"][..], &["relay", "--version"]] {
        let out = output(Command::new(SPLITWAY).args(args));
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with(&format!(" {}", env!("CARGO_PKG_VERSION"))),
            "{text}"
        );
        let commit = lines[1].strip_prefix("commit: ").expect("commit line");
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
            "{text}"
        );
        let date = lines[2].strip_prefix("built: ").expect("date line");
        assert!(
            date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-',
            "{text}"
        );
        let bpf = lines[3].strip_prefix("BPF programs: ").expect("BPF line");
        assert!(
            bpf.contains("syn_watch") || bpf.contains("SPLITWAY_BPF_SKIP=1"),
            "{text}"
        );
    }
    let short = output(Command::new(SPLITWAY).arg("-V"));
    let short = String::from_utf8_lossy(&short.stdout);
    assert_eq!(short.lines().count(), 1, "{short}");
}

#[test]
fn check_rejects_a_missing_file() {
    let out = output(Command::new(SPLITWAY).args([
        "relay",
        "--config",
        "/nonexistent/splitway.toml",
        "--check",
    ]));
    assert!(!out.status.success(), "--check succeeded on a missing file");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/splitway.toml"),
        "error should name the file:\n{stderr}"
    );
}

/// `splitway relay --config PATH`, with `--check` or not, run to its exit
/// (a bad config exits before starting anything).
fn relay(path: &Path, check: bool) -> std::process::Output {
    let mut cmd = Command::new(SPLITWAY);
    cmd.args(["relay", "--config"]).arg(path);
    if check {
        cmd.arg("--check");
    }
    output(&mut cmd)
}

#[test]
fn a_bad_config_exits_with_ex_config() {
    let dir = TempDir::new();
    let path = dir.join("bad.toml");
    // Text on purpose: an unknown key cannot be typed.
    std::fs::write(&path, "name = \"rc\"\nbogus_key = 1\n").expect("write");
    for check in [true, false] {
        let out = relay(&path, check);
        assert_eq!(
            out.status.code(),
            Some(78),
            "relay (check = {check}) on a bad config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("bogus_key"),
            "the error names the key"
        );
    }
}

/// A file that parses but whose key file cannot be read, or whose values
/// are wrong, is a config error too: 78 with or without `--check`, every
/// problem named by its key, and nothing started.
#[test]
fn invalid_values_and_unreadable_keys_exit_with_ex_config() {
    let dir = TempDir::new();
    let path = dir.join("relay.toml");
    let mut cfg = good();
    cfg.psk_file = Some(dir.join("missing.key").display().to_string());
    cfg.timeouts.as_mut().expect("set").idle = Some("0s".into());
    std::fs::write(&path, cfg.to_toml()).expect("write");
    for check in [true, false] {
        let out = relay(&path, check);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "check = {check}: {stderr}");
        assert!(
            stderr.contains("2 errors")
                && stderr.contains("psk_file: cannot read")
                && stderr.contains("missing.key")
                && stderr.contains("timeouts.idle: must be greater than zero"),
            "check = {check}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing reported as valid: {out:?}");
    }
}

/// `--check` says, for this host, what each acceleration will do and why:
/// unset switches are auto, explicit ones are reported as asked.
#[test]
fn check_says_what_each_acceleration_will_do_here() {
    let (ok, text) = check(&good().to_toml());
    assert!(ok, "{text}");
    for name in [
        "early_syn",
        "strict",
        "pool",
        "zero_rtt",
        "tfo_peer",
        "tfo_client",
        "tfo_server",
        "turbo_start",
        "learned_window",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no line for {name}:\n{text}"));
        assert!(
            ["active", "off", "unavailable"]
                .iter()
                .any(|s| line.starts_with(&format!("{name}: {s} ("))),
            "{line}"
        );
    }
    assert!(
        text.contains(
            "pool: active (requested auto): authenticated connections kept ready: rs 4..16"
        ),
        "{text}"
    );
    assert!(text.contains("zero_rtt: active (requested auto)"), "{text}");
    // An explicit `congestion` key wins over the learned window.
    assert!(
        text.contains(
            "learned_window: off (requested auto): every relay leg names its own congestion control"
        ),
        "{text}"
    );
    // Without one, the legs to rs learn their window (this host has BPF
    // struct_ops; the probe registers it for real and releases it).
    let mut learning = good();
    learning.peer[0].congestion = None;
    let (ok, text) = check(&learning.to_toml());
    assert!(ok, "{text}");
    assert!(
        text.contains(
            "learned_window: active (requested auto): splitway_resume on peer[0].congestion"
        ),
        "{text}"
    );
    assert!(
        text.contains("tfo_server: off (requested auto): opt-in only"),
        "{text}"
    );
    // Turned off explicitly: said so, with the key.
    let mut off = good();
    off.accel = Some(RawAccel {
        pool: Some(false),
        zero_rtt: Some(false),
        ..RawAccel::default()
    });
    let (ok, text) = check(&off.to_toml());
    assert!(ok, "{text}");
    assert!(
        text.contains("pool: off (requested off): turned off ([accel] pool = false)"),
        "{text}"
    );
    assert!(
        text.contains("tfo_peer: off (requested off): needs zero_rtt"),
        "{text}"
    );
}

/// `splitway relay` takes its options before or after the command, says
/// its exit codes in `--help`, and refuses bad arguments with exit 2.
#[test]
fn the_relay_command_line_takes_its_options_in_either_place() {
    let dir = TempDir::new();
    let psk = dir.join("psk.key");
    write_psk(&psk, 9);
    let path = dir.join("relay.toml");
    std::fs::write(
        &path,
        good().to_toml().replace("@PSK@", psk.to_str().unwrap()),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let host = check_host();
    for args in [
        vec!["relay", "--config", path, "--check"],
        vec!["relay", "-c", path, "--check", "--drain-timeout", "5s"],
        vec!["relay", "--log-format", "json", "--config", path, "--check"],
        vec!["--log-format", "json", "relay", "--config", path, "--check"],
    ] {
        let out = output(host.command(SPLITWAY).args(&args));
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid ("),
            "{args:?}: {out:?}"
        );
    }
    let help = output(Command::new(SPLITWAY).args(["relay", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    assert!(
        help.contains("RestartPreventExitStatus=78") && help.contains("--drain-timeout"),
        "{help}"
    );
    for bad in [
        vec!["relay"],
        vec!["relay", "--config", path, "--drain-timeout", "soon"],
        vec!["relay", "--config", path, "--what"],
    ] {
        let out = output(Command::new(SPLITWAY).args(&bad));
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
}

/// `--check` says how many threads will run connections, and why.
#[test]
fn check_says_how_many_workers_will_run() {
    let (ok, text) = check(&good().to_toml());
    assert!(ok, "{text}");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        text.lines()
            .any(|l| l == format!("workers: {cpus} (one per CPU)")),
        "{text}"
    );
    let mut cfg = good();
    cfg.workers = Some(3);
    let (ok, text) = check(&cfg.to_toml());
    assert!(ok, "{text}");
    assert!(
        text.lines().any(|l| l == "workers: 3 (set in the file)"),
        "{text}"
    );
}

/// `--check` prints the destinations refused whatever `allow_destinations`
/// says (issue #33): link-local and this host's addresses refused by
/// default, each with the key that allows it, and says when a key did.
#[test]
fn check_prints_the_effective_deny_list() {
    let (ok, text) = check(&good().to_toml());
    assert!(ok, "{text}");
    for line in [
        "refused destinations (policy):",
        "169.254.0.0/16, fe80::/10, fd00:ec2::254 (link-local, cloud metadata): refused (policy.allow_link_local = true allows)",
        "224.0.0.0/4, ff00::/8, 255.255.255.255 (multicast, broadcast): always",
    ] {
        assert!(text.lines().any(|l| l.trim() == line), "{line}\n{text}");
    }
    // This host's addresses, as read now (loopback at least).
    assert!(
        text.lines().any(|l| l.contains("this host's addresses")
            && l.contains("127.0.0.1")
            && l.contains("refused (policy.allow_host_addresses = true allows)")),
        "{text}"
    );
    let mut cfg = good();
    cfg.policy = Some(testbed::RawPolicy {
        allow_link_local: Some(true),
        allow_host_addresses: Some(true),
        allow_relay_clients: Some(true),
        ..Default::default()
    });
    let (ok, text) = check(&cfg.to_toml());
    assert!(ok, "{text}");
    for key in [
        "allow_link_local",
        "allow_host_addresses",
        "allow_relay_clients",
    ] {
        assert!(
            text.contains(&format!("allowed by policy.{key} = true")),
            "{key}\n{text}"
        );
    }
}
