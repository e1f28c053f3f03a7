//! The `splitway-tools` binary (issue #31: one binary per product): the
//! host tools' commands, as `splitway agent` and `splitway bypass` run them.

use std::process::Command;

const TOOLS: &str = env!("CARGO_BIN_EXE_splitway-tools");

#[test]
fn carries_agent_and_bypass_and_nothing_else() {
    let out = Command::new(TOOLS).arg("--help").output().expect("run");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("agent") && help.contains("bypass"), "{help}");
    for absent in ["relay", "lab", "ctl"] {
        let out = Command::new(TOOLS).arg(absent).output().expect("run");
        assert!(!out.status.success(), "`splitway-tools {absent}` ran");
    }
}

/// A read-only command answers in JSON (the pins may or may not exist).
#[test]
fn bypass_status_answers_in_json() {
    let out = Command::new(TOOLS)
        .args(["bypass", "status", "--json"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(status["enabled"].is_boolean(), "{status}");
}
