//! Connection limits: a global cap and a per-client-address cap, taken at
//! accept and released when the connection's task ends.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::metrics::DenyReason;
use tokio::sync::Notify;

use crate::guessing::Guessing;

use crate::config::Limits;

const SHARDS: usize = 16;

/// How many times `limits.handshaking_per_client` an unknown relay's
/// legs may be in their handshake at once, those over the cap waiting
/// for the source's first authentication (see
/// [`ConnLimiter::relay_handshaking`]).
pub const RELAY_OVERFLOW: usize = 16;

pub struct ConnLimiter {
    /// `Limits`, changeable by a reload; permits taken before keep counting.
    max_connections: AtomicUsize,
    per_client_max: AtomicUsize,
    /// What the open-file limit leaves room for (two sockets a
    /// connection); 0 = no such cap. Fixed at start.
    descriptor_cap: usize,
    total: AtomicUsize,
    per_client: Vec<Mutex<HashMap<IpAddr, usize>>>,
    /// `limits.handshaking_per_client`, and per client address the
    /// connections still in their handshake (an entry only while some are).
    handshaking_max: AtomicUsize,
    handshaking: Vec<Mutex<HashMap<IpAddr, usize>>>,
    hasher: RandomState,
    /// Connections accepted but not yet given (or refused) a permit, e.g.
    /// while their PROXY header is read: a drain waits for them too.
    admitting: AtomicUsize,
    /// Woken when the last permit or admission ends (a drain waits on it).
    none_open: Notify,
    /// `limits.credential_failures`, and each source's wrong credentials.
    credential_failures: AtomicUsize,
    guessing: Guessing,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Total,
    PerClient,
    /// The open-file limit is near (see [`descriptor_cap`]).
    Descriptors,
    /// Too many of the client's connections are still in their handshake.
    Handshaking,
}

impl Refused {
    /// The bounded metrics label.
    pub fn reason(self) -> DenyReason {
        match self {
            Refused::Total => DenyReason::ConnectionLimit,
            Refused::PerClient => DenyReason::PerClientLimit,
            Refused::Descriptors => DenyReason::Descriptors,
            Refused::Handshaking => DenyReason::Handshaking,
        }
    }
}

/// Descriptors kept out of the connection budget: listeners, the admin
/// API, pooled and early-started legs, splice pipes, DNS and BPF.
pub const DESCRIPTOR_RESERVE: usize = 512;

/// How many split connections (two sockets each) fit under the open-file
/// limit `nofile` once `reserve` is set aside (at most half of a small
/// limit). New connections beyond it are shed at accept, so the relay never
/// reaches EMFILE with connections in hand that then cannot dial their
/// next leg.
pub fn descriptor_cap(nofile: u64, reserve: usize) -> usize {
    let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
    let reserve = reserve.min(nofile / 2);
    (nofile.saturating_sub(reserve) / 2).max(1)
}

/// A connection being admitted (see [`ConnLimiter::admitting`]).
pub struct Admitting<'a> {
    limiter: &'a ConnLimiter,
}

impl Drop for Admitting<'_> {
    fn drop(&mut self) {
        if self.limiter.admitting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.limiter.none_open.notify_waiters();
        }
    }
}

/// Held while a connection's handshake runs (see
/// [`ConnLimiter::handshaking`]).
pub struct Handshaking {
    limiter: Arc<ConnLimiter>,
    client: IpAddr,
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut shard = self
            .limiter
            .handshake_shard(&self.client)
            .lock()
            .expect("limiter lock");
        if let Some(n) = shard.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                shard.remove(&self.client);
            }
        }
    }
}

/// Held for a connection's lifetime.
pub struct Permit {
    limiter: Arc<ConnLimiter>,
    client: Option<IpAddr>,
}

impl ConnLimiter {
    pub fn new(limits: Limits) -> Arc<ConnLimiter> {
        ConnLimiter::with_descriptor_cap(limits, 0)
    }

    /// A limiter that also sheds connections beyond `descriptor_cap`
    /// (0 = none), whatever `limits` say.
    pub fn with_descriptor_cap(limits: Limits, descriptor_cap: usize) -> Arc<ConnLimiter> {
        Arc::new(ConnLimiter {
            max_connections: AtomicUsize::new(limits.max_connections),
            per_client_max: AtomicUsize::new(limits.per_client),
            descriptor_cap,
            total: AtomicUsize::new(0),
            per_client: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            handshaking_max: AtomicUsize::new(limits.handshaking_per_client),
            handshaking: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            admitting: AtomicUsize::new(0),
            none_open: Notify::new(),
            credential_failures: AtomicUsize::new(limits.credential_failures),
            guessing: Guessing::default(),
        })
    }

    fn shard(&self, ip: &IpAddr) -> &Mutex<HashMap<IpAddr, usize>> {
        &self.per_client[self.hasher.hash_one(ip) as usize % SHARDS]
    }

    fn handshake_shard(&self, ip: &IpAddr) -> &Mutex<HashMap<IpAddr, usize>> {
        &self.handshaking[self.hasher.hash_one(ip) as usize % SHARDS]
    }

    /// Counts one more connection from `client` still in its handshake,
    /// unless `limits.handshaking_per_client` of them already are (`None`:
    /// no cap). The connection's [`Permit`] counts it against the totals
    /// besides; this bounds what one address holds by saying nothing.
    pub fn handshaking(self: &Arc<Self>, client: IpAddr) -> Result<Option<Handshaking>, Refused> {
        Ok(self.handshake_slot(client, 1)?.map(|(slot, _)| slot))
    }

    /// [`handshaking`](Self::handshaking) for a source that may be an
    /// upstream relay whose first leg has not authenticated yet: beyond
    /// the cap, up to [`RELAY_OVERFLOW`] times it, the slot is granted
    /// marked `true` (over the cap), and its connection must wait for the
    /// source's first authentication rather than be reset. A relay
    /// starting under load opens more legs at once than the cap.
    pub fn relay_handshaking(
        self: &Arc<Self>,
        client: IpAddr,
    ) -> Result<Option<(Handshaking, bool)>, Refused> {
        self.handshake_slot(client, RELAY_OVERFLOW)
    }

    fn handshake_slot(
        self: &Arc<Self>,
        client: IpAddr,
        factor: usize,
    ) -> Result<Option<(Handshaking, bool)>, Refused> {
        let max = self.handshaking_max.load(Ordering::Relaxed);
        if max == 0 {
            return Ok(None);
        }
        let mut shard = self.handshake_shard(&client).lock().expect("limiter lock");
        let n = shard.entry(client).or_insert(0);
        if *n >= max.saturating_mul(factor) {
            return Err(Refused::Handshaking);
        }
        let over = *n >= max;
        *n += 1;
        let slot = Handshaking {
            limiter: self.clone(),
            client,
        };
        Ok(Some((slot, over)))
    }

    /// Takes a slot for a connection from `client` (`None`: exempt from the
    /// per-client cap, e.g. a peer relay).
    pub fn acquire(self: &Arc<Self>, client: Option<IpAddr>) -> Result<Permit, Refused> {
        let max = self.max_connections.load(Ordering::Relaxed);
        let per_client_max = self.per_client_max.load(Ordering::Relaxed);
        let prev = self.total.fetch_add(1, Ordering::AcqRel);
        if let Err(why) = self.over_total(max, prev) {
            self.release_one();
            return Err(why);
        }
        let client = client.filter(|_| per_client_max != 0);
        if let Some(ip) = client {
            let mut shard = self.shard(&ip).lock().expect("limiter lock");
            let n = shard.entry(ip).or_insert(0);
            if *n >= per_client_max {
                drop(shard);
                self.release_one();
                return Err(Refused::PerClient);
            }
            *n += 1;
        }
        Ok(Permit {
            limiter: self.clone(),
            client,
        })
    }

    /// Whether [`ConnLimiter::acquire`] would admit `client` now, without
    /// taking anything: work started before accept (early SYN, strict mode)
    /// must not be done for a connection that accept will refuse.
    pub fn would_admit(&self, client: Option<IpAddr>) -> Result<(), Refused> {
        let max = self.max_connections.load(Ordering::Relaxed);
        self.over_total(max, self.total.load(Ordering::Acquire))?;
        let per_client_max = self.per_client_max.load(Ordering::Relaxed);
        if let Some(ip) = client.filter(|_| per_client_max != 0) {
            let shard = self.shard(&ip).lock().expect("limiter lock");
            if shard.get(&ip).is_some_and(|n| *n >= per_client_max) {
                return Err(Refused::PerClient);
            }
        }
        Ok(())
    }

    fn over_total(&self, max: usize, open: usize) -> Result<(), Refused> {
        if max != 0 && open >= max {
            Err(Refused::Total)
        } else if self.descriptor_cap != 0 && open >= self.descriptor_cap {
            Err(Refused::Descriptors)
        } else {
            Ok(())
        }
    }

    pub fn descriptor_cap(&self) -> usize {
        self.descriptor_cap
    }

    /// New caps for connections from now on (a reload). Connections over a
    /// lowered cap are not closed; new ones wait until the count is below.
    pub fn set_limits(&self, limits: Limits) {
        self.max_connections
            .store(limits.max_connections, Ordering::Relaxed);
        self.per_client_max
            .store(limits.per_client, Ordering::Relaxed);
        self.handshaking_max
            .store(limits.handshaking_per_client, Ordering::Relaxed);
        self.credential_failures
            .store(limits.credential_failures, Ordering::Relaxed);
    }

    /// `client` gave wrong proxy credentials (see [`crate::guessing`]).
    pub fn credentials_failed(&self, client: IpAddr) {
        self.guessing.failed(client, Instant::now());
    }

    /// `client` has given wrong proxy credentials too often: reset it at
    /// accept on listeners that ask for them.
    pub fn guessing(&self, client: IpAddr) -> bool {
        let max = self.credential_failures.load(Ordering::Relaxed);
        self.guessing.blocked(client, max, Instant::now())
    }

    pub fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }

    /// Gives a slot back; the last one wakes `all_closed`.
    fn release_one(&self) {
        if self.total.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.none_open.notify_waiters();
        }
    }

    /// Held from accept until the connection has its permit or is refused.
    pub fn admitting(&self) -> Admitting<'_> {
        self.admitting.fetch_add(1, Ordering::AcqRel);
        Admitting { limiter: self }
    }

    /// Resolves once no permit is held and no connection is being admitted
    /// (at once if none is).
    pub async fn all_closed(&self) {
        loop {
            let notified = self.none_open.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check: a release between the two wakes it.
            notified.as_mut().enable();
            if self.open() == 0 && self.admitting.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(ip) = self.client {
            let mut shard = self.limiter.shard(&ip).lock().expect("limiter lock");
            if let Some(n) = shard.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    shard.remove(&ip);
                }
            }
        }
        self.limiter.release_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;
    use std::sync::atomic::AtomicBool;
    use std::task::{Context, Wake, Waker};

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A drain waits on the limiter: woken by the last permit's release,
    /// not by an earlier one nor by a refused acquire.
    #[test]
    fn all_closed_is_woken_by_the_last_permit() {
        let l = ConnLimiter::new(Limits {
            max_connections: 2,
            per_client: 0,
            handshaking_per_client: 0,
            credential_failures: 0,
        });
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let p1 = l.acquire(None).unwrap();
        let p2 = l.acquire(None).unwrap();
        let mut wait = std::pin::pin!(l.all_closed());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        assert_eq!(l.acquire(None).err(), Some(Refused::Total));
        drop(p1);
        assert!(
            !flag.0.load(Ordering::SeqCst),
            "woken with a permit still held"
        );
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        drop(p2);
        assert!(
            flag.0.load(Ordering::SeqCst),
            "not woken by the last release"
        );
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        // Nothing open: ready at once.
        assert!(std::pin::pin!(l.all_closed()).poll(&mut cx).is_ready());
    }

    /// A connection still being admitted (no permit yet) holds a drain too,
    /// until it has its permit and that is released.
    #[test]
    fn all_closed_waits_for_a_connection_being_admitted() {
        let l = ConnLimiter::new(Limits {
            max_connections: 0,
            per_client: 0,
            handshaking_per_client: 0,
            credential_failures: 0,
        });
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let admitting = l.admitting();
        let mut wait = std::pin::pin!(l.all_closed());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        let permit = l.acquire(None).unwrap();
        drop(admitting);
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        flag.0.store(false, Ordering::SeqCst);
        drop(permit);
        assert!(flag.0.load(Ordering::SeqCst), "not woken by the release");
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        // Refused (or gone) during admission: its end alone wakes the drain.
        let admitting = l.admitting();
        let mut wait = std::pin::pin!(l.all_closed());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        flag.0.store(false, Ordering::SeqCst);
        drop(admitting);
        assert!(
            flag.0.load(Ordering::SeqCst),
            "not woken by the admission's end"
        );
        assert!(wait.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn caps_total_and_per_client_and_releases() {
        let l = ConnLimiter::new(Limits {
            max_connections: 3,
            per_client: 2,
            handshaking_per_client: 0,
            credential_failures: 0,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(l.would_admit(Some(a)), Ok(()));
        let p1 = l.acquire(Some(a)).unwrap();
        let p2 = l.acquire(Some(a)).unwrap();
        assert_eq!(l.would_admit(Some(a)), Err(Refused::PerClient));
        assert_eq!(l.would_admit(Some(b)), Ok(()));
        assert_eq!(l.acquire(Some(a)).err(), Some(Refused::PerClient));
        let p3 = l.acquire(Some(b)).unwrap();
        assert_eq!(l.acquire(None).err(), Some(Refused::Total));
        assert_eq!(l.would_admit(Some(b)), Err(Refused::Total));
        drop(p1);
        assert_eq!(l.would_admit(Some(a)), Ok(()));
        let p4 = l.acquire(Some(a)).unwrap();
        assert_eq!(l.open(), 3);
        drop((p2, p3, p4));
        assert_eq!(l.open(), 0);
        assert!(l.per_client.iter().all(|s| s.lock().unwrap().is_empty()));
    }

    #[test]
    fn handshakes_are_capped_per_client_and_released() {
        let l = ConnLimiter::new(Limits {
            max_connections: 0,
            per_client: 0,
            handshaking_per_client: 2,
            credential_failures: 0,
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let h1 = l.handshaking(a).unwrap();
        let _h2 = l.handshaking(a).unwrap();
        assert_eq!(l.handshaking(a).err(), Some(Refused::Handshaking));
        assert!(l.handshaking(b).unwrap().is_some(), "another address");
        drop(h1);
        assert!(l.handshaking(a).unwrap().is_some(), "a slot came back");
        l.set_limits(Limits {
            max_connections: 0,
            per_client: 0,
            handshaking_per_client: 0,
            credential_failures: 0,
        });
        assert!(l.handshaking(a).unwrap().is_none(), "0 = no cap");
    }

    #[test]
    fn an_unknown_relay_gets_slots_over_the_cap_marked_as_such() {
        let l = ConnLimiter::new(Limits {
            max_connections: 0,
            per_client: 0,
            handshaking_per_client: 2,
            credential_failures: 0,
        });
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let slots: Vec<_> = (0..2 * RELAY_OVERFLOW)
            .map(|_| l.relay_handshaking(a).unwrap().expect("a cap is set"))
            .collect();
        let over: Vec<bool> = slots.iter().map(|(_, over)| *over).collect();
        assert_eq!(&over[..2], [false, false]);
        assert!(over[2..].iter().all(|o| *o), "{over:?}");
        assert_eq!(l.relay_handshaking(a).err(), Some(Refused::Handshaking));
        // The plain cap still counts them: a proxy client from there waits.
        assert_eq!(l.handshaking(a).err(), Some(Refused::Handshaking));
        drop(slots);
        assert!(!l.relay_handshaking(a).unwrap().unwrap().1, "all released");
    }

    #[test]
    fn the_descriptor_cap_sheds_whatever_the_limits_say() {
        assert_eq!(descriptor_cap(20_000, DESCRIPTOR_RESERVE), 9_744);
        assert_eq!(descriptor_cap(300, DESCRIPTOR_RESERVE), 75);
        assert_eq!(descriptor_cap(1, DESCRIPTOR_RESERVE), 1);
        let l = ConnLimiter::with_descriptor_cap(
            Limits {
                max_connections: 0,
                per_client: 0,
                handshaking_per_client: 0,
                credential_failures: 0,
            },
            2,
        );
        let a = l.acquire(None).unwrap();
        let b = l.acquire(None).unwrap();
        assert_eq!(l.acquire(None).err(), Some(Refused::Descriptors));
        assert_eq!(l.would_admit(None), Err(Refused::Descriptors));
        drop(a);
        assert!(l.acquire(None).is_ok());
        drop(b);
    }

    #[test]
    fn zero_means_unlimited() {
        let l = ConnLimiter::new(Limits {
            max_connections: 0,
            per_client: 0,
            handshaking_per_client: 0,
            credential_failures: 0,
        });
        let permits: Vec<_> = (0..1000)
            .map(|_| l.acquire(Some("10.0.0.1".parse().unwrap())).unwrap())
            .collect();
        assert_eq!(l.open(), 1000);
        drop(permits);
        assert_eq!(l.open(), 0);
    }
}
