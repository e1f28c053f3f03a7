//! A chain's timed handovers (`[chain.link.handover]`): one thread changes
//! each such link's RTT every interval, with a loss burst after each
//! change, for as long as the chain is measured. Downloads start at times
//! aligned to that schedule ([`Handovers::aligned_start`]), so that every
//! configuration's rows meet the same phases and bursts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::emu::link::LinkControl;
use crate::scenario::{Chain, Handover};
use crate::topology::{LinkSpec, Topology};

/// The running schedule; dropping it stops the thread (the links keep the
/// parameters of the last change).
pub(super) struct Handovers {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// When the schedule began (handover k comes `every * k` after it).
    t0: Instant,
    /// The first handover link's interval and number of RTTs, which the
    /// downloads align to.
    schedule: Option<(Duration, usize)>,
}

struct Plan {
    control: LinkControl,
    base: LinkSpec,
    handover: Handover,
    /// Packet buffers for the longest of its RTTs.
    max_buffers: usize,
}

impl Plan {
    /// The link after handover `k` (k ≥ 1), during its loss burst or after.
    fn apply(&self, k: u64, burst: bool) {
        let mut spec = self.base.clone();
        spec.rtt = self.handover.rtts[(k % self.handover.rtts.len() as u64) as usize];
        spec.one_way = None;
        if burst {
            spec.loss = self.handover.loss;
            spec.loss_one_way = None;
        }
        let (forward, reverse) = spec.direction_params();
        self.control.set_params(forward, reverse, self.max_buffers);
    }
}

impl Handovers {
    pub(super) fn start(topo: &Topology, chain: &Chain) -> Handovers {
        let stop = Arc::new(AtomicBool::new(false));
        let plans: Vec<Plan> = chain
            .handovers
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let handover = h.clone()?;
                let base = topo.link_spec(i)?.clone();
                let mut longest = base.clone();
                longest.rtt = handover.rtts.iter().copied().max().unwrap_or(base.rtt);
                Some(Plan {
                    control: topo.link_control(i)?,
                    max_buffers: longest.buffer_budget().1,
                    base,
                    handover,
                })
            })
            .collect();
        let t0 = Instant::now();
        let Some(first) = plans.first() else {
            return Handovers {
                stop,
                thread: None,
                t0,
                schedule: None,
            };
        };
        let schedule = (!first.handover.every.is_zero() && !first.handover.rtts.is_empty())
            .then_some((first.handover.every, first.handover.rtts.len()));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || run(&plans, &flag, t0));
        Handovers {
            stop,
            thread: Some(thread),
            t0,
            schedule,
        }
    }

    /// When download `rep` of a row's `reps` starts: `rep / reps` of an
    /// interval after a handover to `rtts[rep % rtts.len()]`, the next such
    /// handover still to come. Every row's download `rep` then meets the
    /// same RTT phase at the same point of it, the loss burst included
    /// where the offset is 0, instead of whatever phase its turn falls in.
    /// `None` without handovers.
    pub(super) fn aligned_start(&self, rep: u32, reps: u32) -> Option<Instant> {
        let (every, phases) = self.schedule?;
        let offset = every.mul_f64(f64::from(rep) / f64::from(reps.max(1)));
        let phases = phases as u64;
        let phase = u64::from(rep) % phases;
        // A little ahead of now, so the start is not already past.
        let earliest = self.t0.elapsed() + Duration::from_millis(20);
        let mut k =
            (earliest.saturating_sub(offset).as_secs_f64() / every.as_secs_f64()).ceil() as u64;
        k = k.max(1);
        while k % phases != phase {
            k += 1;
        }
        Some(self.t0 + every.mul_f64(k as f64) + offset)
    }
}

fn run(plans: &[Plan], stop: &AtomicBool, t0: Instant) {
    // Per plan: the next handover's number and whether its burst is on.
    let mut next: Vec<(u64, bool)> = vec![(1, false); plans.len()];
    let due = |p: &Plan, (k, burst): (u64, bool)| {
        let at = p.handover.every * k as u32;
        if burst { at + p.handover.loss_for } else { at }
    };
    while !stop.load(Ordering::Relaxed) {
        let (i, at) = plans
            .iter()
            .zip(&next)
            .map(|(p, n)| due(p, *n))
            .enumerate()
            .min_by_key(|(_, at)| *at)
            .expect("at least one plan");
        let now = t0.elapsed();
        if now < at {
            std::thread::sleep((at - now).min(Duration::from_millis(100)));
            continue;
        }
        let (k, burst) = next[i];
        if burst {
            // The burst ends: the same RTT, the link's own loss.
            plans[i].apply(k, false);
            next[i] = (k + 1, false);
        } else {
            let with_burst = plans[i].handover.loss > 0.0 && !plans[i].handover.loss_for.is_zero();
            plans[i].apply(k, with_burst);
            next[i] = if with_burst {
                (k, true)
            } else {
                (k + 1, false)
            };
        }
    }
}

impl Drop for Handovers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(every_s: u64, phases: usize) -> Handovers {
        Handovers {
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
            t0: Instant::now(),
            schedule: Some((Duration::from_secs(every_s), phases)),
        }
    }

    #[test]
    fn each_rep_starts_in_its_own_phase_at_its_own_offset() {
        let h = schedule(15, 2);
        let at = |rep| {
            h.aligned_start(rep, 5)
                .expect("a schedule")
                .duration_since(h.t0)
        };
        // Handover k sets rtts[k % 2]: rep r waits for one with k % 2 == r % 2,
        // then r/5 of the interval.
        assert_eq!(at(0), Duration::from_secs(30));
        assert_eq!(at(1), Duration::from_secs(18));
        assert_eq!(at(2), Duration::from_secs(36));
        assert_eq!(at(3), Duration::from_secs(24));
        assert_eq!(at(4), Duration::from_secs(42));
        // The same rep of another row gets the same phase and offset.
        assert_eq!(at(3).as_secs() % 15, 9);
    }

    #[test]
    fn no_handovers_no_wait() {
        let mut h = schedule(15, 2);
        h.schedule = None;
        assert!(h.aligned_start(0, 5).is_none());
    }
}
