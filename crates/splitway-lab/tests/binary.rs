//! The `splitway-lab` binary (issue #31: one binary per product): the same
//! command line as `splitway lab`, runnable without root for what needs
//! none.

use std::process::Command;

const LAB: &str = env!("CARGO_BIN_EXE_splitway-lab");

fn run(args: &[&str]) -> String {
    let out = Command::new(LAB)
        .args(args)
        .output()
        .expect("run splitway-lab");
    assert!(
        out.status.success(),
        "splitway-lab {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn lists_scenarios_and_prints_the_model_as_splitway_lab_does() {
    let list = run(&["list"]);
    for name in ["paper-ktcp", "geo-satellite", "leo-handover", "njit-lossy"] {
        assert!(list.contains(name), "{name} missing from:\n{list}");
    }
    // Its chart goes to a directory of the test's own, removed after.
    let charts = std::env::temp_dir().join(format!("swlab-bin-{}", std::process::id()));
    let out_dir = charts.to_str().expect("utf-8 path");
    let model = run(&[
        "scenario",
        "geo-satellite",
        "--model-only",
        "--out-dir",
        out_dir,
    ]);
    let chart_written = charts.join("geo-satellite.svg").is_file();
    std::fs::remove_dir_all(&charts).expect("remove the charts");
    assert!(model.contains("geo-satellite"), "{model}");
    assert!(model.contains("default"), "{model}");
    assert!(chart_written, "no chart in {out_dir}");
}

#[test]
fn a_bad_argument_fails_with_usage() {
    let out = Command::new(LAB)
        .args(["scenario"])
        .output()
        .expect("run splitway-lab");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Usage: splitway-lab"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
