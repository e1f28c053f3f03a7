//! A chain's timed handovers (`[chain.link.handover]`): one thread changes
//! each such link's RTT every interval, with a loss burst after each
//! change, for as long as the chain is measured.

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
        if plans.is_empty() {
            return Handovers { stop, thread: None };
        }
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || run(&plans, &flag));
        Handovers {
            stop,
            thread: Some(thread),
        }
    }
}

fn run(plans: &[Plan], stop: &AtomicBool) {
    let t0 = Instant::now();
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
