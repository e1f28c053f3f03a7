//! Whether a row's figures can be trusted: could the emulator have moved
//! them, and did the model's premises hold? (Derivation: `docs/lab.md`.)
//!
//! - **SUSPECT** is a statement about the reported figure. A packet the
//!   emulator releases `L` late looks, to TCP, exactly like a packet that
//!   crossed a link whose one-way delay is `L` longer. So the model is run
//!   again with every link direction's one-way delay lengthened by that
//!   direction's measured release-lateness p99: the difference to the
//!   model's figure is how far lateness could have moved the figure if
//!   every packet on the download's critical path had been that late. The
//!   row is SUSPECT when that shift exceeds the figure's tolerance
//!   (`max(1 %, 1 ms)` of the model's figure), or when the emulator lost
//!   packets no link configuration drops (no packet buffer, TUN write or
//!   read failure, TUN `tx_dropped`).
//! - **PREMISE** says the model did not apply: a drop-tail queue
//!   overflowed, which the model assumes never happens (it has no loss
//!   other than a link's configured random loss).

use serde::Serialize;

use crate::emu::EmuStats;
use crate::model::{self, Config, LinkModel, ModelParams};

/// A figure's tolerance: this fraction of the model's figure …
pub const TOLERANCE_FRACTION: f64 = 0.01;
/// … but never below this (curl's and the end hosts' own scheduling noise).
pub const TOLERANCE_FLOOR_MS: f64 = 1.0;

/// One emulated link as the verdict needs it, per direction
/// (client→server, server→client).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkLateness {
    /// Release-lateness p99 in µs (0 when nothing crossed).
    pub p99_us: (f64, f64),
    /// The same beyond the release quantum's hold (the thread's own).
    pub unplanned_p99_us: (f64, f64),
    /// Drop-tail overflows of the rate cap's queue.
    pub queue_drops: (u64, u64),
    /// Drops no link configuration makes: emulator faults.
    pub fault_drops: u64,
}

impl LinkLateness {
    /// From the emulator's counters of one batch.
    pub fn from_stats(stats: &EmuStats) -> Vec<LinkLateness> {
        stats
            .links
            .iter()
            .map(|l| {
                let p99 = |s: &crate::emu::LatenessSummary| {
                    if s.count > 0 { s.p99_us } else { 0.0 }
                };
                let faults = |d: &crate::emu::DirectionStats| {
                    d.dropped_no_buffer + d.write_failures + d.read_errors
                };
                let tun: u64 = [&l.tun_left, &l.tun_right]
                    .iter()
                    .map(|t| t.tx_dropped.unwrap_or(0))
                    .sum();
                LinkLateness {
                    p99_us: (p99(&l.forward.lateness), p99(&l.reverse.lateness)),
                    unplanned_p99_us: (
                        p99(&l.forward.unplanned_lateness),
                        p99(&l.reverse.unplanned_lateness),
                    ),
                    queue_drops: (l.forward.dropped_queue, l.reverse.dropped_queue),
                    fault_drops: faults(&l.forward) + faults(&l.reverse) + tun,
                }
            })
            .collect()
    }
}

/// How far the emulator's lateness could have moved a row's figures, and
/// what the row may move by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EmulatorShift {
    /// Model with every crossing delayed by its direction's p99, minus the
    /// model, for the TTFB and the download time.
    pub ttfb_ms: f64,
    pub total_ms: f64,
    pub ttfb_tolerance_ms: f64,
    pub total_tolerance_ms: f64,
}

/// The verdict on one row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    pub shift: EmulatorShift,
    /// Empty: the emulator could not have moved the figures beyond tolerance.
    pub suspect: Vec<String>,
    /// Empty: the model's premises held.
    pub premise: Vec<String>,
}

/// The tolerance of a figure whose model value is `model_ms`.
pub fn tolerance_ms(model_ms: f64) -> f64 {
    (model_ms * TOLERANCE_FRACTION).max(TOLERANCE_FLOOR_MS)
}

/// Judges one (configuration, size) measured over `links` (the model's
/// view of the chain) with the emulator's `observed` counters, link by link
/// in the same order.
pub fn judge(
    links: &[LinkModel],
    params: &ModelParams,
    config: Config,
    size: u64,
    observed: &[LinkLateness],
) -> Verdict {
    let base = model::predict(links, config, size, params);
    let delayed = |p99: fn(&LinkLateness) -> (f64, f64)| -> Vec<LinkModel> {
        links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let (to_server, to_client) = p99(&observed.get(i).copied().unwrap_or_default());
                LinkModel {
                    forward_s: l.forward_s + to_server / 1e6,
                    backward_s: l.backward_s + to_client / 1e6,
                    ..*l
                }
            })
            .collect()
    };
    let moved = model::predict(&delayed(|o| o.p99_us), config, size, params);
    // The release quantum holds only packets that come due within it of a
    // link's last releases, when those came close together: a stream's. The
    // packets a TTFB waits for cross each link at least a one-way delay
    // apart, so on links that carry only the timed download (a scenario's
    // rows) only the thread's own lateness can move it.
    let moved_ttfb = model::predict(&delayed(|o| o.unplanned_p99_us), config, size, params);
    let shift = EmulatorShift {
        ttfb_ms: round3((moved_ttfb.ttfb_ms - base.ttfb_ms).max(0.0)),
        total_ms: round3((moved.total_ms - base.total_ms).max(0.0)),
        ttfb_tolerance_ms: round3(tolerance_ms(base.ttfb_ms)),
        total_tolerance_ms: round3(tolerance_ms(base.total_ms)),
    };
    let mut v = Verdict {
        shift,
        ..Verdict::default()
    };
    for (what, moved, tolerance) in [
        ("TTFB", shift.ttfb_ms, shift.ttfb_tolerance_ms),
        ("download time", shift.total_ms, shift.total_tolerance_ms),
    ] {
        if moved > tolerance {
            v.suspect.push(format!(
                "emulator lateness could move the {what} by {moved:.1} ms, \
                 above its tolerance of {tolerance:.1} ms ({})",
                worst_link(observed)
            ));
        }
    }
    for (i, o) in observed.iter().enumerate() {
        if o.fault_drops > 0 {
            v.suspect.push(format!(
                "link {i}: the emulator lost {} packets no link drops \
                 (buffers, TUN errors or tx_dropped)",
                o.fault_drops
            ));
        }
        let (to_server, to_client) = o.queue_drops;
        if to_server + to_client > 0 {
            v.premise.push(format!(
                "link {i}: its queue overflowed ({to_client} packets toward the client, \
                 {to_server} toward the server); the model assumes no overflow"
            ));
        }
    }
    v
}

fn worst_link(observed: &[LinkLateness]) -> String {
    let worst = observed
        .iter()
        .enumerate()
        .flat_map(|(i, o)| [(i, "to server", o.p99_us.0), (i, "to client", o.p99_us.1)])
        .max_by(|a, b| a.2.total_cmp(&b.2));
    match worst {
        Some((i, dir, p99)) => format!("worst: link {i} {dir}, lateness p99 {p99:.0} µs"),
        None => "no links".into(),
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ktcp() -> (Vec<LinkModel>, ModelParams) {
        let s = crate::scenario::Scenario::load("paper-ktcp").expect("built in");
        (s.chains[0].model_links(), s.chains[0].model)
    }

    fn uniform(p99_us: f64) -> Vec<LinkLateness> {
        vec![
            LinkLateness {
                p99_us: (p99_us, p99_us),
                unplanned_p99_us: (p99_us, p99_us),
                ..LinkLateness::default()
            };
            3
        ]
    }

    #[test]
    fn punctual_emulator_moves_nothing() {
        let (links, params) = ktcp();
        for config in Config::ALL {
            let v = judge(&links, &params, config, 10_000_000, &uniform(0.0));
            assert_eq!(v.shift.ttfb_ms, 0.0, "{config}");
            assert_eq!(v.shift.total_ms, 0.0, "{config}");
            assert!(v.suspect.is_empty() && v.premise.is_empty(), "{v:?}");
        }
    }

    #[test]
    fn e2e_ttfb_moves_by_lateness_per_crossing() {
        // e2e TTFB: SYN, SYN-ACK, request and first byte each cross all
        // three links: 12 crossings.
        let (links, params) = ktcp();
        let v = judge(&links, &params, Config::E2e, 10_000, &uniform(100.0));
        assert!((v.shift.ttfb_ms - 1.2).abs() < 0.01, "{v:?}");
        assert!(v.suspect.is_empty(), "1.2 ms within 1 % of 548 ms: {v:?}");
        let v = judge(&links, &params, Config::E2e, 10_000, &uniform(1000.0));
        assert!((v.shift.ttfb_ms - 12.0).abs() < 0.01, "{v:?}");
        assert!(
            v.suspect.iter().any(|r| r.contains("TTFB")),
            "12 ms beyond 5.5 ms: {v:?}"
        );
    }

    #[test]
    fn the_quantums_hold_moves_the_download_time_not_the_ttfb() {
        let (links, params) = ktcp();
        let mut observed = uniform(100.0);
        for o in &mut observed {
            o.p99_us = (1000.0, 1000.0);
        }
        let v = judge(&links, &params, Config::E2e, 10_000, &observed);
        assert!((v.shift.ttfb_ms - 1.2).abs() < 0.01, "{v:?}");
        assert!(v.shift.total_ms > 11.0, "the held packets count: {v:?}");
    }

    #[test]
    fn lateness_on_a_leg_off_the_critical_path_moves_little() {
        // `full`: Turbo-Start sends a 10 MB download over the 215 ms leg in
        // one window; the access link's 100 Mbit/s cap sets the pace, so a
        // late release on the server leg moves the download time by about
        // its handshake crossings only.
        let (links, params) = ktcp();
        let mut observed = uniform(0.0);
        observed[2].p99_us = (2000.0, 2000.0);
        let v = judge(&links, &params, Config::Full, 10_000_000, &observed);
        assert!(v.shift.total_ms < v.shift.total_tolerance_ms, "{v:?}");
    }

    #[test]
    fn quiet_host_lateness_flags_no_paper_ktcp_cell() {
        // lab-facts.md: release lateness p99 of 40-100 µs on a quiet host.
        let s = crate::scenario::Scenario::load("paper-ktcp").expect("built in");
        let (links, params) = (s.chains[0].model_links(), s.chains[0].model);
        for config in Config::ALL {
            for &size in &s.sizes {
                let v = judge(&links, &params, config, size, &uniform(100.0));
                assert!(v.suspect.is_empty(), "{config} {size}: {v:?}");
            }
        }
    }

    #[test]
    fn drops_are_premise_or_suspect() {
        let (links, params) = ktcp();
        let mut observed = uniform(0.0);
        observed[0].queue_drops = (0, 17);
        let v = judge(&links, &params, Config::E2e, 10_000_000, &observed);
        assert!(v.suspect.is_empty(), "{v:?}");
        assert_eq!(v.premise.len(), 1);
        assert!(v.premise[0].contains("17 packets toward the client"));
        observed[0].queue_drops = (0, 0);
        observed[1].fault_drops = 3;
        let v = judge(&links, &params, Config::E2e, 10_000_000, &observed);
        assert!(v.premise.is_empty());
        assert!(v.suspect[0].contains("lost 3 packets"), "{v:?}");
    }
}
