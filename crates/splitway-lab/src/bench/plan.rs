//! What one bench run does: options, durations, counts.

use std::path::PathBuf;
use std::time::Duration;

use super::procs::Method;

/// Where results go (created if missing).
pub const RESULTS_DIR: &str = "bench-results";
/// Connections held open for the idle-memory measurement.
pub const IDLE_CONNECTIONS: usize = 10_000;
/// The fixed new-connection rate whose setup latency is reported.
pub const FIXED_RATE: f64 = 1_000.0;

/// `splitway lab bench` options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Rounds; every round runs every method once per test, in rotated order.
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Short run (2 rounds, 1 s per test): under about 2 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Also measure both splitway methods with one accept socket per
    /// listener (`accept_sockets = 1`), side by side with the default of one
    /// per worker thread.
    #[arg(long)]
    pub accept_compare: bool,
    /// Only the footprint of fresh instances (exec → listening, idle RSS,
    /// bytes per active and per idle connection): about 10 s per round.
    #[arg(long)]
    pub footprint: bool,
    /// Also write the JSON report here (it is always written under bench-results/).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Durations and counts of one run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub rounds: u32,
    pub test_time: Duration,
    pub fixed_time: Duration,
    pub conn_threads: usize,
    pub idle_connections: usize,
    pub accept_compare: bool,
    pub footprint_only: bool,
}

impl Plan {
    pub(super) fn new(args: &BenchArgs) -> Plan {
        let quick = args.quick;
        Plan {
            rounds: args.rounds.unwrap_or(if quick { 2 } else { 5 }).max(1),
            test_time: Duration::from_millis(if quick { 1000 } else { 2000 }),
            fixed_time: Duration::from_millis(if quick { 1000 } else { 3000 }),
            conn_threads: 4,
            idle_connections: IDLE_CONNECTIONS,
            accept_compare: args.accept_compare,
            footprint_only: args.footprint,
        }
    }

    /// The methods this run measures, in table order.
    pub fn methods(&self) -> Vec<Method> {
        Method::EVERY
            .into_iter()
            .filter(|m| Method::ALL.contains(m) || self.accept_compare)
            .collect()
    }
}
