//! `splitway lab loss-fairness` (issue #29, item 3): loss isolation held to
//! fairness on a client's last mile that it shares with other traffic,
//! measured beside the kernel's default in one run.
//!
//! One chain, client - rc - rs - server, whose client leg is the
//! bottleneck (20 Mbit/s, 40 ms, a drop-tail queue of one BDP), in two
//! cases: its only losses are the queue's (congestion), or it also drops
//! 1 % toward the client at random (a radio last mile that also queues).
//! Two configurations: `default` (the README's minimal config: loss
//! isolation judges the client's legs) and `split+es+pool` (CUBIC named on
//! every leg: the kernel's behaviour, loss isolation off). For each, as in
//! `window-safety`: two downloads alone (the relay judges the client), then
//! an end-to-end bulk flow (kernel CUBIC, not relayed) runs alone for 5 s,
//! a download through the relays joins it, and both are timed at the
//! client over the 30 s after the download's first 2 s. Reported: the
//! relay download's share, what the end-to-end flow kept of its rate
//! alone, and rc's loss-isolation verdicts.

use std::path::Path;

use serde::Serialize;

use super::window_safety::{Bench, FairnessRep, fairness_rep, median, settle, write_json};
use super::{LabError, TempDir, admin_get, counter_value, watch_signals, write_objects};
use crate::model::Config;
use crate::report::{git_commit, kernel_release, load_average, utc_now_iso8601};
use crate::scenario::Scenario;
use crate::topology::Topology;

const SCENARIO: &str = r#"
name = "loss-fairness"
description = "loss isolation on a shared client last mile, with and without random loss, against a competing CUBIC flow"
configs = ["default", "split+es+pool"]
[workload]
sizes = ["10MB"]
reps = 3
timeout_s = 90
[[chain]]
name = "client leg 20 Mbit/s, 40 ms, queue 1 BDP: congestion loss only"
hosts = ["client", "rc", "rs", "server"]
[[chain.link]]
rtt_ms = 40
rate_mbit = 20
queue_packets = 69
[[chain.link]]
rtt_ms = 100
rate_mbit = 200
[[chain.link]]
rtt_ms = 10
rate_mbit = 200
[[chain]]
name = "the same with 1 % random loss toward the client"
hosts = ["client", "rc", "rs", "server"]
[[chain.link]]
rtt_ms = 40
rate_mbit = 20
queue_packets = 69
loss_one_way = [0.0, 0.01]
[[chain.link]]
rtt_ms = 100
rate_mbit = 200
[[chain.link]]
rtt_ms = 10
rate_mbit = 200
"#;

const DOWNLOAD: u64 = 10_000_000;
/// The verdicts rc counted (`splitway_loss_isolation_total{event}`).
const EVENTS: [&str; 4] = ["lossy", "congested", "clean", "applied"];

#[derive(Debug, Serialize)]
pub struct LossFairnessReport {
    pub date: String,
    pub commit: String,
    pub kernel: String,
    pub load_average_start: String,
    pub load_average_end: String,
    pub reps: u32,
    pub cases: Vec<CaseResult>,
}

#[derive(Debug, Serialize)]
pub struct CaseResult {
    pub case: String,
    pub configs: Vec<ConfigResult>,
}

#[derive(Debug, Serialize)]
pub struct ConfigResult {
    pub config: String,
    pub fairness: Vec<FairnessRep>,
    /// rc's `splitway_loss_isolation_total` by event at the end.
    pub loss_isolation: Vec<(String, f64)>,
    pub error: Option<String>,
}

/// rc's loss-isolation counters.
fn verdicts(topo: &Topology) -> Result<Vec<(String, f64)>, LabError> {
    let metrics = admin_get(&topo.relays()[0], "/metrics")?;
    let page = String::from_utf8_lossy(&metrics);
    Ok(EVENTS
        .iter()
        .map(|event| {
            let series = format!("splitway_loss_isolation_total{{event=\"{event}\"}}");
            let n = counter_value(&page, &series).unwrap_or(0.0);
            ((*event).to_owned(), n)
        })
        .collect())
}

fn run_config(
    config: Config,
    scenario: &Scenario,
    chain_index: usize,
    reps: u32,
    work: &Path,
) -> Result<ConfigResult, LabError> {
    let chain = &scenario.chains[chain_index];
    let bench = Bench::start(config, chain, work)?;
    let mut result = ConfigResult {
        config: config.name().to_owned(),
        fairness: Vec::new(),
        loss_isolation: Vec::new(),
        error: None,
    };
    let outcome = (|| {
        for rep in 0..reps {
            eprintln!("{}: {config}: fairness {}/{reps}", chain.name, rep + 1);
            // The client's legs alone first: what the relay judges them.
            bench.warm_up(DOWNLOAD, scenario.timeout)?;
            result
                .fairness
                .push(fairness_rep(&bench.topo, bench.server)?);
            if super::interrupted() {
                return Err(LabError::Interrupted);
            }
        }
        Ok(())
    })();
    result.loss_isolation = verdicts(&bench.topo)?;
    result.error = settle(outcome)?;
    Ok(result)
}

/// Runs both cases and both configurations `reps` times; prints the table
/// and writes the report to `json` if given.
pub fn run(reps: u32, json: Option<&Path>) -> Result<LossFairnessReport, LabError> {
    if !super::is_root() {
        return Err(LabError::NotRoot);
    }
    let scenario = Scenario::parse(SCENARIO, "built-in:loss-fairness")?;
    watch_signals();
    let work = TempDir::create()?;
    write_objects(&work.path.join("www"), &[DOWNLOAD, super::WARM_UP_SIZE])?;
    super::window_safety::write_big_object(&work.path.join("www"))?;
    let mut report = LossFairnessReport {
        date: utc_now_iso8601(),
        commit: git_commit(),
        kernel: kernel_release(),
        load_average_start: load_average(),
        load_average_end: String::new(),
        reps,
        cases: Vec::new(),
    };
    for (i, chain) in scenario.chains.iter().enumerate() {
        let mut case = CaseResult {
            case: chain.name.clone(),
            configs: Vec::new(),
        };
        for config in [Config::Default, Config::SplitEsPool] {
            case.configs
                .push(run_config(config, &scenario, i, reps, &work.path)?);
        }
        report.cases.push(case);
    }
    report.load_average_end = load_average();
    print!("{}", render(&report));
    write_json(json, &report)?;
    Ok(report)
}

fn render(report: &LossFairnessReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "loss-fairness {} ({}, kernel {}, load {} -> {})",
        report.date,
        report.commit,
        report.kernel,
        report.load_average_start,
        report.load_average_end,
    );
    let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    for case in &report.cases {
        let _ = writeln!(out, "{}", case.case);
        for c in &case.configs {
            let shares: Vec<f64> = c.fairness.iter().map(|r| r.relay_share).collect();
            // What the end-to-end flow kept of its rate alone.
            let kept: Vec<f64> = c
                .fairness
                .iter()
                .filter(|r| r.e2e_alone_mbit > 0.0)
                .map(|r| r.e2e_mbit / r.e2e_alone_mbit)
                .collect();
            let column = |pick: fn(&FairnessRep) -> f64| {
                f(median(&c.fairness.iter().map(pick).collect::<Vec<_>>()), 1)
            };
            let _ = writeln!(
                out,
                "  {:<14} relay share median {} (reps {:?}); relay {} / e2e {} Mbit/s (e2e alone {}; kept {}); rc verdicts {:?}",
                c.config,
                f(median(&shares), 3),
                shares.iter().map(|s| format!("{s:.3}")).collect::<Vec<_>>(),
                column(|r| r.relay_mbit),
                column(|r| r.e2e_mbit),
                column(|r| r.e2e_alone_mbit),
                f(median(&kept), 2),
                c.loss_isolation,
            );
            if let Some(e) = &c.error {
                let _ = writeln!(out, "  {:<14} FAILED: {e}", "");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_scenario_parses() {
        let s = Scenario::parse(SCENARIO, "built-in:loss-fairness").expect("parses");
        assert_eq!(s.chains.len(), 2);
        assert_eq!(s.chains[0].spec.links[0].rate_mbit, Some(20.0));
        assert_eq!(s.chains[1].spec.links[0].loss_one_way, Some((0.0, 0.01)));
    }
}
