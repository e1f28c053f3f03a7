//! Password guessing on listeners with an `auth_file`. Each wrong user
//! name or password earns its source (an IPv4 address, an IPv6 /64) a
//! point, forgiven at one per [`FORGIVE_EVERY`]; a source at
//! `limits.credential_failures` points is reset at accept on those
//! listeners. A guesser then gets that many tries and one more per
//! `FORGIVE_EVERY`, instead of thousands a second; a user's typo costs
//! nothing. Missing credentials guess nothing and earn no point (clients
//! such as ncat ask without them first).

use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::policy::source_host;

/// With the default 10 points: 10 tries, then 10 a minute.
pub const FORGIVE_EVERY: Duration = Duration::from_secs(6);

/// Sources tracked at once; a source whose slot another holds with a
/// point or more goes untracked until that one is forgiven.
const SLOTS: usize = 4096;

#[derive(Clone, Copy)]
struct Slot {
    source: IpAddr,
    points: f64,
    at: Instant,
}

impl Slot {
    fn points_at(&self, now: Instant) -> f64 {
        let forgiven =
            now.saturating_duration_since(self.at).as_secs_f64() / FORGIVE_EVERY.as_secs_f64();
        (self.points - forgiven).max(0.0)
    }
}

pub struct Guessing {
    slots: Mutex<Vec<Option<Slot>>>,
    hasher: RandomState,
}

impl Default for Guessing {
    fn default() -> Self {
        Guessing {
            slots: Mutex::new(vec![None; SLOTS]),
            hasher: RandomState::new(),
        }
    }
}

impl Guessing {
    fn index(&self, source: IpAddr) -> usize {
        self.hasher.hash_one(source) as usize % SLOTS
    }

    /// `ip` gave a wrong user name or password at `now`.
    pub fn failed(&self, ip: IpAddr, now: Instant) {
        let source = source_host(ip);
        let i = self.index(source);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let points = match slots[i] {
            Some(s) if s.source == source => s.points_at(now),
            Some(s) if s.points_at(now) >= 1.0 => return,
            _ => 0.0,
        };
        slots[i] = Some(Slot {
            source,
            points: points + 1.0,
            at: now,
        });
    }

    /// Whether `ip` failed `max` times, less what was forgiven, at `now`
    /// (0: never).
    pub fn blocked(&self, ip: IpAddr, max: usize, now: Instant) -> bool {
        if max == 0 {
            return false;
        }
        let source = source_host(ip);
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots[self.index(source)] {
            // Over max - 1 rather than at max: points decay continuously,
            // so the max-th quick failure leaves a little under max.
            Some(s) if s.source == source => s.points_at(now) > (max - 1) as f64,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_tries_then_one_per_six_seconds() {
        let g = Guessing::default();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..9 {
            g.failed(ip, t0);
        }
        assert!(!g.blocked(ip, 10, t0));
        g.failed(ip, t0);
        assert!(g.blocked(ip, 10, t0));
        assert!(!g.blocked(other, 10, t0), "a neighbour is not blocked");
        assert!(!g.blocked(ip, 0, t0), "0 turns the guard off");
        assert!(g.blocked(ip, 10, t0 + Duration::from_secs(5)));
        assert!(!g.blocked(ip, 10, t0 + Duration::from_secs(7)));
        // One more wrong try blocks it again.
        g.failed(ip, t0 + Duration::from_secs(7));
        assert!(g.blocked(ip, 10, t0 + Duration::from_secs(7)));
        assert!(!g.blocked(ip, 10, t0 + Duration::from_secs(70)));
    }

    #[test]
    fn an_ipv6_host_counts_with_its_64() {
        let g = Guessing::default();
        let t0 = Instant::now();
        for i in 0..10u16 {
            g.failed(format!("2001:db8:1:2::{i:x}").parse().unwrap(), t0);
        }
        assert!(g.blocked("2001:db8:1:2::ffff".parse().unwrap(), 10, t0));
        assert!(!g.blocked("2001:db8:1:3::1".parse().unwrap(), 10, t0));
        // An IPv4-mapped address is its IPv4 address.
        for _ in 0..10 {
            g.failed("::ffff:198.51.100.1".parse().unwrap(), t0);
        }
        assert!(g.blocked("198.51.100.1".parse().unwrap(), 10, t0));
    }
}
