//! The `splitway-relay` binary itself (what the systemd unit and the
//! container image run): its commands, and a dependency tree without the
//! lab.

use std::process::Command;

const RELAY: &str = env!("CARGO_BIN_EXE_splitway-relay");

fn run(args: &[&str]) -> std::process::Output {
    Command::new(RELAY)
        .args(args)
        .output()
        .expect("run splitway-relay")
}

#[test]
fn keygen_prints_a_key_and_version_names_the_build() {
    let out = run(&["keygen"]);
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(key.trim().len(), 64, "{key}");
    assert!(key.trim().chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    let out = run(&["--version"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("commit: "), "{text}");
}

/// `relay --check` validates a config (no file, no namespace needed for a
/// loopback SOCKS5 listener) and exits 78 on an invalid one, naming the key.
#[test]
fn relay_check_validates_and_refuses_with_ex_config() {
    let dir = std::env::temp_dir().join(format!("splitway-relay-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "name = \"t\"\n[[listen]]\nmode = \"socks5\"\naddr = \"127.0.0.1:1080\"\n\
         [[route]]\ndst = \"0.0.0.0/0\"\nvia = \"direct\"\n",
    )
    .expect("write config");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "name = \"t\"\n[[listen]]\nmode = \"warp\"\naddr = \"x\"\n",
    )
    .expect("write config");
    let ok = run(&["relay", "--config", good.to_str().unwrap(), "--check"]);
    let refused = run(&["relay", "--config", bad.to_str().unwrap(), "--check"]);
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
    assert!(ok.status.success(), "{ok:?}");
    assert_eq!(refused.status.code(), Some(78), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr).to_string()
        + &String::from_utf8_lossy(&refused.stdout);
    assert!(said.contains("listen[0].mode"), "{said}");
}

/// No lab, bypass or agent command, and no lab crate in its dependencies.
#[test]
fn holds_the_relays_commands_only() {
    let help = String::from_utf8(run(&["--help"]).stdout).expect("utf-8");
    for command in ["relay", "keygen", "ctl"] {
        assert!(help.contains(command), "{help}");
    }
    for absent in ["lab", "bypass", "agent"] {
        assert!(
            !help.lines().any(|l| l.trim_start().starts_with(absent)),
            "{absent} in:\n{help}"
        );
    }
    let manifest = include_str!("../Cargo.toml");
    assert!(!manifest.contains("splitway-lab"), "{manifest}");
}
