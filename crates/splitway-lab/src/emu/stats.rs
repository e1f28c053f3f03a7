//! Counters and the release-lateness histogram of the emulator, shared
//! lock-free between a link's thread and whoever reads the stats, and the
//! serialisable snapshot (`EmuStats`) that says whether a run is suspect.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Unplanned lateness p99 (beyond the release quantum's hold) above this
/// makes a run suspect (lab-facts: 0.5 ms).
pub const SUSPECT_LATENESS_P99_US: f64 = 500.0;

/// Buckets: 1 µs wide below 128 µs, then 64 per power of two (≤ 1.6 %
/// relative error) up to 2^40 µs.
const LINEAR: u64 = 128;
const SUB_BITS: u32 = 6;
const BUCKETS: usize = LINEAR as usize + (40 - 7) * (1 << SUB_BITS);

fn bucket_of(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros(); // ≥ 7
    let mantissa = (us >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    let idx = LINEAR as usize + (exp as usize - 7) * (1 << SUB_BITS) + mantissa as usize;
    idx.min(BUCKETS - 1)
}

/// Upper bound (exclusive) in µs of a bucket, so reported quantiles are
/// never optimistic.
fn bucket_upper_us(idx: usize) -> u64 {
    if idx < LINEAR as usize {
        return idx as u64 + 1;
    }
    let rel = idx - LINEAR as usize;
    let exp = (rel >> SUB_BITS) as u32 + 7;
    let mantissa = (rel & ((1 << SUB_BITS) - 1)) as u64;
    let width = 1u64 << (exp - SUB_BITS);
    (1u64 << exp) + (mantissa + 1) * width
}

/// Lock-free histogram of microsecond values.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Histogram({:?})", self.summary())
    }
}

impl Histogram {
    pub fn record_ns(&self, ns: u64) {
        self.buckets[bucket_of(ns / 1000)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
        self.sum_ns.store(0, Ordering::Relaxed);
        self.max_ns.store(0, Ordering::Relaxed);
    }

    pub fn summary(&self) -> LatenessSummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let max_us = self.max_ns.load(Ordering::Relaxed) as f64 / 1000.0;
        let quantile = |q: f64| -> f64 {
            if total == 0 {
                return 0.0;
            }
            let rank = ((q * total as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return (bucket_upper_us(i) as f64).min(max_us);
                }
            }
            max_us
        };
        let count = self.count.load(Ordering::Relaxed);
        LatenessSummary {
            count: total,
            mean_us: if count == 0 {
                0.0
            } else {
                self.sum_ns.load(Ordering::Relaxed) as f64 / count as f64 / 1000.0
            },
            p50_us: quantile(0.50),
            p99_us: quantile(0.99),
            max_us,
        }
    }
}

/// Release lateness: actual release time minus scheduled release time.
/// Quantiles are bucket upper bounds (1 µs resolution below 128 µs).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatenessSummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Live counters of one direction of one link.
#[derive(Debug, Default)]
pub struct DirectionCounters {
    pub packets_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub forwarded_packets: AtomicU64,
    pub forwarded_bytes: AtomicU64,
    pub dropped_loss: AtomicU64,
    pub dropped_queue: AtomicU64,
    pub dropped_no_buffer: AtomicU64,
    pub write_failures: AtomicU64,
    pub read_errors: AtomicU64,
    pub max_queue_packets: AtomicU64,
    pub lateness: Histogram,
    /// Lateness beyond the release quantum's planned hold: the thread's own.
    pub unplanned_lateness: Histogram,
}

impl DirectionCounters {
    pub fn add(counter: &AtomicU64, v: u64) {
        counter.fetch_add(v, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        for c in [
            &self.packets_in,
            &self.bytes_in,
            &self.forwarded_packets,
            &self.forwarded_bytes,
            &self.dropped_loss,
            &self.dropped_queue,
            &self.dropped_no_buffer,
            &self.write_failures,
            &self.read_errors,
            &self.max_queue_packets,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.lateness.reset();
        self.unplanned_lateness.reset();
    }

    pub fn snapshot(&self) -> DirectionStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DirectionStats {
            packets_in: l(&self.packets_in),
            bytes_in: l(&self.bytes_in),
            forwarded_packets: l(&self.forwarded_packets),
            forwarded_bytes: l(&self.forwarded_bytes),
            dropped_loss: l(&self.dropped_loss),
            dropped_queue: l(&self.dropped_queue),
            dropped_no_buffer: l(&self.dropped_no_buffer),
            write_failures: l(&self.write_failures),
            read_errors: l(&self.read_errors),
            max_queue_packets: l(&self.max_queue_packets),
            lateness: self.lateness.summary(),
            unplanned_lateness: self.unplanned_lateness.summary(),
        }
    }
}

/// One direction of one link, as counted by the emulator since the last
/// reset. `forward` is client→server (left→right).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DirectionStats {
    pub packets_in: u64,
    pub bytes_in: u64,
    pub forwarded_packets: u64,
    pub forwarded_bytes: u64,
    /// Random loss (configured).
    pub dropped_loss: u64,
    /// Drop-tail overflow of the rate limiter's queue (configured).
    pub dropped_queue: u64,
    /// No free packet buffer: the emulator itself was the bottleneck.
    pub dropped_no_buffer: u64,
    /// Writing into the egress TUN device failed.
    pub write_failures: u64,
    pub read_errors: u64,
    /// Largest rate-limiter queue seen, in packets (0 without a rate cap).
    pub max_queue_packets: u64,
    /// Release time minus the packet's schedule: what the packet saw.
    pub lateness: LatenessSummary,
    /// Release time minus the later of its schedule and the release
    /// quantum's hold: the thread's own lateness, which lab-facts' 0.5 ms
    /// bound is about. Equal to `lateness` without a quantum.
    pub unplanned_lateness: LatenessSummary,
}

impl DirectionStats {
    pub fn dropped_total(&self) -> u64 {
        self.dropped_loss + self.dropped_queue + self.dropped_no_buffer + self.write_failures
    }
}

/// Kernel counters of one TUN device (since the last reset).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TunCounters {
    pub namespace: String,
    pub device: String,
    /// Packets the kernel could not queue to the emulator (txqueue full).
    /// None when the counter could not be read.
    pub tx_dropped: Option<u64>,
    pub rx_dropped: Option<u64>,
    pub rx_bytes: Option<u64>,
    pub tx_bytes: Option<u64>,
}

/// One emulated link.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LinkStats {
    pub index: usize,
    /// Host on the client side.
    pub left: String,
    /// Host on the server side.
    pub right: String,
    pub rate_capped: bool,
    /// Whether the link's thread runs at SCHED_FIFO.
    pub realtime: bool,
    /// The release quantum, µs: lateness up to it is by design (packets
    /// due close together share a wake-up).
    pub release_quantum_us: f64,
    /// CPU time of the link's thread since the last reset, ms.
    pub cpu_ms: f64,
    /// `cpu_ms` per packet forwarded or dropped (both directions), µs.
    pub cpu_us_per_packet: f64,
    pub forward: DirectionStats,
    pub reverse: DirectionStats,
    pub tun_left: TunCounters,
    pub tun_right: TunCounters,
}

/// Everything the emulator counted in a run. Check `suspect_reasons()`
/// before trusting the run's measurements.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EmuStats {
    pub links: Vec<LinkStats>,
    /// Reasons this run is suspect (empty: clean). Same as `suspect_reasons()`.
    pub suspect: Vec<String>,
}

impl EmuStats {
    pub fn new(links: Vec<LinkStats>) -> EmuStats {
        let mut s = EmuStats {
            links,
            suspect: Vec::new(),
        };
        s.suspect = s.compute_suspect_reasons();
        s
    }

    pub fn is_suspect(&self) -> bool {
        !self.suspect.is_empty()
    }

    pub fn suspect_reasons(&self) -> &[String] {
        &self.suspect
    }

    /// Worst lateness p99 over all links and directions, in µs.
    pub fn worst_lateness_p99_us(&self) -> f64 {
        self.links
            .iter()
            .flat_map(|l| [l.forward.lateness.p99_us, l.reverse.lateness.p99_us])
            .fold(0.0, f64::max)
    }

    fn compute_suspect_reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        for l in &self.links {
            if !l.realtime {
                out.push(format!(
                    "link {} ({}-{}): emulator thread not real-time",
                    l.index, l.left, l.right
                ));
            }
            for (dir, d) in [("forward", &l.forward), ("reverse", &l.reverse)] {
                let at = format!("link {} ({}-{}) {dir}", l.index, l.left, l.right);
                let late = &d.unplanned_lateness;
                if late.count > 0 && late.p99_us > SUSPECT_LATENESS_P99_US {
                    out.push(format!(
                        "{at}: release lateness p99 {:.0} µs > {SUSPECT_LATENESS_P99_US:.0} µs \
                         (beyond the release quantum's hold)",
                        late.p99_us
                    ));
                }
                if d.dropped_queue > 0 && !l.rate_capped {
                    out.push(format!(
                        "{at}: {} queue drops without a rate cap",
                        d.dropped_queue
                    ));
                }
                if d.dropped_no_buffer > 0 {
                    out.push(format!(
                        "{at}: {} drops for lack of packet buffers",
                        d.dropped_no_buffer
                    ));
                }
                if d.write_failures > 0 {
                    out.push(format!("{at}: {} TUN write failures", d.write_failures));
                }
                if d.read_errors > 0 {
                    out.push(format!("{at}: {} TUN read errors", d.read_errors));
                }
            }
            for t in [&l.tun_left, &l.tun_right] {
                match t.tx_dropped {
                    Some(0) => {}
                    Some(n) => out.push(format!(
                        "TUN {} in {}: tx_dropped {n} (kernel queue overflow)",
                        t.device, t.namespace
                    )),
                    None => out.push(format!(
                        "TUN {} in {}: tx_dropped unreadable",
                        t.device, t.namespace
                    )),
                }
            }
        }
        out
    }
}

impl fmt::Display for EmuStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<18} {:>5} {:>10} {:>12} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "link",
            "dir",
            "packets",
            "bytes",
            "loss",
            "queue",
            "other",
            "tun_txdr",
            "late p50",
            "late p99",
            "late max"
        )?;
        for l in &self.links {
            for (dir, d, tun) in [
                ("fwd", &l.forward, &l.tun_left),
                ("rev", &l.reverse, &l.tun_right),
            ] {
                let name = format!("{} {}-{}", l.index, l.left, l.right);
                let tun_drop = tun
                    .tx_dropped
                    .map_or_else(|| "?".to_owned(), |v| v.to_string());
                writeln!(
                    f,
                    "{:<18} {:>5} {:>10} {:>12} {:>8} {:>8} {:>8} {:>8} {:>7.0}µs {:>7.0}µs {:>7.0}µs",
                    name,
                    dir,
                    d.forwarded_packets,
                    d.forwarded_bytes,
                    d.dropped_loss,
                    d.dropped_queue,
                    d.dropped_no_buffer + d.write_failures + d.read_errors,
                    tun_drop,
                    d.lateness.p50_us,
                    d.lateness.p99_us,
                    d.lateness.max_us
                )?;
            }
        }
        for l in &self.links {
            writeln!(
                f,
                "link {} emulator thread: {:.1} ms CPU, {:.2} µs per packet{}",
                l.index,
                l.cpu_ms,
                l.cpu_us_per_packet,
                if l.realtime {
                    ", SCHED_FIFO"
                } else {
                    ", not real-time"
                }
            )?;
        }
        if self.suspect.is_empty() {
            writeln!(f, "emulator: clean run")
        } else {
            writeln!(f, "emulator: SUSPECT run:")?;
            for r in &self.suspect {
                writeln!(f, "  - {r}")?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_values() {
        let mut last = 0;
        for us in (0..5000).chain([65_536, 1_000_000, 123_456_789]) {
            let b = bucket_of(us);
            assert!(b >= last || us == 65_536, "bucket order at {us}");
            last = b;
            assert!(bucket_upper_us(b) > us, "upper bound of {us}");
            // relative error of the bound ≤ 1/64 + 1 µs
            assert!(bucket_upper_us(b) as f64 <= us as f64 * (1.0 + 1.0 / 64.0) + 1.0);
        }
    }

    #[test]
    fn quantiles_of_known_distribution() {
        let h = Histogram::default();
        for us in 1..=1000u64 {
            h.record_ns(us * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((500.0..=510.0).contains(&s.p50_us), "{s:?}");
        assert!((990.0..=1006.0).contains(&s.p99_us), "{s:?}");
        assert_eq!(s.max_us, 1000.0);
        h.reset();
        assert_eq!(h.summary().count, 0);
    }

    #[test]
    fn suspect_flags_unexpected_drops_and_lateness() {
        let clean_tun = TunCounters {
            tx_dropped: Some(0),
            ..Default::default()
        };
        let mut link = LinkStats {
            index: 0,
            left: "client".into(),
            right: "server".into(),
            rate_capped: false,
            realtime: true,
            release_quantum_us: 0.0,
            cpu_ms: 0.0,
            cpu_us_per_packet: 0.0,
            forward: DirectionStats::default(),
            reverse: DirectionStats::default(),
            tun_left: clean_tun.clone(),
            tun_right: clean_tun,
        };
        link.forward.dropped_loss = 10;
        assert!(!EmuStats::new(vec![link.clone()]).is_suspect());
        link.forward.dropped_queue = 1;
        assert!(EmuStats::new(vec![link.clone()]).is_suspect());
        link.rate_capped = true;
        assert!(!EmuStats::new(vec![link.clone()]).is_suspect());
        link.reverse.unplanned_lateness = LatenessSummary {
            count: 10,
            p99_us: 800.0,
            ..Default::default()
        };
        assert!(EmuStats::new(vec![link.clone()]).is_suspect());
        // Late by the release quantum's hold only: by design.
        link.release_quantum_us = 250.0;
        link.reverse.lateness = link.reverse.unplanned_lateness;
        link.reverse.unplanned_lateness.p99_us = 100.0;
        assert!(!EmuStats::new(vec![link.clone()]).is_suspect());
        link.reverse.lateness.p99_us = 100.0;
        link.tun_right.tx_dropped = Some(3);
        let s = EmuStats::new(vec![link]);
        assert_eq!(s.suspect_reasons().len(), 1, "{:?}", s.suspect);
    }
}
