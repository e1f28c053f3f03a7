//! A chain of hosts (`client`, relays…, `server`), one network namespace
//! each, joined by emulated links.
//!
//! # Addressing plan
//!
//! Link `i` (0-based, between host `i` on the client side and host `i+1` on
//! the server side) is a pair of TUN devices: `wan-r` in the left host (its
//! device towards the server) and `wan-l` in the right host (towards the
//! client). Addresses:
//!
//! | link i | left host (`wan-r`) | right host (`wan-l`) |
//! |---|---|---|
//! | IPv4 | `10.77.i.1/24` | `10.77.i.2/24` |
//! | IPv6 (best effort) | `fd77:i::1/64` | `fd77:i::2/64` |
//!
//! (`i` in decimal for IPv4, hex for IPv6; at most 255 links.) Each host
//! routes the subnets of links further right via `wan-r` and further left
//! via `wan-l`, so every host reaches every address along the chain; middle
//! hosts forward (ip_forward, IPv6 forwarding), rp_filter is off everywhere,
//! and TCP buffers allow 64 MiB so BDPs of long links fit.
//!
//! Devices: MTU 1500, txqueuelen 10000, no `IFF_VNET_HDR`.
//!
//! # Link semantics
//!
//! A `LinkSpec` applies to both directions: delay is `rtt / 2` each way
//! unless `one_way` gives (client→server, server→client); `loss` is the
//! probability of dropping a packet, drawn independently **in each
//! direction** (so a round trip sees about twice the loss), unless
//! `loss_one_way` gives one probability per direction; `rate_mbit`
//! caps each direction separately, counting whole IP packets; `queue` bounds
//! the drop-tail queue in front of that rate cap (ignored without a cap).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use splitway_sys::netns::{self, Netns};
use splitway_sys::tun::Tun;

pub mod graph;

use crate::emu::rng::Rng;
use crate::emu::stats::{EmuStats, LinkStats, TunCounters};
use crate::emu::{DirectionParams, EmuError, LinkConfig, LinkHandle, QueueBound};

/// TUN device of a host towards the client.
pub const DEV_LEFT: &str = "wan-l";
/// TUN device of a host towards the server.
pub const DEV_RIGHT: &str = "wan-r";
/// Device MTU: loss and serialisation act on real 1500-byte packets.
pub const MTU: u32 = 1500;
/// TUN txqueuelen; the default 500 overflows on bursts.
pub const TXQUEUELEN: u32 = 10_000;

/// Bound of the drop-tail queue in front of a rate cap.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub enum QueueLimit {
    /// Twice the bandwidth-delay product (rate × RTT), at least 64 packets.
    #[default]
    Auto,
    Packets(usize),
    /// Queueing delay ahead of an arriving packet.
    Time(Duration),
}

/// One emulated link, both directions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkSpec {
    pub rtt: Duration,
    /// (client→server, server→client) one-way delays; overrides `rtt`.
    pub one_way: Option<(Duration, Duration)>,
    /// Uniform jitter in ±`jitter` around each one-way delay, without
    /// reordering (releases stay FIFO).
    pub jitter: Duration,
    /// Per-direction drop probability in [0, 1].
    pub loss: f64,
    /// (client→server, server→client) drop probabilities; overrides `loss`
    /// (e.g. loss of data only, as a one-way NistNet rule drops).
    pub loss_one_way: Option<(f64, f64)>,
    /// Per-direction rate cap of IP packets, Mbit/s (10^6 bit/s).
    pub rate_mbit: Option<f64>,
    pub queue: QueueLimit,
}

impl Default for LinkSpec {
    fn default() -> Self {
        LinkSpec::symmetric(Duration::ZERO)
    }
}

impl LinkSpec {
    /// A link with `rtt` split evenly, no jitter, loss or rate cap.
    pub fn symmetric(rtt: Duration) -> LinkSpec {
        LinkSpec {
            rtt,
            one_way: None,
            jitter: Duration::ZERO,
            loss: 0.0,
            loss_one_way: None,
            rate_mbit: None,
            queue: QueueLimit::Auto,
        }
    }

    /// A link with different delays per direction.
    pub fn asymmetric(client_to_server: Duration, server_to_client: Duration) -> LinkSpec {
        LinkSpec {
            rtt: client_to_server + server_to_client,
            one_way: Some((client_to_server, server_to_client)),
            ..LinkSpec::symmetric(Duration::ZERO)
        }
    }

    /// The usual WAN leg: RTT, per-direction loss and a rate cap with an
    /// automatic (2×BDP) queue.
    pub fn wan(rtt: Duration, loss: f64, rate_mbit: f64) -> LinkSpec {
        LinkSpec::symmetric(rtt)
            .with_loss(loss)
            .with_rate(rate_mbit)
    }

    pub fn with_loss(mut self, loss: f64) -> LinkSpec {
        self.loss = loss;
        self
    }

    pub fn with_rate(mut self, rate_mbit: f64) -> LinkSpec {
        self.rate_mbit = Some(rate_mbit);
        self
    }

    pub fn with_queue(mut self, queue: QueueLimit) -> LinkSpec {
        self.queue = queue;
        self
    }

    pub fn with_jitter(mut self, jitter: Duration) -> LinkSpec {
        self.jitter = jitter;
        self
    }

    /// (client→server, server→client) one-way delays.
    pub fn one_way_delays(&self) -> (Duration, Duration) {
        self.one_way
            .unwrap_or((self.rtt / 2, self.rtt - self.rtt / 2))
    }

    /// (client→server, server→client) drop probabilities.
    pub fn one_way_losses(&self) -> (f64, f64) {
        self.loss_one_way.unwrap_or((self.loss, self.loss))
    }

    /// Round-trip propagation delay.
    pub fn effective_rtt(&self) -> Duration {
        let (a, b) = self.one_way_delays();
        a + b
    }

    fn validate(&self, index: usize) -> Result<(), EmuError> {
        let bad = |what: String| Err(EmuError::Spec(format!("link {index}: {what}")));
        let (to_server, to_client) = self.one_way_losses();
        for loss in [to_server, to_client] {
            if !(0.0..=1.0).contains(&loss) {
                return bad(format!("loss {loss} not in [0, 1]"));
            }
        }
        if let Some(r) = self.rate_mbit
            && !(r.is_finite() && r > 0.0)
        {
            return bad(format!("rate {r} Mbit/s must be positive"));
        }
        if matches!(self.queue, QueueLimit::Packets(0)) {
            return bad("queue of 0 packets".into());
        }
        Ok(())
    }

    /// Per-direction emulator parameters (client→server, server→client).
    pub fn direction_params(&self) -> (DirectionParams, DirectionParams) {
        let (fwd, rev) = self.one_way_delays();
        let rate_bps = self.rate_mbit.map(|m| m * 1e6);
        let queue = match (self.queue, rate_bps) {
            (_, None) => QueueBound::Packets(usize::MAX),
            (QueueLimit::Packets(n), _) => QueueBound::Packets(n),
            (QueueLimit::Time(d), _) => QueueBound::Nanos(d.as_nanos() as u64),
            (QueueLimit::Auto, Some(bps)) => {
                let bdp_bytes = bps / 8.0 * self.effective_rtt().as_secs_f64();
                QueueBound::Packets(((2.0 * bdp_bytes / MTU as f64).ceil() as usize).max(64))
            }
        };
        let (loss_fwd, loss_rev) = self.one_way_losses();
        let mk = |delay: Duration, loss: f64| DirectionParams {
            delay_ns: delay.as_nanos() as u64,
            jitter_ns: self.jitter.as_nanos() as u64,
            loss,
            rate_bps,
            queue,
        };
        (mk(fwd, loss_fwd), mk(rev, loss_rev))
    }

    /// Packet buffers one direction may need: what is in flight at the rate
    /// (or an assumed 4 Gbit/s without a cap) over the delay, plus the queue,
    /// times two.
    pub(crate) fn buffer_budget(&self) -> (usize, usize) {
        let (fwd, rev) = self.one_way_delays();
        let longest = fwd.max(rev) + self.jitter;
        let bps = self.rate_mbit.map_or(4e9, |m| m * 1e6);
        let in_flight = bps / 8.0 * longest.as_secs_f64() / MTU as f64;
        let queue = match self.direction_params().0.queue {
            QueueBound::Packets(n) if n != usize::MAX => n as f64,
            QueueBound::Nanos(ns) => bps / 8.0 * ns as f64 / 1e9 / MTU as f64,
            _ => 0.0,
        };
        let max = ((2.0 * (in_flight + queue)) as usize).clamp(4096, 131_072);
        (1024.min(max), max)
    }
}

/// A chain of hosts joined by `hosts.len() - 1` links.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChainSpec {
    /// "client", "r1", …, "server": first is the client, last the server.
    pub hosts: Vec<String>,
    pub links: Vec<LinkSpec>,
}

impl ChainSpec {
    /// `client`, `r1`…`rN`, `server` with one link per gap.
    pub fn chain(links: Vec<LinkSpec>) -> ChainSpec {
        let mut hosts = vec!["client".to_owned()];
        hosts.extend((1..links.len()).map(|i| format!("r{i}")));
        hosts.push("server".to_owned());
        ChainSpec { hosts, links }
    }

    fn validate(&self) -> Result<(), EmuError> {
        if self.hosts.len() < 2 {
            return Err(EmuError::Spec("a chain needs at least two hosts".into()));
        }
        if self.links.len() + 1 != self.hosts.len() {
            return Err(EmuError::Spec(format!(
                "{} hosts need {} links, got {}",
                self.hosts.len(),
                self.hosts.len() - 1,
                self.links.len()
            )));
        }
        if self.links.len() > 255 {
            return Err(EmuError::Spec("at most 255 links".into()));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if self.hosts[..i].contains(h) {
                return Err(EmuError::Spec(format!("host name {h:?} used twice")));
            }
        }
        for (i, l) in self.links.iter().enumerate() {
            l.validate(i)?;
        }
        Ok(())
    }
}

/// Options of the emulator beyond the chain itself.
#[derive(Debug, Clone)]
pub struct EmuOptions {
    /// Seed of the loss/jitter PRNGs (reproducible runs); None: random.
    pub seed: Option<u64>,
    /// Do not try SCHED_FIFO (e.g. to measure the difference).
    pub no_realtime: bool,
    /// Each link's release quantum ([`crate::emu::link::RELEASE_QUANTUM_NS`]).
    pub release_quantum_ns: u64,
}

impl Default for EmuOptions {
    fn default() -> Self {
        EmuOptions {
            seed: None,
            no_realtime: false,
            release_quantum_ns: crate::emu::link::RELEASE_QUANTUM_NS,
        }
    }
}

/// One host of the chain: a namespace and its link addresses.
#[derive(Debug)]
pub struct Host {
    name: String,
    netns: Netns,
    left: Option<(Ipv4Addr, Option<Ipv6Addr>)>,
    right: Option<(Ipv4Addr, Option<Ipv6Addr>)>,
}

impl Host {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// Address on the link towards the client (None for the client).
    pub fn left_addr(&self) -> Option<Ipv4Addr> {
        self.left.map(|a| a.0)
    }

    /// Address on the link towards the server (None for the server).
    pub fn right_addr(&self) -> Option<Ipv4Addr> {
        self.right.map(|a| a.0)
    }

    pub fn left_addr6(&self) -> Option<Ipv6Addr> {
        self.left.and_then(|a| a.1)
    }

    pub fn right_addr6(&self) -> Option<Ipv6Addr> {
        self.right.and_then(|a| a.1)
    }

    /// An address of this host reachable from every other host: the one
    /// towards the client, or for the client its only one.
    pub fn addr(&self) -> Ipv4Addr {
        self.left_addr()
            .or(self.right_addr())
            .expect("every host of a chain has a link")
    }
}

/// Per-link bookkeeping: the thread and where its devices live.
#[derive(Debug)]
struct Link {
    handle: LinkHandle,
    rate_capped: bool,
    spec: LinkSpec,
}

/// A built chain. Dropping it stops the emulator threads and removes every
/// namespace, also while unwinding from a panic.
#[derive(Debug)]
pub struct Topology {
    // Field order matters: links (threads holding the TUN fds) drop before
    // the namespaces.
    links: Vec<Link>,
    hosts: Vec<Host>,
    tun_baseline: Mutex<Vec<(TunCounters, TunCounters)>>,
}

fn link_v4(i: usize, side: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, i as u8, side)
}

fn link_v6(i: usize, side: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd77, i as u16, 0, 0, 0, 0, 0, side)
}

impl Topology {
    /// Builds the chain with a random loss seed and real-time threads.
    pub fn build(spec: &ChainSpec, prefix: &str) -> Result<Topology, EmuError> {
        Topology::build_with(spec, prefix, &EmuOptions::default())
    }

    /// Builds the chain. Namespaces are named `netns::unique_name(prefix)`;
    /// leftovers of dead runs with the same prefix are removed first.
    pub fn build_with(
        spec: &ChainSpec,
        prefix: &str,
        options: &EmuOptions,
    ) -> Result<Topology, EmuError> {
        spec.validate()?;
        netns::remove_stale(prefix);
        let n = spec.hosts.len();

        // Namespaces first; from here on, an error drops whatever exists.
        let mut hosts = Vec::with_capacity(n);
        for (h, name) in spec.hosts.iter().enumerate() {
            let netns = Netns::create(&netns::unique_name(prefix))?;
            let left = (h > 0).then(|| (link_v4(h - 1, 2), Some(link_v6(h - 1, 2))));
            let right = (h + 1 < n).then(|| (link_v4(h, 1), Some(link_v6(h, 1))));
            let forwards = h > 0 && h + 1 < n;
            let mut sysctls = vec![
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.tcp_rmem=4096 131072 67108864",
                "net.ipv4.tcp_wmem=4096 16384 67108864",
            ];
            if forwards {
                sysctls.push("net.ipv4.ip_forward=1");
                sysctls.push("net.ipv6.conf.all.forwarding=1");
            }
            let mut args = vec!["-q", "-w"];
            args.extend(sysctls);
            netns.exec("sysctl", &args)?;
            hosts.push(Host {
                name: name.clone(),
                netns,
                left,
                right,
            });
        }

        let base_seed = options.seed.unwrap_or_else(Rng::random_seed);
        let mut links = Vec::with_capacity(n - 1);
        let mut v6_ok = true;
        for (i, link) in spec.links.iter().enumerate() {
            let left_tun = open_tun(&hosts[i].netns, DEV_RIGHT)?;
            let right_tun = open_tun(&hosts[i + 1].netns, DEV_LEFT)?;
            for (host, dev, side) in [(&hosts[i], DEV_RIGHT, 1u8), (&hosts[i + 1], DEV_LEFT, 2)] {
                host.netns.ip(&[
                    "link",
                    "set",
                    "dev",
                    dev,
                    "mtu",
                    &MTU.to_string(),
                    "txqueuelen",
                    &TXQUEUELEN.to_string(),
                    "up",
                ])?;
                host.netns.ip(&[
                    "addr",
                    "add",
                    &format!("{}/24", link_v4(i, side)),
                    "dev",
                    dev,
                ])?;
                if v6_ok {
                    let r = host.netns.ip(&[
                        "-6",
                        "addr",
                        "add",
                        &format!("{}/64", link_v6(i, side as u16)),
                        "dev",
                        dev,
                        "nodad",
                    ]);
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "no IPv6 in the lab chain");
                        v6_ok = false;
                    }
                }
            }
            let (forward, reverse) = link.direction_params();
            let (initial_buffers, max_buffers) = link.buffer_budget();
            let seed_base = base_seed ^ ((i as u64 + 1) << 48);
            let config = LinkConfig {
                name: format!("{}-{}", spec.hosts[i], spec.hosts[i + 1]),
                forward,
                reverse,
                seeds: (seed_base, seed_base ^ 0x5555_5555_5555_5555),
                initial_buffers,
                max_buffers,
                realtime: !options.no_realtime,
                release_quantum_ns: options.release_quantum_ns,
            };
            links.push(Link {
                handle: LinkHandle::spawn(config, left_tun, right_tun)?,
                rate_capped: link.rate_mbit.is_some(),
                spec: link.clone(),
            });
        }
        if !v6_ok {
            for h in &mut hosts {
                h.left = h.left.map(|(a, _)| (a, None));
                h.right = h.right.map(|(a, _)| (a, None));
            }
        }

        // Routes to the subnets of non-adjacent links.
        for (h, host) in hosts.iter().enumerate() {
            for j in 0..n - 1 {
                let dev = if j > h {
                    DEV_RIGHT
                } else if j + 1 < h {
                    DEV_LEFT
                } else {
                    continue; // adjacent: connected route
                };
                host.netns
                    .ip(&["route", "add", &format!("10.77.{j}.0/24"), "dev", dev])?;
                if v6_ok {
                    host.netns.ip(&[
                        "-6",
                        "route",
                        "add",
                        &format!("{}/64", link_v6(j, 0)),
                        "dev",
                        dev,
                    ])?;
                }
            }
        }

        let topo = Topology {
            links,
            hosts,
            tun_baseline: Mutex::new(Vec::new()),
        };
        topo.reset_stats();
        Ok(topo)
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host called `name`. Panics if there is none (a caller bug).
    pub fn host(&self, name: &str) -> &Host {
        self.get_host(name)
            .unwrap_or_else(|| panic!("no host {name:?} in the lab chain"))
    }

    pub fn get_host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    pub fn client(&self) -> &Host {
        &self.hosts[0]
    }

    pub fn server(&self) -> &Host {
        &self.hosts[self.hosts.len() - 1]
    }

    /// The middle hosts, client side first.
    pub fn relays(&self) -> &[Host] {
        &self.hosts[1..self.hosts.len() - 1]
    }

    pub fn link_spec(&self, index: usize) -> Option<&LinkSpec> {
        self.links.get(index).map(|l| &l.spec)
    }

    /// Changes link `index` live. Packets already in flight keep their
    /// schedule; new packets get the new parameters. Releases stay FIFO, so
    /// after a *shorter* delay the packets queued behind older ones all
    /// become due together and leave as one burst (measured here: ~10 ms
    /// release lateness for 100 ms worth of 100 Mbit/s traffic). Use
    /// `set_link_drained` before measuring.
    pub fn set_link(&mut self, index: usize, spec: LinkSpec) -> Result<(), EmuError> {
        spec.validate(index)?;
        let link = self
            .links
            .get_mut(index)
            .ok_or_else(|| EmuError::Spec(format!("no link {index}")))?;
        let (f, r) = spec.direction_params();
        let (_, max_buffers) = spec.buffer_budget();
        link.handle.set_params(f, r, max_buffers);
        link.rate_capped = spec.rate_mbit.is_some();
        link.spec = spec;
        Ok(())
    }

    /// `set_link`, then waits one old RTT (+50 ms) so packets admitted
    /// under the old parameters are gone, then resets the stats.
    pub fn set_link_drained(&mut self, index: usize, spec: LinkSpec) -> Result<(), EmuError> {
        let old_rtt = self
            .link_spec(index)
            .map_or(Duration::ZERO, LinkSpec::effective_rtt);
        self.set_link(index, spec)?;
        std::thread::sleep(old_rtt + Duration::from_millis(50));
        self.reset_stats();
        Ok(())
    }

    /// A handle that changes link `index` from another thread (see
    /// [`crate::emu::link::LinkControl`]); `set_link`'s record of the spec
    /// is not updated by it.
    pub fn link_control(&self, index: usize) -> Option<crate::emu::link::LinkControl> {
        self.links.get(index).map(|l| l.handle.control())
    }

    /// Everything the emulator counted since the last reset, plus the TUN
    /// devices' kernel drop counters.
    pub fn stats(&self) -> EmuStats {
        let baseline = self
            .tun_baseline
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let links = self
            .links
            .iter()
            .enumerate()
            .map(|(i, link)| {
                let (left, right) = self.tun_counters(i);
                let (bl, br) = baseline.get(i).cloned().unwrap_or_default();
                let forward = link.handle.forward().snapshot();
                let reverse = link.handle.reverse().snapshot();
                let cpu_ms = link.handle.cpu_time().as_secs_f64() * 1e3;
                let packets = forward.packets_in + reverse.packets_in;
                LinkStats {
                    index: i,
                    left: self.hosts[i].name.clone(),
                    right: self.hosts[i + 1].name.clone(),
                    rate_capped: link.rate_capped,
                    realtime: link.handle.realtime(),
                    release_quantum_us: link.handle.release_quantum_ns() as f64 / 1e3,
                    cpu_ms,
                    cpu_us_per_packet: if packets == 0 {
                        0.0
                    } else {
                        cpu_ms * 1e3 / packets as f64
                    },
                    forward,
                    reverse,
                    tun_left: since(left, &bl),
                    tun_right: since(right, &br),
                }
            })
            .collect();
        EmuStats::new(links)
    }

    /// Zeroes the emulator's counters and histograms and takes a new
    /// baseline of the TUN counters.
    pub fn reset_stats(&self) {
        let mut baseline = self
            .tun_baseline
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        baseline.clear();
        for (i, link) in self.links.iter().enumerate() {
            link.handle.reset_counters();
            baseline.push(self.tun_counters(i));
        }
    }

    /// Kernel counters of link `i`'s devices (left host's `wan-r`, right
    /// host's `wan-l`), cumulative.
    fn tun_counters(&self, i: usize) -> (TunCounters, TunCounters) {
        (
            read_tun_counters(&self.hosts[i].netns, DEV_RIGHT),
            read_tun_counters(&self.hosts[i + 1].netns, DEV_LEFT),
        )
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for link in &mut self.links {
            link.handle.stop();
        }
        // `hosts` drop next: each Netns kills leftovers and deletes itself.
    }
}

fn open_tun(ns: &Netns, dev: &str) -> Result<Tun, EmuError> {
    let name = dev.to_owned();
    Ok(ns.run_in(move || Tun::create(&name))??)
}

fn since(now: TunCounters, base: &TunCounters) -> TunCounters {
    let sub = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), b) => Some(a.saturating_sub(b.unwrap_or(0))),
        (None, _) => None,
    };
    TunCounters {
        tx_dropped: sub(now.tx_dropped, base.tx_dropped),
        rx_dropped: sub(now.rx_dropped, base.rx_dropped),
        rx_bytes: sub(now.rx_bytes, base.rx_bytes),
        tx_bytes: sub(now.tx_bytes, base.tx_bytes),
        ..now
    }
}

/// Reads a device's statistics with `ip -j -s link show` inside the
/// namespace (/sys/class/net would show the caller's namespace).
pub fn read_tun_counters(ns: &Netns, dev: &str) -> TunCounters {
    let mut out = TunCounters {
        namespace: ns.name().to_owned(),
        device: dev.to_owned(),
        ..Default::default()
    };
    let parsed = ns
        .ip(&["-j", "-s", "link", "show", "dev", dev])
        .map_err(|e| e.to_string())
        .and_then(|o| {
            serde_json::from_slice::<serde_json::Value>(&o.stdout).map_err(|e| e.to_string())
        });
    match parsed {
        Ok(v) => {
            let s = &v[0]["stats64"];
            out.tx_dropped = s["tx"]["dropped"].as_u64();
            out.rx_dropped = s["rx"]["dropped"].as_u64();
            out.tx_bytes = s["tx"]["bytes"].as_u64();
            out.rx_bytes = s["rx"]["bytes"].as_u64();
        }
        Err(e) => tracing::warn!(netns = %ns.name(), dev, error = %e, "cannot read TUN counters"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_splits_evenly_unless_one_way_given() {
        let l = LinkSpec::symmetric(Duration::from_millis(31));
        let (a, b) = l.one_way_delays();
        assert_eq!(a + b, Duration::from_millis(31));
        let l = LinkSpec::asymmetric(Duration::from_millis(10), Duration::from_millis(30));
        assert_eq!(l.effective_rtt(), Duration::from_millis(40));
        let (f, r) = l.direction_params();
        assert_eq!((f.delay_ns, r.delay_ns), (10_000_000, 30_000_000));
    }

    #[test]
    fn auto_queue_is_twice_bdp() {
        // 100 Mbit/s × 20 ms = 250 kB; ×2 / 1500 = 334 packets.
        let (f, _) = LinkSpec::wan(Duration::from_millis(20), 0.0, 100.0).direction_params();
        assert_eq!(f.queue, QueueBound::Packets(334));
        assert_eq!(f.rate_bps, Some(100e6));
        let (f, _) = LinkSpec::symmetric(Duration::from_millis(20)).direction_params();
        assert_eq!(f.rate_bps, None);
    }

    #[test]
    fn chain_spec_validation() {
        let two = ChainSpec::chain(vec![LinkSpec::default(), LinkSpec::default()]);
        assert_eq!(two.hosts, ["client", "r1", "server"]);
        assert!(two.validate().is_ok());
        let mut bad = two.clone();
        bad.links.pop();
        assert!(bad.validate().is_err());
        let mut bad = two.clone();
        bad.links[1].loss = 1.5;
        assert!(bad.validate().is_err());
        let mut bad = two;
        bad.hosts[1] = "client".into();
        assert!(bad.validate().is_err());
    }
}
