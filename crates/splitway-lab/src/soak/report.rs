//! The soak's printed report.

use super::spec::*;

pub(super) fn print_report(r: &SoakReport, args: &SoakArgs) {
    let mib = |b: u64| b as f64 / 1048576.0;
    println!("\nsoak results");
    println!(
        "  connections: {} per round × {} rounds, {} made, {} open at once at peak; longest ramp {:.1} s",
        r.connections_requested, args.rounds, r.connections_made, r.peak_concurrent, r.ramp_s
    );
    println!(
        "  duration {:.0} s (asked {:?}), pause {} ms mean, sizes up to {} B, {} bulk slots",
        r.duration_s, args.duration, args.pause_ms, args.max_size, args.bulk_slots
    );
    println!(
        "  exchanges {}, bytes checked {} ({:.2} GB), errors {}",
        r.exchanges,
        r.bytes_checked,
        r.bytes_checked as f64 / 1e9,
        r.errors
    );
    for e in &r.first_errors {
        println!("    error: {e}");
    }
    println!("  relay  fds base/peak/after      RSS MiB base/peak/after   peak connections_open");
    // Descriptors and RSS at baseline, peak and after the run.
    let row = |name: &str, at: [&Resources; 3], tail: String| {
        let [base, peak, after] = at;
        println!(
            "  {name:<5}  {:>6} / {:>6} / {:>6}   {:>7.1} / {:>7.1} / {:>7.1}   {tail}",
            base.fds,
            peak.fds,
            after.fds,
            mib(base.rss_bytes),
            mib(peak.rss_bytes),
            mib(after.rss_bytes),
        );
    };
    for f in &r.relays {
        let tail = f.peak_connections_open.to_string();
        row(&f.name, [&f.baseline, &f.peak, &f.after], tail);
    }
    for h in &r.hosts {
        let tail = format!(
            "(host, {} processes; peak = largest simultaneous sum)",
            h.processes
        );
        row(&h.name, [&h.baseline, &h.peak, &h.after], tail);
    }
    for f in &r.relays {
        let rounds: Vec<String> = f
            .after_rounds
            .iter()
            .map(|a| format!("{} fds {:.1} MiB", a.fds, mib(a.rss_bytes)))
            .collect();
        println!("  {} after each round: {}", f.name, rounds.join(", "));
    }
    let m = &r.tcp_memory;
    println!(
        "  host TCP memory (pages): before {}, peak {} ({:.0} % of the pressure threshold {}; {} sockets allocated then)",
        m.baseline_pages,
        m.peak_pages,
        if m.tcp_mem[1] > 0 {
            100.0 * m.peak_pages as f64 / m.tcp_mem[1] as f64
        } else {
            0.0
        },
        m.tcp_mem[1],
        m.sockets_at_peak
    );
    for c in &r.namespaces {
        println!(
            "  {:<6} TCPMemoryPressures {}, TCPRcvQDrop {}, PruneCalled {}, TCPAbortOnMemory {}",
            c.namespace, c.memory_pressures, c.rcvq_drops, c.prune_called, c.abort_on_memory
        );
    }
    println!(
        "  load average: {} at start, {} at end",
        r.loadavg_start, r.loadavg_end
    );
    for n in &r.notes {
        println!("  note: {n}");
    }
    if r.failures.is_empty() {
        println!("  PASS");
    } else {
        for f in &r.failures {
            println!("  FAIL: {f}");
        }
    }
}
