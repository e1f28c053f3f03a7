//! Runs the emulator fidelity check and prints the table (needs root):
//! `cargo run --release -p splitway-lab --example fidelity [--json] [--quick] [--normal-probes] [--normal-emulator] [--skip-rtt|--skip-loss|--skip-rate]`

use std::time::Duration;

use splitway_lab::fidelity::{FidelityOptions, print_fidelity, run_fidelity};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = FidelityOptions::default();
    if args.iter().any(|a| a == "--quick") {
        opts.probe_time = Duration::from_secs(1);
        opts.loss_packets = 20_000;
        opts.rate_window = Duration::from_secs(2);
    }
    if args.iter().any(|a| a == "--skip-rtt") {
        opts.rtts.clear();
    }
    if args.iter().any(|a| a == "--skip-loss") {
        opts.losses.clear();
    }
    if args.iter().any(|a| a == "--skip-rate") {
        opts.rates_mbit.clear();
    }
    if args.iter().any(|a| a == "--normal-emulator") {
        opts.realtime_emulator = false;
    }
    if args.iter().any(|a| a == "--normal-probes") {
        opts.realtime_probes = false;
    }
    match run_fidelity(opts) {
        Ok(report) => {
            print_fidelity(&report);
            if args.iter().any(|a| a == "--json") {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("report serialises")
                );
            }
            if !report.all_pass() {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("fidelity run failed: {e}");
            std::process::exit(2);
        }
    }
}
