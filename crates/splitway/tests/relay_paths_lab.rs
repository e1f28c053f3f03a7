//! `splitway lab` on a graph scenario, end to end and fast (about 40 s):
//! a detour beats the direct path, then the relay it took is killed, then
//! the other relay's link goes down (a black hole, not a refusal). The
//! runner builds the graph, runs the relays and one oracle per candidate,
//! checks every response byte, and records per phase which path the
//! server saw. No degradation phase: that one waits out the relay's 60 s
//! hold (`make lab-paths` runs the full `path-choice` scenario).
//!
//! TTFB against the oracle is the lab's figure; with 3 samples on a shared
//! machine it is not asserted here. The choice, the switch time and the
//! phases are.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

const SCENARIO: &str = r#"
name = "paths-smoke"
description = "graph runner smoke test"

[[host]]
name = "client"
[[host]]
name = "rc"
[[host]]
name = "rs1"
[[host]]
name = "rs2"
[[host]]
name = "server"

[[link]]
name = "access"
between = ["client", "rc"]
rtt_ms = 1
rate_mbit = 1000
[[link]]
name = "direct"
between = ["rc", "server"]
rtt_ms = 120
rate_mbit = 100
[[link]]
name = "rc-rs1"
between = ["rc", "rs1"]
rtt_ms = 20
rate_mbit = 100
[[link]]
name = "rc-rs2"
between = ["rc", "rs2"]
rtt_ms = 40
rate_mbit = 100
[[link]]
name = "rs1-server"
between = ["rs1", "server"]
rtt_ms = 2
rate_mbit = 1000
[[link]]
name = "rs2-server"
between = ["rs2", "server"]
rtt_ms = 2
rate_mbit = 1000

[paths]
client = "client"
server = "server"
relay = "rc"
candidates = ["direct", "rs1", "rs2"]
samples = 3
first_phase = "detour"

[[event]]
at = "10s"
phase = "rs1 dead"
kill = "rs1"

[[event]]
at = "20s"
phase = "rs2 cut off"
link = "rc-rs2"
down = true
"#;

#[test]
fn graph_scenario_moves_away_from_dead_and_cut_off_relays() {
    require_netns!();
    let _heavy = heavy_lock();
    let dir = TempDir::new();
    let scenario = dir.join("paths-smoke.toml");
    std::fs::write(&scenario, SCENARIO).expect("write the scenario");
    let json = dir.join("paths.json");
    let mut child = Command::new(SPLITWAY)
        .args(["lab", "scenario"])
        .arg(&scenario)
        .arg("--json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start splitway lab");
    let pid = child.id();
    let finished = poll_until(Deadline::after(Duration::from_secs(120)), || {
        child.try_wait().expect("wait for the lab")
    });
    if finished.is_none() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let out = child.wait_with_output().expect("collect the lab's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(finished.is_some(), "the lab did not finish in 120 s");
    let text = std::fs::read_to_string(&json).expect("the lab wrote its JSON");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for key in ["commit", "kernel", "date", "load_before", "load_after"] {
        assert!(doc[key].as_str().is_some_and(|s| !s.is_empty()), "{key}");
    }
    let phases = doc["phases"].as_array().expect("phases");
    let want = [
        ("detour", "direct", "rs1", None),
        ("rs1 dead", "rs1", "rs2", Some("rs1")),
        ("rs2 cut off", "rs2", "direct", Some("rs2")),
    ];
    assert_eq!(phases.len(), want.len(), "{text}");
    for (p, (name, before, after, dead)) in phases.iter().zip(want) {
        let what = format!("{name}: {p}");
        assert_eq!(p["phase"], name, "{what}");
        assert_eq!(p["chosen_before"], before, "{what}");
        assert_eq!(p["chosen"], after, "{what}");
        assert_eq!(p["oracle_path"], after, "{what}");
        // Every steady-state connection took the new path, as the server saw.
        assert_eq!(p["paths_taken"], serde_json::json!({ after: 3 }), "{what}");
        let switch = p["switch_s"].as_f64().expect("a switch was timed");
        assert!(switch <= 3.0, "{what}");
        assert_eq!(p["flips"], 1, "{what}");
        if let Some(dead) = dead {
            assert!(p["per_path_ttfb_ms"][dead].is_null(), "{what}");
        }
        for (peer, rate) in p["probes_per_s"].as_object().expect("probe rates") {
            let rate = rate.as_f64().expect("a rate");
            assert!(rate <= 1.2, "{what}: {peer} probed {rate}/s");
        }
        let ttfb = p["ttfb_ms"].as_f64().expect("TTFB");
        let oracle = p["oracle_ttfb_ms"].as_f64().expect("oracle TTFB");
        assert!(ttfb > 0.0 && oracle > 0.0, "{what}");
        // Anything missed other than the TTFB figure fails here too.
        for m in p["missed"].as_array().expect("missed") {
            assert!(m.as_str().is_some_and(|m| m.starts_with("TTFB")), "{what}");
        }
    }
    assert_eq!(doc["flips"], 3, "{text}");
    assert!(
        out.status.success() || !doc["targets"]["met"].as_bool().expect("met"),
        "exit status and targets.met disagree: {:?}",
        out.status
    );
}
