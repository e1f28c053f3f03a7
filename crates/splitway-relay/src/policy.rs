//! Destination access control (`[policy]`): which addresses and ports the
//! relay connects to on its clients' behalf.
//!
//! Checked in [`crate::dial::connect_next`], where every leg is dialed:
//! the port before a domain is resolved (no lookup for a forbidden port),
//! the address after (the one actually dialed). So the first relay refuses
//! before any relay leg is used, and a downstream relay applies its own
//! policy to the headers it receives.
//!
//! Order: port, `deny_destinations` (wins over allow), the default
//! deny-list (multicast and broadcast, link-local, host-local, this host's
//! own addresses), `allow_destinations`.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::metrics::DenyReason;
use ipnet::IpNet;

/// A validated `[policy]` section. The default allows every destination
/// but the default deny-list: multicast and broadcast, link-local (cloud
/// metadata), and host-local and this host's addresses asked for by
/// clients on other hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Destination prefixes allowed; empty = any.
    pub allow_destinations: Vec<IpNet>,
    /// Destination prefixes refused even when allowed above.
    pub deny_destinations: Vec<IpNet>,
    /// Destination ports allowed; empty = any.
    pub allow_ports: Vec<RangeInclusive<u16>>,
    /// Let clients from other hosts reach this host's loopback and
    /// unspecified addresses. Off by default: through an explicit proxy
    /// opened with `allow_clients`, or a peer listener, a remote party
    /// would otherwise reach services bound to loopback only, the relay's
    /// own admin API first (`POST /drain`, `PUT /params`). A loopback
    /// client can reach them without the relay, so it is never refused.
    pub allow_local_destinations: bool,
    /// Let clients reach link-local addresses (169.254.0.0/16, fe80::/10)
    /// and AWS's IPv6 metadata address: the cloud metadata services
    /// (instance credentials) live there. Off by default, for loopback
    /// clients too: hosts often firewall metadata by user, and the relay
    /// would dial it as its own user.
    pub allow_link_local: bool,
    /// Let clients from other hosts reach this host's own interface
    /// addresses on any port. Off by default: services the host firewalls
    /// to itself (`iifname != "lo" drop`) would be reached through the
    /// relay, which dials them from inside the host.
    pub allow_host_addresses: bool,
    /// Let relays (`[[peer]]` addresses and upstream relays that
    /// authenticated here) use this relay's SOCKS5 and CONNECT listeners.
    /// Off by default: a proxy request from a relay is a chain nested
    /// through the relays, each level multiplying the long-haul traffic.
    pub allow_relay_clients: bool,
}

/// AWS's instance metadata over IPv6 (a unique-local address, not
/// link-local, so listed apart).
pub const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Why a destination was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error("port {0} is not in policy.allow_ports")]
    Port(u16),
    #[error("{0} is not in policy.allow_destinations")]
    NotAllowed(IpAddr),
    #[error("{0} is in policy.deny_destinations")]
    Denied(IpAddr),
    #[error(
        "{0} is a host-local address, refused to a client from another host (policy.allow_local_destinations)"
    )]
    Local(IpAddr),
    #[error("{0} is link-local (cloud metadata lives there), refused (policy.allow_link_local)")]
    LinkLocal(IpAddr),
    #[error(
        "{0} is an address of this relay's host, refused to a client from another host (policy.allow_host_addresses)"
    )]
    HostAddress(IpAddr),
    #[error("{0} is a multicast or broadcast address: never dialed")]
    Multicast(IpAddr),
    #[error(
        "client {0} is a relay (a [[peer]] or an upstream relay): proxy requests nested through relays are refused (policy.allow_relay_clients)"
    )]
    Nesting(IpAddr),
    #[error("{0} is one of this relay's own listeners: refused, the relay would dial itself")]
    SelfDial(SocketAddr),
    #[error(
        "IP hop limit exhausted (arrived with {0}): a routing loop through relays, or a client sending with a TTL of 1"
    )]
    HopLimit(u8),
}

impl Denial {
    /// The bounded metrics label.
    pub fn reason(self) -> DenyReason {
        match self {
            Denial::Port(_) => DenyReason::Port,
            Denial::NotAllowed(_) | Denial::Denied(_) => DenyReason::Destination,
            Denial::Local(_) => DenyReason::Local,
            Denial::LinkLocal(_) => DenyReason::LinkLocal,
            Denial::HostAddress(_) => DenyReason::HostAddress,
            Denial::Multicast(_) => DenyReason::Multicast,
            Denial::Nesting(_) => DenyReason::Nesting,
            Denial::SelfDial(_) => DenyReason::SelfDial,
            Denial::HopLimit(_) => DenyReason::Loop,
        }
    }
}

/// Loopback, and the unspecified addresses (Linux connects `0.0.0.0` and
/// `::` to the local host). `0.0.0.0/8` is "this network": not routable.
pub fn is_host_local(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(a) => a.is_loopback() || a.octets()[0] == 0,
        IpAddr::V6(a) => a.is_loopback() || a.is_unspecified(),
    }
}

/// Link-local (169.254.0.0/16, fe80::/10) and AWS's IPv6 metadata address.
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80 || a == AWS_METADATA_V6,
    }
}

/// Multicast (224.0.0.0/4, ff00::/8) and the IPv4 limited broadcast: TCP
/// cannot use them; refused so no odd kernel path is ever exercised.
pub fn is_multicast_or_broadcast(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(a) => a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_multicast(),
    }
}

/// This host's interface addresses (the network namespace's), read with
/// getifaddrs at start, on every reload and every
/// [`HostAddrs::REFRESH`] by a background task, never per connection: a
/// check is one uncontended read lock and a scan of a few addresses. An
/// address added between two refreshes is not yet refused (at most
/// `REFRESH` late); one removed is refused until the next refresh.
#[derive(Debug)]
pub struct HostAddrs {
    addrs: RwLock<Arc<[IpAddr]>>,
}

impl HostAddrs {
    /// How often the background task reads the addresses again.
    pub const REFRESH: std::time::Duration = std::time::Duration::from_secs(2);

    /// The addresses now; none if they cannot be read (said by `refresh`'s
    /// caller at start).
    pub fn read() -> HostAddrs {
        let h = HostAddrs::fixed(Vec::new());
        let _ = h.refresh();
        h
    }

    /// A fixed set (tests, `--check` of another host's file).
    pub fn fixed(addrs: Vec<IpAddr>) -> HostAddrs {
        HostAddrs {
            addrs: RwLock::new(canonical_set(addrs)),
        }
    }

    /// Reads the interface addresses again; on failure the previous set
    /// stays.
    pub fn refresh(&self) -> Result<usize, splitway_sys::SysError> {
        let fresh = canonical_set(splitway_sys::hops::local_addrs()?);
        let n = fresh.len();
        let mut cur = self.addrs.write().unwrap_or_else(|e| e.into_inner());
        if *cur != fresh {
            *cur = fresh;
        }
        Ok(n)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.addrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ip)
    }

    pub fn snapshot(&self) -> Arc<[IpAddr]> {
        self.addrs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Addresses of upstream relays that authenticated on a peer listener:
/// with the `[[peer]]` addresses, the clients that are relays (a proxy
/// request from one is nesting). Bounded: beyond [`KnownRelays::MAX`]
/// addresses no more are learned (configured peers still count).
#[derive(Debug, Default)]
pub struct KnownRelays {
    addrs: RwLock<std::collections::HashSet<IpAddr>>,
    /// Woken when an address is learned (legs that wait for their
    /// source's first authentication, see `ingress::limit`).
    learned: tokio::sync::Notify,
}

impl KnownRelays {
    pub const MAX: usize = 4096;

    /// Remembers `ip` (an authenticated upstream relay). A read lock when
    /// it is known already: the common case.
    pub fn learn(&self, ip: IpAddr) {
        let ip = ip.to_canonical();
        if self.contains(ip) {
            return;
        }
        let mut set = self.addrs.write().unwrap_or_else(|e| e.into_inner());
        if set.len() < Self::MAX {
            set.insert(ip);
        }
        drop(set);
        self.learned.notify_waiters();
    }

    /// Whether `ip` is known, or becomes known within `within`.
    pub async fn wait_known(&self, ip: IpAddr, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Registered before the check: a learn in between still wakes it.
            let learned = self.learned.notified();
            if self.contains(ip) {
                return true;
            }
            if tokio::time::timeout_at(deadline, learned).await.is_err() {
                return self.contains(ip);
            }
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.addrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ip.to_canonical())
    }
}

fn canonical_set(addrs: Vec<IpAddr>) -> Arc<[IpAddr]> {
    let mut v: Vec<IpAddr> = addrs.into_iter().map(|a| a.to_canonical()).collect();
    v.sort_unstable();
    v.dedup();
    v.into()
}

impl Policy {
    /// Whether `port` may be dialed. Checked before a domain is resolved.
    pub fn check_port(&self, port: u16) -> Result<(), Denial> {
        if self.allow_ports.is_empty() || self.allow_ports.iter().any(|r| r.contains(&port)) {
            Ok(())
        } else {
            Err(Denial::Port(port))
        }
    }

    /// Whether `client` (the immediate peer: an end client, or the
    /// upstream relay on a peer listener) may have `dst` dialed for it.
    /// `host`: this host's own addresses.
    pub fn check_addr(&self, client: IpAddr, dst: IpAddr, host: &HostAddrs) -> Result<(), Denial> {
        let dst = dst.to_canonical();
        if self.deny_destinations.iter().any(|n| n.contains(&dst)) {
            return Err(Denial::Denied(dst));
        }
        if is_multicast_or_broadcast(dst) {
            return Err(Denial::Multicast(dst));
        }
        if !self.allow_link_local && is_link_local(dst) {
            return Err(Denial::LinkLocal(dst));
        }
        // A loopback client could reach these without the relay, with the
        // same user's rights (no user-based firewalling to get around).
        let remote = !client.to_canonical().is_loopback();
        if is_host_local(dst) {
            // Loopback is governed by its own key alone, although it is
            // among the host's addresses too.
            if !self.allow_local_destinations && remote {
                return Err(Denial::Local(dst));
            }
        } else if !self.allow_host_addresses && remote && host.contains(dst) {
            return Err(Denial::HostAddress(dst));
        }
        if !self.allow_destinations.is_empty()
            && !self.allow_destinations.iter().any(|n| n.contains(&dst))
        {
            return Err(Denial::NotAllowed(dst));
        }
        Ok(())
    }

    /// Port and address together, for an already resolved destination.
    pub fn check(&self, client: IpAddr, dst: SocketAddr, host: &HostAddrs) -> Result<(), Denial> {
        self.check_port(dst.port())?;
        self.check_addr(client, dst.ip(), host)
    }

    /// The destinations refused whatever `allow_destinations` says, one
    /// line each, for `relay --check` (`host`: this host's addresses).
    pub fn default_denials(&self, host: &[IpAddr]) -> Vec<String> {
        let mut out = vec![
            "224.0.0.0/4, ff00::/8, 255.255.255.255 (multicast, broadcast): always".to_owned(),
        ];
        let opt = |on: bool, key: &str| {
            if on {
                format!("allowed by policy.{key} = true")
            } else {
                format!("refused (policy.{key} = true allows)")
            }
        };
        out.push(format!(
            "169.254.0.0/16, fe80::/10, {AWS_METADATA_V6} (link-local, cloud metadata): {}",
            opt(self.allow_link_local, "allow_link_local")
        ));
        out.push(format!(
            "127.0.0.0/8, ::1, 0.0.0.0/8, :: (host-local): {}, except to loopback clients",
            opt(self.allow_local_destinations, "allow_local_destinations")
        ));
        let list: Vec<String> = host.iter().map(ToString::to_string).collect();
        out.push(format!(
            "this host's addresses, every port ({}; read again every {} s): {}, except to loopback clients",
            if list.is_empty() { "none read".to_owned() } else { list.join(", ") },
            HostAddrs::REFRESH.as_secs(),
            opt(self.allow_host_addresses, "allow_host_addresses")
        ));
        for n in &self.deny_destinations {
            out.push(format!("{n}: refused (policy.deny_destinations)"));
        }
        out
    }
}

/// Lets one denial log line per second through at `info`; the others go to
/// `debug` and are counted, so a scan cannot flood the log while the
/// operator still sees that denials happen (and how many).
pub struct LogThrottle {
    last_second: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    pub const fn new() -> LogThrottle {
        LogThrottle {
            last_second: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)`: log this one at info, `n` were suppressed since the last
    /// such line. `None`: log at debug.
    pub fn admit(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.admit_at(now)
    }

    fn admit_at(&self, now: u64) -> Option<u64> {
        let last = self.last_second.load(Ordering::Relaxed);
        if now != last
            && self
                .last_second
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new()
    }
}

/// Log lines for refused connections, rate-limited per reason and source
/// prefix (IPv4 /24, IPv6 /64: what one attacker easily holds): the first
/// refusal of a (reason, prefix) is logged, then at most one line per
/// [`RefusalLog::INTERVAL`], carrying how many were not logged since
/// (`suppressed`). A fixed table of [`RefusalLog::SLOTS`] slots keeps
/// memory bounded whatever the number of sources: keys that hash to a slot
/// in use share its line budget and count, and a stale slot is taken over,
/// its unreported count kept for the next line (`suppressed_other`). At
/// most [`RefusalLog::MAX_PER_SECOND`] lines a second pass in all, so many
/// prefixes (IPv6 makes them cheap) cannot flood the log either.
pub struct RefusalLog {
    table: std::sync::Mutex<[Slot; RefusalLog::SLOTS]>,
    /// Counts of evicted slots not yet reported.
    other: AtomicU64,
    /// (second, lines logged in it), packed as second << 16 | lines.
    budget: AtomicU64,
    hasher: std::sync::OnceLock<std::hash::RandomState>,
}

#[derive(Clone, Copy)]
struct Slot {
    reason: &'static str,
    prefix: Option<IpAddr>,
    last_line: u64,
    suppressed: u64,
}

impl Slot {
    const EMPTY: Slot = Slot {
        reason: "",
        prefix: None,
        last_line: 0,
        suppressed: 0,
    };
}

/// What [`RefusalLog::admit`] decided: log this refusal at info with the
/// counts, or at debug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    /// Refusals of this slot not logged since its last line.
    pub suppressed: u64,
    /// Refusals of other, evicted slots that were never reported.
    pub suppressed_other: u64,
}

/// The source prefix a refusal is throttled by.
pub fn source_prefix(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) & 0xffff_ff00).into()),
        v6 => source_host(v6),
    }
}

/// One source host, as per-client state keys it: an IPv4 address, an IPv6
/// /64 (a host picks its addresses from its /64 at will).
pub fn source_host(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

impl RefusalLog {
    pub const SLOTS: usize = 256;
    pub const INTERVAL: u64 = 5;
    pub const MAX_PER_SECOND: u64 = 20;

    pub const fn new() -> RefusalLog {
        RefusalLog {
            table: std::sync::Mutex::new([Slot::EMPTY; RefusalLog::SLOTS]),
            other: AtomicU64::new(0),
            budget: AtomicU64::new(0),
            hasher: std::sync::OnceLock::new(),
        }
    }

    /// A refusal of `client` for `reason`: `Some` to log it at info.
    pub fn admit(&self, reason: &'static str, client: IpAddr) -> Option<Logged> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.admit_at(reason, client, now)
    }

    /// The slot `reason` and `client`'s prefix share with whatever else
    /// hashes there (the table is bounded, so two keys may collide).
    fn slot_of(&self, reason: &'static str, client: IpAddr) -> usize {
        use std::hash::BuildHasher;
        self.hasher
            .get_or_init(std::hash::RandomState::new)
            .hash_one((reason, source_prefix(client))) as usize
            % Self::SLOTS
    }

    fn admit_at(&self, reason: &'static str, client: IpAddr, now: u64) -> Option<Logged> {
        let prefix = source_prefix(client);
        let idx = self.slot_of(reason, client);
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut table[idx];
        let mine = slot.prefix == Some(prefix) && slot.reason == reason;
        let stale = now >= slot.last_line + 2 * Self::INTERVAL;
        if !mine && (slot.prefix.is_none() || stale) {
            // Taken over: what it had not reported is not lost.
            self.other.fetch_add(slot.suppressed, Ordering::Relaxed);
            *slot = Slot {
                reason,
                prefix: Some(prefix),
                last_line: 0,
                suppressed: 0,
            };
        }
        let due = slot.last_line == 0 || now >= slot.last_line + Self::INTERVAL;
        if due && self.take_budget(now) {
            slot.last_line = now;
            let suppressed = std::mem::take(&mut slot.suppressed);
            Some(Logged {
                suppressed,
                suppressed_other: self.other.swap(0, Ordering::Relaxed),
            })
        } else {
            slot.suppressed += 1;
            None
        }
    }

    /// One of the second's [`RefusalLog::MAX_PER_SECOND`] lines.
    fn take_budget(&self, now: u64) -> bool {
        let cur = self.budget.load(Ordering::Relaxed);
        let (second, lines) = (cur >> 16, cur & 0xffff);
        let next = if second == now {
            if lines >= Self::MAX_PER_SECOND {
                return false;
            }
            cur + 1
        } else {
            now << 16 | 1
        };
        self.budget
            .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self::new()
    }
}

/// The refusal log of the process: every listener's refusals.
pub static REFUSALS: RefusalLog = RefusalLog::new();

#[cfg(test)]
mod tests {

    #[tokio::test]
    async fn waiting_for_a_relay_ends_when_it_authenticates_or_at_the_deadline() {
        use std::time::Duration;
        let known = std::sync::Arc::new(KnownRelays::default());
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let learner = known.clone();
        let learn = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            learner.learn(ip);
        });
        let started = std::time::Instant::now();
        assert!(known.wait_known(ip, Duration::from_secs(5)).await);
        assert!(started.elapsed() < Duration::from_secs(2));
        learn.await.unwrap();
        let other: IpAddr = "192.0.2.10".parse().unwrap();
        assert!(!known.wait_known(other, Duration::from_millis(30)).await);
    }
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    const REMOTE: &str = "192.0.2.50";

    fn none() -> HostAddrs {
        HostAddrs::fixed(Vec::new())
    }

    #[test]
    fn default_denies_link_local_multicast_and_host_addresses() {
        let host = HostAddrs::fixed(vec![ip("10.0.1.2"), ip("fd00:1::2"), ip("127.0.0.1")]);
        let p = Policy::default();
        for (dst, why) in [
            ("169.254.169.254", DenyReason::LinkLocal),
            ("::ffff:169.254.169.254", DenyReason::LinkLocal),
            ("fe80::1", DenyReason::LinkLocal),
            ("febf::1", DenyReason::LinkLocal),
            ("fd00:ec2::254", DenyReason::LinkLocal),
            ("224.0.0.1", DenyReason::Multicast),
            ("239.255.255.250", DenyReason::Multicast),
            ("255.255.255.255", DenyReason::Multicast),
            ("ff02::1", DenyReason::Multicast),
            ("10.0.1.2", DenyReason::HostAddress),
            ("::ffff:10.0.1.2", DenyReason::HostAddress),
            ("fd00:1::2", DenyReason::HostAddress),
        ] {
            assert_eq!(
                p.check_addr(ip(REMOTE), ip(dst), &host)
                    .map_err(Denial::reason),
                Err(why),
                "{dst}"
            );
        }
        for ok in [
            "10.0.1.3",
            "fec0::1",
            "fd00:ec2::253",
            "169.253.255.255",
            "203.0.113.9",
        ] {
            assert_eq!(p.check_addr(ip(REMOTE), ip(ok), &host), Ok(()), "{ok}");
        }
        // A loopback client reaches the host's addresses without us, but
        // not link-local: metadata may be firewalled by user.
        assert_eq!(p.check_addr(ip("127.0.0.1"), ip("10.0.1.2"), &host), Ok(()));
        // Loopback, although among the host's addresses, has its own key.
        let local_ok = Policy {
            allow_local_destinations: true,
            ..Policy::default()
        };
        assert_eq!(
            local_ok.check_addr(ip(REMOTE), ip("127.0.0.1"), &host),
            Ok(())
        );
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("127.0.0.1"), &host),
            Err(Denial::Local(ip("127.0.0.1")))
        );
        assert_eq!(
            p.check_addr(ip("::1"), ip("169.254.169.254"), &host),
            Err(Denial::LinkLocal(ip("169.254.169.254")))
        );
        // The opt-ins; allow_destinations still restricts, multicast stays.
        let open = Policy {
            allow_link_local: true,
            allow_host_addresses: true,
            allow_destinations: nets(&["169.254.0.0/16", "10.0.1.2/32", "224.0.0.0/4"]),
            ..Policy::default()
        };
        assert_eq!(
            open.check_addr(ip(REMOTE), ip("169.254.169.254"), &host),
            Ok(())
        );
        assert_eq!(open.check_addr(ip(REMOTE), ip("10.0.1.2"), &host), Ok(()));
        assert_eq!(
            open.check_addr(ip(REMOTE), ip("fe80::1"), &host),
            Err(Denial::NotAllowed(ip("fe80::1")))
        );
        assert_eq!(
            open.check_addr(ip(REMOTE), ip("224.0.0.1"), &host),
            Err(Denial::Multicast(ip("224.0.0.1")))
        );
    }

    #[test]
    fn host_addresses_are_read_from_the_interfaces() {
        let h = HostAddrs::read();
        assert!(h.refresh().expect("getifaddrs") >= 1, "at least loopback");
        assert!(h.contains(ip("127.0.0.1")));
        assert!(h.contains(ip("::ffff:127.0.0.1")));
        assert!(!h.contains(ip("192.0.2.255")));
    }

    #[test]
    fn default_allows_everything_but_local_to_remote_clients() {
        let p = Policy::default();
        assert_eq!(
            p.check(ip(REMOTE), "203.0.113.9:443".parse().unwrap(), &none()),
            Ok(())
        );
        for local in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "::1",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(
                p.check_addr(ip(REMOTE), ip(local), &none())
                    .map_err(Denial::reason),
                Err(DenyReason::Local),
                "{local}"
            );
            // A loopback client could reach it without us.
            assert_eq!(
                p.check_addr(ip("127.0.0.1"), ip(local), &none()),
                Ok(()),
                "{local}"
            );
            assert_eq!(
                p.check_addr(ip("::ffff:127.0.0.1"), ip(local), &none()),
                Ok(())
            );
        }
        let open = Policy {
            allow_local_destinations: true,
            ..Policy::default()
        };
        assert_eq!(
            open.check_addr(ip(REMOTE), ip("127.0.0.1"), &none()),
            Ok(())
        );
    }

    #[test]
    fn deny_wins_over_allow_and_allow_restricts() {
        let p = Policy {
            allow_destinations: nets(&["10.0.0.0/8", "192.0.2.7/32", "::1/128"]),
            deny_destinations: nets(&["10.9.0.0/16"]),
            ..Policy::default()
        };
        assert_eq!(p.check_addr(ip(REMOTE), ip("10.1.2.3"), &none()), Ok(()));
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("::ffff:10.1.2.3"), &none()),
            Ok(())
        );
        assert_eq!(p.check_addr(ip(REMOTE), ip("192.0.2.7"), &none()), Ok(()));
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("10.9.0.1"), &none()),
            Err(Denial::Denied(ip("10.9.0.1")))
        );
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("192.0.2.8"), &none()),
            Err(Denial::NotAllowed(ip("192.0.2.8")))
        );
        // Listed, but still host-local for a remote client.
        assert_eq!(
            p.check_addr(ip(REMOTE), ip("::1"), &none()),
            Err(Denial::Local(ip("::1")))
        );
        assert_eq!(p.check_addr(ip("::1"), ip("::1"), &none()), Ok(()));
    }

    #[test]
    fn ports_and_ranges() {
        let p = Policy {
            allow_ports: vec![80..=80, 443..=443, 8000..=8100],
            ..Policy::default()
        };
        for ok in [80, 443, 8000, 8050, 8100] {
            assert_eq!(p.check_port(ok), Ok(()), "{ok}");
        }
        for bad in [1, 79, 81, 7999, 8101, 65535] {
            assert_eq!(p.check_port(bad), Err(Denial::Port(bad)), "{bad}");
        }
        assert_eq!(
            p.check(ip(REMOTE), "203.0.113.1:22".parse().unwrap(), &none()),
            Err(Denial::Port(22))
        );
    }

    #[test]
    fn refusals_are_logged_once_per_interval_per_reason_and_prefix() {
        // Each key below in a slot of its own: with a random hasher, two of
        // them share one in about 2 % of runs, and then one is suppressed
        // under the other's line (what the bounded-memory test covers).
        let keys = [
            ("client", "192.0.2.1"),
            ("port", "192.0.2.1"),
            ("client", "192.0.3.1"),
            ("client", "2001:db8::1"),
        ];
        let log = std::iter::repeat_with(RefusalLog::new)
            .find(|log| {
                let mut slots: Vec<usize> =
                    keys.iter().map(|&(r, a)| log.slot_of(r, ip(a))).collect();
                slots.sort_unstable();
                slots.dedup();
                slots.len() == keys.len()
            })
            .expect("an endless supply of hashers");
        let t = 1_000;
        let logged = |s, o| {
            Some(Logged {
                suppressed: s,
                suppressed_other: o,
            })
        };
        assert_eq!(log.admit_at("client", ip("192.0.2.1"), t), logged(0, 0));
        // Same /24, same reason: suppressed and counted.
        for n in 0..1999u64 {
            let a = IpAddr::V4((0xc000_0200 + (n % 256) as u32).into());
            assert_eq!(log.admit_at("client", a, t + n / 1000), None);
        }
        // Another reason or prefix has its own line.
        assert_eq!(log.admit_at("port", ip("192.0.2.1"), t), logged(0, 0));
        assert_eq!(log.admit_at("client", ip("192.0.3.1"), t), logged(0, 0));
        assert_eq!(log.admit_at("client", ip("2001:db8::1"), t), logged(0, 0));
        assert_eq!(log.admit_at("client", ip("2001:db8::ffff:1"), t), None);
        // After the interval: one line with the count.
        let later = t + RefusalLog::INTERVAL;
        assert_eq!(
            log.admit_at("client", ip("192.0.2.9"), later),
            logged(1999, 0)
        );
        assert_eq!(log.admit_at("client", ip("192.0.2.9"), later), None);
    }

    #[test]
    fn refusal_lines_are_bounded_per_second_and_memory_is_fixed() {
        let log = RefusalLog::new();
        let t = 5_000;
        // 10,000 IPv6 /64s in one second: at most MAX_PER_SECOND lines.
        let lines = (0..10_000u128)
            .filter(|n| {
                let a = IpAddr::V6((0x2001_0db8_0000_0000_0000_0000_0000_0001 + (n << 64)).into());
                log.admit_at("auth_failed", a, t).is_some()
            })
            .count() as u64;
        assert_eq!(lines, RefusalLog::MAX_PER_SECOND);
        // Stale slots taken over later report what they held; no count
        // exceeds the refusals made (20,000 in all).
        let reported: u64 = (0..10_000u128)
            .filter_map(|n| {
                let a = IpAddr::V6((0x2001_0db9_0000_0000_0000_0000_0000_0001 + (n << 64)).into());
                log.admit_at("port", a, t + 100 + (n as u64 / 20))
            })
            .map(|l| l.suppressed + l.suppressed_other)
            .sum();
        assert!(
            reported >= 10_000 - lines && reported < 20_000,
            "{reported}"
        );
        assert_eq!(source_prefix(ip("10.1.2.3")), ip("10.1.2.0"));
        assert_eq!(
            source_prefix(ip("2001:db8:1:2:3:4:5:6")),
            ip("2001:db8:1:2::")
        );
    }

    #[test]
    fn throttle_admits_one_per_second_and_counts_the_rest() {
        let t = LogThrottle::new();
        assert_eq!(t.admit_at(100), Some(0));
        assert_eq!(t.admit_at(100), None);
        assert_eq!(t.admit_at(100), None);
        assert_eq!(t.admit_at(101), Some(2));
        assert_eq!(t.admit_at(101), None);
        assert_eq!(t.admit_at(105), Some(1));
    }
}
