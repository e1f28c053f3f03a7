//! `splitway lab` end to end: the real runner on a tiny chain (RTTs of a few
//! ms, one repetition) builds the namespaces and emulated links, starts
//! nginx, HAProxy, ssh -L/sshd and splitway relays, downloads through each
//! configuration with curl, over IPv4, IPv6 and both mixes (IPv4 ends over
//! IPv6 relay legs and the reverse, `--family all`), and writes the JSON
//! and the charts. Fails when a configuration stops producing a measured
//! row with the model beside it in any of them.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

const CONFIGS: [&str; 6] = ["e2e", "haproxy", "ssh", "split", "default", "agent"];
const SIZES: [u64; 2] = [10_000, 100_000];

const SCENARIO: &str = r#"
name = "smoke"
description = "runner smoke test: tiny RTTs"
configs = ["e2e", "haproxy", "ssh", "split", "default", "agent"]

[workload]
sizes = ["10KB", "100KB"]
reps = 1
quick_reps = 1
timeout_s = 20

[[chain]]
name = "tiny"
hosts = ["client", "r1", "r2", "server"]

[[chain.link]]
rtt_ms = 4
rate_mbit = 100
queue_packets = 400

[[chain.link]]
rtt_ms = 8
rate_mbit = 1000

[[chain.link]]
rtt_ms = 2
rate_mbit = 1000
"#;

#[test]
fn lab_runner_measures_every_configuration() {
    require_netns!();
    let dir = TempDir::new();
    let scenario = dir.join("smoke.toml");
    std::fs::write(&scenario, SCENARIO).expect("write the scenario");
    let json = dir.join("smoke.json");
    let charts = dir.join("charts");
    let mut child = Command::new(SPLITWAY)
        .arg("lab")
        .arg("scenario")
        .arg(&scenario)
        .arg("--json")
        .arg(&json)
        .arg("--out-dir")
        .arg(&charts)
        .args(["--family", "all"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start splitway lab");
    // The lab tears its namespaces down on SIGTERM; past the deadline it
    // gets one, and the test fails.
    let pid = child.id();
    let deadline = Deadline::after(Duration::from_secs(180));
    let finished = poll_until(deadline, || child.try_wait().expect("wait for the lab"));
    if finished.is_none() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let out = child.wait_with_output().expect("collect the lab's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        finished.is_some() && out.status.success(),
        "splitway lab failed ({:?}, timed out: {}):\n{stdout}\n{stderr}",
        out.status,
        finished.is_none()
    );

    eprintln!("{stdout}");
    let text = std::fs::read_to_string(&json).expect("the lab wrote its JSON");
    let report: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for key in ["commit", "kernel", "date", "load_average_start"] {
        assert!(report[key].as_str().is_some_and(|s| !s.is_empty()), "{key}");
    }
    assert!(
        report["load_average_end"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    let families = [
        ("ipv4", "tiny", ""),
        ("ipv6", "tiny (IPv6)", "-ipv6"),
        (
            "ipv4-over-ipv6",
            "tiny (IPv4 over IPv6 legs)",
            "-ipv4-over-ipv6-legs",
        ),
        (
            "ipv6-over-ipv4",
            "tiny (IPv6 over IPv4 legs)",
            "-ipv6-over-ipv4-legs",
        ),
    ];
    assert_eq!(
        report["chains"].as_array().map(Vec::len),
        Some(families.len()),
        "{text}"
    );
    for (index, (family, name, _)) in families.into_iter().enumerate() {
        let chain = &report["chains"][index];
        assert_eq!(chain["family"], family, "{text}");
        assert_eq!(chain["name"], name, "{text}");
        check_rows(chain, &stdout, &text);
        // Each table, and each family's ratios to IPv4 that end the report.
        assert!(stdout.contains(&format!("== {name}:")), "{stdout}");
    }
    for ratios in [
        "== tiny: IPv6 / IPv4",
        "== tiny: IPv4 over IPv6 legs / IPv4",
        "== tiny: IPv6 over IPv4 legs / IPv4",
    ] {
        assert!(stdout.contains(ratios), "{stdout}");
    }
    for name in families.map(|(_, _, suffix)| format!("smoke-tiny{suffix}.svg")) {
        let chart = charts.join(name);
        let svg = std::fs::read_to_string(&chart).expect("the lab drew its chart");
        assert!(svg.contains("<svg") && svg.contains("haproxy"), "{chart:?}");
    }
}

/// Every configuration and size of one chain measured, with its model.
fn check_rows(chain: &serde_json::Value, stdout: &str, text: &str) {
    let rows = chain["results"].as_array().expect("one chain's results");
    assert_eq!(rows.len(), CONFIGS.len() * SIZES.len(), "{text}");
    for config in CONFIGS {
        for size in SIZES {
            let row = rows
                .iter()
                .find(|r| r["config"] == config && r["size_bytes"] == size)
                .unwrap_or_else(|| panic!("no row for {config} {size}:\n{stdout}"));
            let what = format!("{config} {size}: {row}");
            assert_eq!(row["status"], "ok", "{what}");
            assert_eq!(row["n"], 1, "{what}");
            assert_eq!(row["failures"], 0, "{what}");
            let model_ttfb = row["model_ttfb_ms"].as_f64().expect("model TTFB");
            let model_total = row["model_total_ms"].as_f64().expect("model total");
            assert!(model_ttfb > 0.0 && model_total >= model_ttfb, "{what}");
            let ttfb = row["ttfb_ms"]["median"].as_f64().expect("measured TTFB");
            let total = row["total_ms"]["median"].as_f64().expect("measured total");
            // The handshakes cross the emulated links: a TTFB well under
            // the model's means the download took another path.
            assert!(ttfb >= 0.9 * model_ttfb, "{what}");
            assert!(total >= ttfb, "{what}");
            assert_eq!(
                row["emulator"]["links"].as_array().map(Vec::len),
                Some(3),
                "{what}"
            );
            assert!(row["emulator_shift"]["ttfb_ms"].is_f64(), "{what}");
            assert!(row["premise"].is_array(), "{what}");
        }
        assert!(
            stdout.lines().any(|l| l.starts_with(config)),
            "no table line for {config}:\n{stdout}"
        );
    }
    let median = |config: &str, size: u64, figure: &str| {
        rows.iter()
            .find(|r| r["config"] == config && r["size_bytes"] == size)
            .and_then(|r| r[figure]["median"].as_f64())
            .unwrap_or_else(|| panic!("a measured {figure} for {config} {size}"))
    };
    let total = |config: &str, size: u64| median(config, size, "total_ms");
    // The agent's connections ride the relays (the destination in the SYN,
    // over IPv6 in the option's indexed form): a connection the agent left
    // direct would take e2e's handshake over the whole chain.
    let ttfb = |config: &str| median(config, SIZES[0], "ttfb_ms");
    assert!(
        ttfb("agent") < ttfb("e2e") - 3.0,
        "agent TTFB {} ms against e2e {} ms:\n{stdout}",
        ttfb("agent"),
        ttfb("e2e")
    );
    // The README's minimal config (learned windows on the relay legs) is
    // never much slower than every acceleration off: a window learned
    // wrong (a stuck ssthresh, a retreat loop) costs whole round trips.
    for size in SIZES {
        let (default, split) = (total("default", size), total("split", size));
        assert!(
            default <= 2.0 * split + 50.0,
            "default {default} ms against split {split} ms at {size} B:\n{stdout}"
        );
    }
}
