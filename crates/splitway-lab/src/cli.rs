//! The `splitway lab` command line.
//!
//! - `splitway lab [--quick]`: the default scenario (paper-ktcp)
//! - `splitway lab scenario NAME|FILE [--quick] [--reps N] [--configs a,b] [--json FILE]`
//! - `splitway lab run --rtt 40,120,20 [--loss ..] [--rate ..] [--sizes 10KB,1MB] ...`
//! - `splitway lab fidelity`: the emulator measured against its configuration
//! - `splitway lab list`: the scenarios
//! - `splitway lab window-safety [--reps N] [--json FILE]`: learned windows vs a competing flow and a capacity drop
//! - `splitway lab loss-fairness [--reps N] [--json FILE]`: loss isolation on a shared, lossy client last mile
//! - `splitway lab soak [--connections N] [--duration 10m]`: long concurrent load, resources checked
//!
//! `--model-only` prints the model's predictions without running anything
//! (no root needed). Measuring needs root.

use std::path::PathBuf;

use crate::fidelity::{FidelityOptions, FidelityReport, print_fidelity, run_fidelity};
use crate::model::Config;
use crate::report::LabReport;
use crate::runner::{self, RunOptions};
use crate::scenario::{self, DEFAULT_SCENARIO, EMBEDDED, SCENARIO_DIR, Scenario};

pub use crate::runner::LabError;

/// Default directory of charts (created if missing).
pub const RESULTS_DIR: &str = "lab-results";

/// `splitway lab`: an emulated WAN that measures every relay configuration
/// against the model.
#[derive(Debug, clap::Args)]
#[command(
    about = "Emulated WAN lab: measure relay configurations against the model",
    long_about = "Builds a chain of network namespaces (client, relays, server) joined by \
emulated WAN links, runs nginx, curl, HAProxy, ssh -L and splitway through each configuration, \
and compares median TTFB and download time with the model. Without a subcommand it runs the \
default scenario (paper-ktcp). Needs root, except with --model-only."
)]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: Option<LabCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Run a scenario: a built-in name, a name under ./lab/scenarios, or a file.
    Scenario {
        /// Scenario name (see `splitway lab list`) or TOML file.
        name: String,
        #[command(flatten)]
        run: RunArgs,
    },
    /// What-if: a chain client, r1, …, server built from per-link RTTs.
    Run {
        /// Link RTTs in ms, client side first (e.g. 40,120,20).
        #[arg(long, value_delimiter = ',', required = true)]
        rtt: Vec<f64>,
        /// Per-link loss fractions (e.g. 0,0,0.05).
        #[arg(long, value_delimiter = ',')]
        loss: Option<Vec<f64>>,
        /// Per-link rate caps in Mbit/s, 0 = uncapped (e.g. 100,0,0).
        #[arg(long, value_delimiter = ',')]
        rate: Option<Vec<f64>>,
        /// Object sizes (e.g. 10KB,1MB).
        #[arg(long, value_delimiter = ',', value_parser = scenario::parse_size,
              default_value = "10KB,1MB")]
        sizes: Vec<u64>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Measure the emulator itself against its configured links.
    Fidelity {
        /// Shorter phases (about 20 s).
        #[arg(long)]
        quick: bool,
        /// Write the fidelity report as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The emulator's release quantum in µs (default 250; 0: a wake-up
        /// at each packet's time).
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..=10_000))]
        emulator_quantum_us: Option<u64>,
    },
    /// Learned relay-leg windows against a competing CUBIC flow and a
    /// capacity drop, beside the kernel's default (`make lab-window-safety`).
    WindowSafety {
        /// Repetitions of each phase per configuration.
        #[arg(long, default_value_t = 3)]
        reps: u32,
        /// Write the results as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Loss isolation on a client last mile shared with a CUBIC flow, with
    /// and without random loss, beside the kernel's default
    /// (`make lab-loss-fairness`).
    LossFairness {
        /// Repetitions per case and configuration.
        #[arg(long, default_value_t = 3)]
        reps: u32,
        /// Write the results as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// List the scenarios.
    List,
    /// Benchmark: splitway vs direct TCP, HAProxy and socat on loopback (`make bench`).
    Bench(crate::bench::BenchArgs),
    /// The bench's backends and load generators on any address, for the
    /// namespace benches in scripts/ (`make bench-growth`).
    #[command(subcommand)]
    Load(crate::bench::loadgen::LoadCommand),
    /// Soak: N concurrent split connections through a relay pair for a long
    /// time, every byte checked, relay descriptors and memory before/after (`make soak`).
    Soak(crate::soak::SoakArgs),
}

/// Options shared by everything that runs a scenario.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// Few repetitions (the scenario's quick_reps).
    #[arg(long)]
    pub quick: bool,
    /// Repetitions per configuration and size.
    #[arg(long)]
    pub reps: Option<u32>,
    /// Configurations to run (e2e, haproxy, ssh, default, split, split+es,
    /// split+es+pool, full, full+tfo, socks5, agent).
    #[arg(long, value_delimiter = ',')]
    pub configs: Option<Vec<Config>>,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Only print the model's predictions; run nothing.
    #[arg(long)]
    pub model_only: bool,
    /// Directory for the SVG charts.
    #[arg(long, default_value = RESULTS_DIR)]
    pub out_dir: PathBuf,
    /// splitway's congestion control on every leg of every chain (reno,
    /// cubic, bbr, or a shipped BPF one: splitway_cubic, splitway_resume), replacing the
    /// scenario's `relay_congestion` and the lab's default.
    #[arg(long)]
    pub relay_congestion: Option<crate::model::Congestion>,
    /// Seed of the emulator's loss PRNGs (random if not given): the same
    /// seed gives two runs the same loss decisions, so they can be compared
    /// pairwise. Recorded in the JSON as `loss_seed`.
    #[arg(long)]
    pub loss_seed: Option<u64>,
    /// The address families to run each chain over: v4, v6, both (IPv4
    /// then IPv6, side by side in one report), v4-over-v6 or v6-over-v4
    /// (the client and server in one family, relay-to-relay legs in the
    /// other), or all four. Default: the scenario's `families`, else v4.
    #[arg(long, value_enum)]
    pub family: Option<FamilyChoice>,
    /// The emulator's release quantum in µs (default 250): packets coming
    /// due within it of the last release share one wake-up. 0 wakes at each
    /// packet's time, for comparison. Recorded in each link's
    /// `release_quantum_us` in the JSON.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub emulator_quantum_us: Option<u64>,
}

/// `--family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FamilyChoice {
    V4,
    V6,
    Both,
    #[value(name = "v4-over-v6")]
    V4OverV6,
    #[value(name = "v6-over-v4")]
    V6OverV4,
    All,
}

impl FamilyChoice {
    /// The families to run; empty: the scenario's.
    fn families(choice: Option<FamilyChoice>) -> Vec<runner::Families> {
        use runner::Families;
        match choice {
            None => Vec::new(),
            Some(FamilyChoice::V4) => vec![Families::V4],
            Some(FamilyChoice::V6) => vec![Families::V6],
            Some(FamilyChoice::Both) => vec![Families::V4, Families::V6],
            Some(FamilyChoice::V4OverV6) => vec![Families::V4_OVER_V6],
            Some(FamilyChoice::V6OverV4) => vec![Families::V6_OVER_V4],
            Some(FamilyChoice::All) => Families::ALL.to_vec(),
        }
    }
}

impl RunArgs {
    /// Options given before the subcommand fill in those not given after it.
    fn merged(self, outer: &RunArgs) -> RunArgs {
        RunArgs {
            quick: self.quick || outer.quick,
            reps: self.reps.or(outer.reps),
            configs: self.configs.or_else(|| outer.configs.clone()),
            json: self.json.or_else(|| outer.json.clone()),
            model_only: self.model_only || outer.model_only,
            relay_congestion: self.relay_congestion.or(outer.relay_congestion),
            loss_seed: self.loss_seed.or(outer.loss_seed),
            family: self.family.or(outer.family),
            emulator_quantum_us: self.emulator_quantum_us.or(outer.emulator_quantum_us),
            out_dir: if self.out_dir.as_os_str() == RESULTS_DIR {
                outer.out_dir.clone()
            } else {
                self.out_dir
            },
        }
    }
}

/// Runs `splitway lab`.
pub fn run(args: LabArgs) -> Result<(), LabError> {
    match args.command {
        None => {
            let scenario = Scenario::load(DEFAULT_SCENARIO)?;
            execute(&scenario, &args.run)
        }
        Some(LabCommand::Scenario { name, run }) => {
            let scenario = Scenario::load(&name)?;
            execute(&scenario, &run.merged(&args.run))
        }
        Some(LabCommand::Run {
            rtt,
            loss,
            rate,
            sizes,
            run,
        }) => {
            let run = run.merged(&args.run);
            let configs = run.configs.clone().unwrap_or_else(|| {
                vec![
                    Config::E2e,
                    Config::Haproxy,
                    Config::Ssh,
                    Config::Default,
                    Config::Split,
                    Config::Socks5,
                    Config::Agent,
                ]
            });
            let scenario =
                Scenario::what_if(&rtt, loss.as_deref(), rate.as_deref(), &sizes, &configs)?;
            execute(&scenario, &run)
        }
        Some(LabCommand::Fidelity {
            quick,
            json,
            emulator_quantum_us,
        }) => fidelity(quick, json, emulator_quantum_us),
        Some(LabCommand::Bench(bench)) => crate::bench::run(bench),
        Some(LabCommand::Load(load)) => Ok(crate::bench::loadgen::run(load)?),
        Some(LabCommand::Soak(soak)) => crate::soak::run(soak),
        Some(LabCommand::WindowSafety { reps, json }) => {
            runner::window_safety::run(reps.max(1), json.as_deref()).map(drop)
        }
        Some(LabCommand::LossFairness { reps, json }) => {
            runner::loss_fairness::run(reps.max(1), json.as_deref()).map(drop)
        }
        Some(LabCommand::List) => {
            print!("{}", list());
            Ok(())
        }
    }
}

/// `lab fidelity --json`: a raw file for the README, saying when, on what
/// and how loaded the report was measured.
#[derive(serde::Serialize)]
struct FidelityFile<'a> {
    date: String,
    commit: String,
    kernel: String,
    load_average_start: String,
    load_average_end: String,
    quick: bool,
    report: &'a FidelityReport,
}

fn fidelity(
    quick: bool,
    json: Option<PathBuf>,
    emulator_quantum_us: Option<u64>,
) -> Result<(), LabError> {
    if !runner::is_root() {
        return Err(LabError::NotRoot);
    }
    let mut options = FidelityOptions::default();
    if let Some(us) = emulator_quantum_us {
        options.release_quantum_ns = us * 1000;
    }
    if quick {
        options.probe_time = std::time::Duration::from_secs(1);
        options.loss_packets = 20_000;
        options.rate_window = std::time::Duration::from_secs(2);
    }
    let date = crate::report::utc_now_iso8601();
    let load_start = crate::report::load_average();
    let report = run_fidelity(options)?;
    print_fidelity(&report);
    if let Some(path) = json {
        let raw = FidelityFile {
            date,
            commit: crate::report::git_commit(),
            kernel: crate::report::kernel_release(),
            load_average_start: load_start,
            load_average_end: crate::report::load_average(),
            quick,
            report: &report,
        };
        let text = serde_json::to_string_pretty(&raw).expect("fidelity report serialises");
        std::fs::write(&path, text).map_err(|source| LabError::Io {
            op: format!("write {}", path.display()),
            source,
        })?;
        println!("JSON: {}", path.display());
    }
    let missed = report.misses().count();
    if missed > 0 {
        return Err(LabError::Fidelity(missed));
    }
    Ok(())
}

fn list() -> String {
    let mut out = String::from("built-in scenarios:\n");
    for (name, text) in EMBEDDED {
        let description = Scenario::parse(text, name)
            .map(|s| s.description)
            .unwrap_or_else(|e| format!("(invalid: {e})"));
        let shadowed = std::path::Path::new(SCENARIO_DIR)
            .join(format!("{name}.toml"))
            .is_file();
        out.push_str(&format!(
            "  {name:<18} {description}{}\n",
            if shadowed {
                format!(" [./{SCENARIO_DIR}/{name}.toml overrides]")
            } else {
                String::new()
            }
        ));
    }
    if let Ok(entries) = std::fs::read_dir(SCENARIO_DIR) {
        let mut extra: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .filter(|stem| !EMBEDDED.iter().any(|(n, _)| n == stem))
            .collect();
        extra.sort();
        if !extra.is_empty() {
            out.push_str(&format!("in ./{SCENARIO_DIR}:\n"));
            for stem in extra {
                out.push_str(&format!("  {stem}\n"));
            }
        }
    }
    out
}

fn execute(scenario: &Scenario, run: &RunArgs) -> Result<(), LabError> {
    if let Some(graph) = &scenario.graph {
        // A path measurement: no configurations, sizes or model; its hosts
        // have IPv4 addresses only.
        if run.model_only
            || run.configs.is_some()
            || run.relay_congestion.is_some()
            || run.family.is_some()
        {
            return Err(LabError::Usage(format!(
                "{}: a graph scenario takes no --model-only, --configs, --relay-congestion \
                 or --family (it runs over IPv4 only)",
                scenario.name
            )));
        }
        return runner::paths::run(scenario, graph, run.loss_seed, run.json.as_deref());
    }
    let overridden;
    let scenario = match run.relay_congestion {
        Some(cc) => {
            let mut s = scenario.clone();
            for chain in &mut s.chains {
                chain.relay_congestion = vec![Some(cc); chain.spec.links.len()];
            }
            overridden = s;
            &overridden
        }
        None => scenario,
    };
    let configs = run
        .configs
        .clone()
        .unwrap_or_else(|| scenario.configs.clone());
    let families = match FamilyChoice::families(run.family) {
        chosen if !chosen.is_empty() => chosen,
        _ => scenario.families.clone(),
    };
    let report = if run.model_only {
        LabReport::model_only(scenario, &configs, &families)
    } else {
        if !runner::is_root() {
            return Err(LabError::NotRoot);
        }
        let options = RunOptions {
            families,
            quick: run.quick,
            reps: run.reps,
            configs: Some(configs),
            progress: true,
            loss_seed: run.loss_seed,
            emulator_quantum_us: run.emulator_quantum_us,
        };
        runner::run_scenario(scenario, &options)?
    };
    println!("{}", report.render_tables());
    if let Some(path) = &run.json {
        std::fs::write(path, report.to_json()).map_err(|source| LabError::Io {
            op: format!("write {}", path.display()),
            source,
        })?;
        println!("JSON: {}", path.display());
    }
    for chart in report.write_charts(&run.out_dir)? {
        println!("chart: {}", chart.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        lab: LabArgs,
    }

    /// The effective RunArgs of a `splitway lab ...` command line.
    fn run_args(argv: &[&str]) -> RunArgs {
        let lab = Cli::try_parse_from(argv).expect("parses").lab;
        match lab.command {
            Some(LabCommand::Scenario { run, .. }) | Some(LabCommand::Run { run, .. }) => {
                run.merged(&lab.run)
            }
            _ => lab.run,
        }
    }

    #[test]
    fn loss_seed_is_taken_before_and_after_the_subcommand() {
        assert_eq!(run_args(&["lab", "scenario", "cc-parity"]).loss_seed, None);
        let after = run_args(&["lab", "scenario", "cc-parity", "--loss-seed", "7"]);
        assert_eq!(after.loss_seed, Some(7));
        let before = run_args(&["lab", "--loss-seed", "3", "run", "--rtt", "10,20"]);
        assert_eq!(before.loss_seed, Some(3));
        let both = run_args(&[
            "lab",
            "--loss-seed",
            "3",
            "scenario",
            "x",
            "--loss-seed",
            "5",
        ]);
        assert_eq!(both.loss_seed, Some(5), "the subcommand's value wins");
        assert!(Cli::try_parse_from(["lab", "--loss-seed", "-1"]).is_err());
    }

    #[test]
    fn the_report_records_the_loss_seed() {
        let scenario = Scenario::load(DEFAULT_SCENARIO).expect("default scenario");
        let mut report = LabReport::new(&scenario, true, true, 1);
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).expect("report JSON");
        assert_eq!(json["loss_seed"], serde_json::Value::Null);
        report.loss_seed = Some(u64::MAX);
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).expect("report JSON");
        assert_eq!(json["loss_seed"].as_u64(), Some(u64::MAX));
    }
}
