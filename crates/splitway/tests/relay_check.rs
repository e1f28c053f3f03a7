//! `splitway relay --config FILE --check`: validates without starting
//! anything, reports every error by its key, and accepts a good config.

mod support;

use std::process::Command;

use support::*;

fn check(config: &str) -> (bool, String) {
    let dir = TempDir::new();
    let psk = dir.join("psk.key");
    write_psk(&psk, 9);
    let path = dir.join("relay.toml");
    std::fs::write(&path, config.replace("@PSK@", psk.to_str().expect("utf-8"))).expect("write");
    let out = output(
        Command::new(SPLITWAY)
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

const GOOD: &str = r#"
name = "rc"
psk_file = "@PSK@"
admin = "127.0.0.1:9090"

[[listen]]
mode = "tproxy"
addr = "0.0.0.0:7000"
intercept = { interfaces = ["west"], ports = [80, 5001] }

[[listen]]
mode = "socks5"
addr = "127.0.0.1:1080"

[[listen]]
mode = "http-connect"
addr = "127.0.0.1:3128"

[[peer]]
name = "rs"
addr = "10.0.12.2:7100"
congestion = "bbr"
nodelay = true
keepalive = "30s"

[[route]]
dst = "10.0.3.0/24"
via = "rs"

[[route]]
dst = "fd00:3::/64"
via = "rs"

[[route]]
dst = "0.0.0.0/0"
via = "direct"

[timeouts]
connect = "10s"
handshake = "10s"
idle = "5m"

[forwarding]
data_path = "auto"
"#;

#[test]
fn check_accepts_a_good_config() {
    let (ok, text) = check(GOOD);
    assert!(ok, "--check rejected a valid config:\n{text}");
}

#[test]
fn check_lists_every_error_by_key() {
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

#[test]
fn a_bad_config_exits_with_ex_config() {
    let dir = TempDir::new();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "name = \"rc\"\nbogus_key = 1\n").expect("write");
    for check in [true, false] {
        let mut cmd = Command::new(SPLITWAY);
        cmd.args(["relay", "--config"]).arg(&path);
        if check {
            cmd.arg("--check");
        }
        let out = output(&mut cmd);
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

/// `--check` says, for this host, what each acceleration will do and why:
/// unset switches are auto, explicit ones are reported as asked.
#[test]
fn check_says_what_each_acceleration_will_do_here() {
    let (ok, text) = check(GOOD);
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
    assert!(
        text.contains("tfo_server: off (requested auto): opt-in only"),
        "{text}"
    );
    // Turned off explicitly: said so, with the key.
    let (ok, text) = check(&format!(
        "{GOOD}\n[accel]\npool = false\nzero_rtt = false\n"
    ));
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
