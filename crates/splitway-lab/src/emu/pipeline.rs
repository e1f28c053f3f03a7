//! One direction of an emulated link, as pure logic over a nanosecond clock
//! (no I/O, so it is unit-tested with synthetic time).
//!
//! A packet arriving at `now` goes through, in order:
//! 1. random loss (probability `loss`, drawn from a seedable PRNG);
//! 2. the rate limiter: a serialiser at `rate_bps` fed by a drop-tail FIFO;
//!    the packet finishes serialising at `tx_done`;
//! 3. the propagation delay, plus uniform jitter in ±`jitter_ns`.
//!
//! Release times never decrease (a packet is never released before the one
//! ahead of it), so jitter never reorders packets; with dense traffic this
//! pushes the mean delay above `delay_ns` by up to `jitter_ns`.
//! Packet buffers come from a pool that only grows (up to `max_buffers`)
//! when all buffers are in flight: no allocation per packet.

use std::collections::VecDeque;

use super::rng::Rng;

/// Size of one packet buffer; the TUN MTU is 1500.
pub const PACKET_BUF: usize = 2048;

/// Buffers added to the pool at a time when all are in flight.
const GROW_STEP: usize = 256;

/// Drop-tail bound of the rate limiter's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueBound {
    /// Packets waiting or being serialised.
    Packets(usize),
    /// Serialisation backlog ahead of an arriving packet, in ns.
    Nanos(u64),
}

/// Resolved parameters of one direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DirectionParams {
    pub delay_ns: u64,
    pub jitter_ns: u64,
    /// Probability in [0, 1] that a packet is dropped.
    pub loss: f64,
    /// Serialisation rate of IP packets (header included), bits/s.
    pub rate_bps: Option<f64>,
    pub queue: QueueBound,
}

impl DirectionParams {
    pub fn delay_only(delay_ns: u64) -> DirectionParams {
        DirectionParams {
            delay_ns,
            jitter_ns: 0,
            loss: 0.0,
            rate_bps: None,
            queue: QueueBound::Packets(usize::MAX),
        }
    }
}

#[derive(Debug)]
pub struct Packet {
    pub buf: Box<[u8]>,
    pub len: usize,
    pub release_at: u64,
}

impl Packet {
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Queued,
    DroppedLoss,
    DroppedQueue,
}

#[derive(Debug)]
pub struct Pipeline {
    params: DirectionParams,
    rng: Rng,
    in_flight: VecDeque<Packet>,
    pool: Vec<Box<[u8]>>,
    allocated: usize,
    max_buffers: usize,
    /// When the serialiser finishes the last admitted packet.
    tx_free_at: u64,
    /// Serialisation end times of packets still queued or serialising.
    serialising: VecDeque<u64>,
    last_release: u64,
}

impl Pipeline {
    pub fn new(
        params: DirectionParams,
        seed: u64,
        initial_buffers: usize,
        max_buffers: usize,
    ) -> Pipeline {
        let initial = initial_buffers.min(max_buffers);
        Pipeline {
            params,
            rng: Rng::seeded(seed),
            in_flight: VecDeque::with_capacity(initial),
            pool: (0..initial)
                .map(|_| vec![0u8; PACKET_BUF].into_boxed_slice())
                .collect(),
            allocated: initial,
            max_buffers,
            tx_free_at: 0,
            serialising: VecDeque::with_capacity(initial),
            last_release: 0,
        }
    }

    pub fn params(&self) -> &DirectionParams {
        &self.params
    }

    /// New parameters apply to packets admitted from now on.
    pub fn set_params(&mut self, params: DirectionParams) {
        self.params = params;
    }

    /// A free buffer, or None when `max_buffers` are all in flight.
    pub fn take_buffer(&mut self) -> Option<Box<[u8]>> {
        if let Some(b) = self.pool.pop() {
            return Some(b);
        }
        if self.allocated < self.max_buffers {
            // Grow the pool in small steps (zeroing 512 KiB takes ~100 µs,
            // a doubling of a large pool would stall releases for ms),
            // never per packet in steady state.
            let grow = GROW_STEP.min(self.max_buffers - self.allocated);
            debug_assert!(grow >= 1);
            self.pool
                .extend((1..grow).map(|_| vec![0u8; PACKET_BUF].into_boxed_slice()));
            self.allocated += grow;
            return Some(vec![0u8; PACKET_BUF].into_boxed_slice());
        }
        None
    }

    pub fn recycle(&mut self, buf: Box<[u8]>) {
        self.pool.push(buf);
    }

    /// Raises (or lowers, for future growth only) the buffer cap, e.g. when
    /// a link's delay grows live.
    pub fn set_max_buffers(&mut self, max_buffers: usize) {
        self.max_buffers = max_buffers.max(1);
    }

    pub fn allocated_buffers(&self) -> usize {
        self.allocated
    }

    /// Packets queued in or being serialised by the rate limiter at `now`.
    pub fn queue_len(&mut self, now: u64) -> usize {
        while self.serialising.front().is_some_and(|&t| t <= now) {
            self.serialising.pop_front();
        }
        self.serialising.len()
    }

    /// Admits a packet of `len` bytes that arrived at `now`. On a drop the
    /// buffer goes back to the pool.
    pub fn admit(&mut self, buf: Box<[u8]>, len: usize, now: u64) -> Admit {
        let p = self.params;
        if p.loss > 0.0 && self.rng.next_f64() < p.loss {
            self.recycle(buf);
            return Admit::DroppedLoss;
        }
        let tx_done = match p.rate_bps {
            None => now,
            Some(rate) => {
                let start = self.tx_free_at.max(now);
                let over = match p.queue {
                    QueueBound::Packets(n) => self.queue_len(now) >= n,
                    QueueBound::Nanos(limit) => start - now > limit,
                };
                if over {
                    self.recycle(buf);
                    return Admit::DroppedQueue;
                }
                let tx_ns = (len as f64 * 8.0 * 1e9 / rate).round() as u64;
                let done = start + tx_ns;
                self.tx_free_at = done;
                self.serialising.push_back(done);
                done
            }
        };
        let mut delay = p.delay_ns;
        if p.jitter_ns > 0 {
            let offset = (self.rng.next_f64() * 2.0 - 1.0) * p.jitter_ns as f64;
            delay = (delay as f64 + offset).max(0.0).round() as u64;
        }
        let release_at = (tx_done + delay).max(self.last_release);
        self.last_release = release_at;
        self.in_flight.push_back(Packet {
            buf,
            len,
            release_at,
        });
        Admit::Queued
    }

    pub fn next_release(&self) -> Option<u64> {
        self.in_flight.front().map(|p| p.release_at)
    }

    /// The head packet if its release time has come.
    pub fn pop_due(&mut self, now: u64) -> Option<Packet> {
        if self.in_flight.front()?.release_at <= now {
            self.in_flight.pop_front()
        } else {
            None
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn admit_n(p: &mut Pipeline, n: usize, len: usize, now: u64) -> Vec<Admit> {
        (0..n)
            .map(|_| {
                let b = p.take_buffer().expect("buffer");
                p.admit(b, len, now)
            })
            .collect()
    }

    #[test]
    fn delay_releases_in_fifo_order_never_early() {
        let mut params = DirectionParams::delay_only(10 * MS);
        params.jitter_ns = 3 * MS;
        let mut p = Pipeline::new(params, 42, 16, 4096);
        let mut arrivals = Vec::new();
        let mut last = 0;
        let mut released = 0;
        let mut check_release = |p: &mut Pipeline, now: u64, arrivals: &[u64]| {
            while let Some(pkt) = p.pop_due(now) {
                assert!(pkt.release_at >= last, "reordered");
                assert!(pkt.release_at <= now, "released early");
                // delay - jitter is the earliest legal release
                assert!(pkt.release_at >= arrivals[released] + 7 * MS);
                last = pkt.release_at;
                released += 1;
                p.recycle(pkt.buf);
            }
        };
        for i in 0..2000u64 {
            let now = i * 50_000; // one packet every 50 µs
            check_release(&mut p, now, &arrivals);
            let b = p.take_buffer().expect("buffer");
            assert_eq!(p.admit(b, 100, now), Admit::Queued);
            arrivals.push(now);
        }
        while let Some(t) = p.next_release() {
            check_release(&mut p, t, &arrivals);
        }
        let i = released;
        assert_eq!(i, 2000);
        // Buffers were reused, not allocated per packet.
        assert!(p.allocated_buffers() < 2000, "{}", p.allocated_buffers());
    }

    #[test]
    fn no_jitter_means_exact_delay() {
        let mut p = Pipeline::new(DirectionParams::delay_only(25 * MS), 1, 4, 64);
        let b = p.take_buffer().expect("buffer");
        p.admit(b, 1500, 7);
        assert_eq!(p.next_release(), Some(25 * MS + 7));
        assert!(p.pop_due(25 * MS + 6).is_none());
        assert!(p.pop_due(25 * MS + 7).is_some());
    }

    #[test]
    fn seeded_loss_is_binomial_and_reproducible() {
        for loss in [0.01, 0.1, 0.5] {
            let mut params = DirectionParams::delay_only(0);
            params.loss = loss;
            let n = 200_000usize;
            let run = |seed: u64| {
                let mut p = Pipeline::new(params, seed, 4, 8);
                let mut pattern = Vec::with_capacity(n);
                for _ in 0..n {
                    let b = p.take_buffer().expect("buffer");
                    let a = p.admit(b, 64, 0);
                    pattern.push(a == Admit::DroppedLoss);
                    if let Some(pkt) = p.pop_due(0) {
                        p.recycle(pkt.buf);
                    }
                }
                pattern
            };
            let a = run(99);
            assert_eq!(a, run(99), "same seed, same drops");
            assert_ne!(a, run(100));
            let dropped = a.iter().filter(|d| **d).count() as f64;
            let expected = n as f64 * loss;
            let sd = (n as f64 * loss * (1.0 - loss)).sqrt();
            assert!(
                (dropped - expected).abs() < 5.0 * sd,
                "loss {loss}: {dropped} dropped, expected {expected} ± {sd}"
            );
        }
    }

    #[test]
    fn rate_spaces_packets_by_serialisation_time() {
        let mut params = DirectionParams::delay_only(5 * MS);
        params.rate_bps = Some(10e6); // 1500 B = 1.2 ms
        params.queue = QueueBound::Packets(1000);
        let mut p = Pipeline::new(params, 1, 16, 64);
        assert!(
            admit_n(&mut p, 10, 1500, 0)
                .iter()
                .all(|a| *a == Admit::Queued)
        );
        let mut releases = Vec::new();
        while let Some(t) = p.next_release() {
            let pkt = p.pop_due(t).expect("due");
            releases.push(pkt.release_at);
            p.recycle(pkt.buf);
        }
        for (k, t) in releases.iter().enumerate() {
            assert_eq!(*t, (k as u64 + 1) * 1_200_000 + 5 * MS);
        }
        // An idle link does not bank credit: a later packet waits only for
        // its own serialisation.
        let b = p.take_buffer().expect("buffer");
        p.admit(b, 1500, 100 * MS);
        assert_eq!(p.next_release(), Some(100 * MS + 1_200_000 + 5 * MS));
    }

    #[test]
    fn drop_tail_packet_bound() {
        let mut params = DirectionParams::delay_only(0);
        params.rate_bps = Some(10e6);
        params.queue = QueueBound::Packets(8);
        let mut p = Pipeline::new(params, 1, 16, 64);
        let admits = admit_n(&mut p, 20, 1500, 0);
        assert!(admits[..8].iter().all(|a| *a == Admit::Queued));
        assert!(admits[8..].iter().all(|a| *a == Admit::DroppedQueue));
        assert_eq!(p.queue_len(0), 8);
        // After one serialisation time, exactly one slot is free.
        assert_eq!(p.queue_len(1_200_000), 7);
        let more = admit_n(&mut p, 2, 1500, 1_200_000);
        assert_eq!(more, vec![Admit::Queued, Admit::DroppedQueue]);
    }

    #[test]
    fn drop_tail_time_bound() {
        let mut params = DirectionParams::delay_only(0);
        params.rate_bps = Some(10e6);
        params.queue = QueueBound::Nanos(6 * MS); // 5 packets of backlog
        let mut p = Pipeline::new(params, 1, 16, 64);
        let admits = admit_n(&mut p, 10, 1500, 0);
        let queued = admits.iter().filter(|a| **a == Admit::Queued).count();
        // backlog before packet k is k × 1.2 ms; admitted while ≤ 6 ms.
        assert_eq!(queued, 6);
        assert!(admits[6..].iter().all(|a| *a == Admit::DroppedQueue));
    }

    #[test]
    fn buffer_pool_is_bounded() {
        let mut p = Pipeline::new(DirectionParams::delay_only(MS), 1, 2, 5);
        let bufs: Vec<_> = (0..5).map(|_| p.take_buffer().expect("buffer")).collect();
        assert!(p.take_buffer().is_none());
        for b in bufs {
            p.recycle(b);
        }
        assert!(p.take_buffer().is_some());
        assert_eq!(p.allocated_buffers(), 5);
    }
}
