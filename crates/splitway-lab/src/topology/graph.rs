//! Topologies beyond chains: named hosts joined by named links, any shape
//! (a detour, a triangle, a mesh).
//!
//! # Addressing and routing
//!
//! Host `h` (0-based, in spec order) owns `10.78.0.(h+1)/32` on its
//! loopback: its address, the same from every neighbour. Link `j` is a pair
//! of TUN devices `gl<j>` in its two hosts, with `10.77.j.1/24` on the first
//! host named in `between` and `10.77.j.2/24` on the second.
//!
//! Each host routes every other host's address over its first link on a
//! path with the fewest links, ties broken by the lowest configured RTT,
//! then by link order, with its own address as the source. So a host with a
//! direct link to the server reaches it directly, and a detour exists only
//! where a relay makes it (the point of the path-choice scenario). Routes
//! are fixed at build time: a link taken down (loss 1) stays routed, as a
//! far-away failure would.
//!
//! Every host forwards (ip_forward), rp_filter is off and TCP buffers allow
//! 64 MiB, as in a chain. Devices: MTU 1500, txqueuelen 10000.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;
use splitway_sys::netns::{self, Netns};

use super::{EmuOptions, LinkSpec, MTU, TXQUEUELEN, open_tun};
use crate::emu::rng::Rng;
use crate::emu::{EmuError, LinkConfig, LinkHandle};

/// One link of a graph: `a` and `b` index `GraphSpec::hosts`; the spec's
/// "client→server" direction is a→b.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphLink {
    pub name: String,
    pub a: usize,
    pub b: usize,
    pub spec: LinkSpec,
}

/// Hosts and the links between them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphSpec {
    pub hosts: Vec<String>,
    pub links: Vec<GraphLink>,
}

impl GraphSpec {
    fn validate(&self) -> Result<(), EmuError> {
        let bad = |m: String| Err(EmuError::Spec(m));
        if self.hosts.len() < 2 || self.hosts.len() > 250 {
            return bad("a graph needs 2 to 250 hosts".into());
        }
        if self.links.is_empty() || self.links.len() > 255 {
            return bad("a graph needs 1 to 255 links".into());
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if self.hosts[..i].contains(h) {
                return bad(format!("host name {h:?} used twice"));
            }
        }
        for (j, l) in self.links.iter().enumerate() {
            if l.a >= self.hosts.len() || l.b >= self.hosts.len() || l.a == l.b {
                return bad(format!("link {:?} joins no two distinct hosts", l.name));
            }
            if self.links[..j].iter().any(|o| o.name == l.name) {
                return bad(format!("link name {:?} used twice", l.name));
            }
            l.spec.validate(j)?;
        }
        let island = (0..self.hosts.len()).find(|&h| {
            let hops = self.next_hops(h);
            (0..hops.len()).any(|t| t != h && hops[t].is_none())
        });
        if let Some(h) = island {
            return bad(format!(
                "host {:?} cannot reach every other host",
                self.hosts[h]
            ));
        }
        Ok(())
    }

    /// Per destination host: the link `from` sends on (None: itself or
    /// unreachable). Fewest links first, then lowest summed RTT, then link
    /// order.
    pub fn next_hops(&self, from: usize) -> Vec<Option<usize>> {
        let n = self.hosts.len();
        // (hops, rtt ns, first link) per host.
        let mut best: Vec<Option<(usize, u128, usize)>> = vec![None; n];
        best[from] = Some((0, 0, usize::MAX));
        // Breadth first by hops; within a hop count a host may be improved
        // (lower RTT) before any of its successors is expanded, since all
        // of one level is relaxed before the next starts.
        let mut level = vec![from];
        while !level.is_empty() {
            let mut next_level: Vec<usize> = Vec::new();
            for &h in &level {
                let (hops, rtt, first) = best[h].expect("visited");
                for (j, l) in self.links.iter().enumerate() {
                    let other = if l.a == h {
                        l.b
                    } else if l.b == h {
                        l.a
                    } else {
                        continue;
                    };
                    let cand = (
                        hops + 1,
                        rtt + l.spec.effective_rtt().as_nanos(),
                        if h == from { j } else { first },
                    );
                    match best[other] {
                        None => {
                            best[other] = Some(cand);
                            next_level.push(other);
                        }
                        Some(old) if old.0 == cand.0 && (cand.1, cand.2) < (old.1, old.2) => {
                            best[other] = Some(cand);
                        }
                        Some(_) => {}
                    }
                }
            }
            level = next_level;
        }
        (0..n)
            .map(|t| {
                if t == from {
                    None
                } else {
                    best[t].map(|b| b.2)
                }
            })
            .collect()
    }
}

/// Address of host `h`.
pub fn host_v4(h: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78, 0, h as u8 + 1)
}

fn dev(j: usize) -> String {
    format!("gl{j}")
}

/// One host of a graph.
#[derive(Debug)]
pub struct GraphHost {
    name: String,
    netns: Netns,
    addr: Ipv4Addr,
}

impl GraphHost {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The host's address, reachable from every other host.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }
}

#[derive(Debug)]
struct GLink {
    handle: LinkHandle,
    /// What the link emulates now (a down link keeps its spec here).
    spec: LinkSpec,
    down: bool,
}

/// A built graph. Dropping it stops the link threads and removes every
/// namespace, also while unwinding.
#[derive(Debug)]
pub struct Graph {
    // Links (threads holding the TUN fds) drop before the namespaces.
    links: Vec<GLink>,
    hosts: Vec<GraphHost>,
    spec: GraphSpec,
}

impl Graph {
    /// Builds the graph; namespaces are `netns::unique_name(prefix)`, and
    /// leftovers of dead runs with the same prefix are removed first.
    pub fn build(spec: &GraphSpec, prefix: &str, options: &EmuOptions) -> Result<Graph, EmuError> {
        spec.validate()?;
        netns::remove_stale(prefix);
        let mut hosts = Vec::with_capacity(spec.hosts.len());
        for (h, name) in spec.hosts.iter().enumerate() {
            let netns = Netns::create(&netns::unique_name(prefix))?;
            netns.exec(
                "sysctl",
                &[
                    "-q",
                    "-w",
                    "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0",
                    "net.ipv4.ip_forward=1",
                    "net.ipv4.tcp_rmem=4096 131072 67108864",
                    "net.ipv4.tcp_wmem=4096 16384 67108864",
                ],
            )?;
            let addr = host_v4(h);
            netns.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"])?;
            hosts.push(GraphHost {
                name: name.clone(),
                netns,
                addr,
            });
        }
        let base_seed = options.seed.unwrap_or_else(Rng::random_seed);
        let mut links = Vec::with_capacity(spec.links.len());
        for (j, l) in spec.links.iter().enumerate() {
            let a_tun = open_tun(&hosts[l.a].netns, &dev(j))?;
            let b_tun = open_tun(&hosts[l.b].netns, &dev(j))?;
            for (h, side) in [(l.a, 1u8), (l.b, 2)] {
                let ns = &hosts[h].netns;
                ns.ip(&[
                    "link",
                    "set",
                    "dev",
                    &dev(j),
                    "mtu",
                    &MTU.to_string(),
                    "txqueuelen",
                    &TXQUEUELEN.to_string(),
                    "up",
                ])?;
                ns.ip(&[
                    "addr",
                    "add",
                    &format!("10.77.{j}.{side}/24"),
                    "dev",
                    &dev(j),
                ])?;
            }
            let (forward, reverse) = l.spec.direction_params();
            let (initial_buffers, max_buffers) = l.spec.buffer_budget();
            let seed = base_seed ^ ((j as u64 + 1) << 48);
            let config = LinkConfig {
                name: l.name.clone(),
                forward,
                reverse,
                seeds: (seed, seed ^ 0x5555_5555_5555_5555),
                initial_buffers,
                max_buffers,
                realtime: !options.no_realtime,
                release_quantum_ns: options.release_quantum_ns,
            };
            links.push(GLink {
                handle: LinkHandle::spawn(config, a_tun, b_tun)?,
                spec: l.spec.clone(),
                down: false,
            });
        }
        for (h, host) in hosts.iter().enumerate() {
            for (t, hop) in spec.next_hops(h).into_iter().enumerate() {
                let Some(j) = hop else { continue };
                host.netns.ip(&[
                    "route",
                    "add",
                    &format!("{}/32", host_v4(t)),
                    "dev",
                    &dev(j),
                    "src",
                    &host.addr.to_string(),
                ])?;
            }
        }
        Ok(Graph {
            links,
            hosts,
            spec: spec.clone(),
        })
    }

    pub fn hosts(&self) -> &[GraphHost] {
        &self.hosts
    }

    pub fn host(&self, name: &str) -> Option<&GraphHost> {
        self.hosts.iter().find(|h| h.name == name)
    }

    fn index(&self, link: &str) -> Result<usize, EmuError> {
        self.spec
            .links
            .iter()
            .position(|l| l.name == link)
            .ok_or_else(|| EmuError::Spec(format!("no link {link:?}")))
    }

    /// What link `name` emulates now (its spec while down), and whether it is down.
    pub fn link(&self, name: &str) -> Result<(&LinkSpec, bool), EmuError> {
        let j = self.index(name)?;
        Ok((&self.links[j].spec, self.links[j].down))
    }

    /// Changes link `name` live: packets in flight keep their schedule.
    /// A down link stays down with the new spec kept for `set_up`.
    pub fn set_link(&mut self, name: &str, spec: LinkSpec) -> Result<(), EmuError> {
        let j = self.index(name)?;
        spec.validate(j)?;
        self.links[j].spec = spec;
        self.apply(j);
        Ok(())
    }

    /// Takes link `name` down (every packet dropped, both ways) or up.
    pub fn set_up(&mut self, name: &str, up: bool) -> Result<(), EmuError> {
        let j = self.index(name)?;
        self.links[j].down = !up;
        self.apply(j);
        Ok(())
    }

    fn apply(&self, j: usize) {
        let link = &self.links[j];
        let (mut f, mut r) = link.spec.direction_params();
        if link.down {
            f.loss = 1.0;
            r.loss = 1.0;
        }
        let (_, max_buffers) = link.spec.buffer_budget();
        link.handle.set_params(f, r, max_buffers);
    }

    /// Per link: name, packets in, packets dropped (configured loss and
    /// queue overflow, and the emulator's own drops, both ways) and the
    /// worse direction's release lateness p99 in µs.
    pub fn link_summaries(&self) -> Vec<LinkSummary> {
        self.spec
            .links
            .iter()
            .zip(&self.links)
            .map(|(s, l)| {
                let f = l.handle.forward().snapshot();
                let r = l.handle.reverse().snapshot();
                LinkSummary {
                    name: s.name.clone(),
                    between: [self.spec.hosts[s.a].clone(), self.spec.hosts[s.b].clone()],
                    rtt_ms: l.spec.effective_rtt().as_secs_f64() * 1e3,
                    down: l.down,
                    packets: f.packets_in + r.packets_in,
                    dropped_configured: f.dropped_loss
                        + f.dropped_queue
                        + r.dropped_loss
                        + r.dropped_queue,
                    dropped_emulator: f.dropped_no_buffer
                        + f.write_failures
                        + r.dropped_no_buffer
                        + r.write_failures,
                    lateness_p99_us: f.lateness.p99_us.max(r.lateness.p99_us),
                    realtime: l.handle.realtime(),
                }
            })
            .collect()
    }
}

/// What one link counted, for a run's record.
#[derive(Debug, Clone, Serialize)]
pub struct LinkSummary {
    pub name: String,
    pub between: [String; 2],
    pub rtt_ms: f64,
    pub down: bool,
    pub packets: u64,
    pub dropped_configured: u64,
    /// Not configured: the emulator itself dropped (buffers, TUN writes).
    pub dropped_emulator: u64,
    pub lateness_p99_us: f64,
    pub realtime: bool,
}

impl Drop for Graph {
    fn drop(&mut self) {
        for link in &mut self.links {
            link.handle.stop();
        }
    }
}

/// Duration helper for specs built in code.
pub fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, a: usize, b: usize, rtt: f64) -> GraphLink {
        GraphLink {
            name: name.into(),
            a,
            b,
            spec: LinkSpec::symmetric(ms(rtt)),
        }
    }

    #[test]
    fn fewest_links_first_then_lowest_rtt() {
        // 0 client, 1 rc, 2 rs1, 3 server: rc—server direct (200 ms) and
        // rc—rs1—server (40 + 5 ms): rc goes direct (one link).
        let g = GraphSpec {
            hosts: ["client", "rc", "rs1", "server"].map(String::from).to_vec(),
            links: vec![
                link("access", 0, 1, 1.0),
                link("direct", 1, 3, 200.0),
                link("rc-rs1", 1, 2, 40.0),
                link("rs1-server", 2, 3, 5.0),
            ],
        };
        assert!(g.validate().is_ok());
        assert_eq!(g.next_hops(1), [Some(0), None, Some(2), Some(1)]);
        assert_eq!(g.next_hops(0), [None, Some(0), Some(0), Some(0)]);
        // rs1 to the client: via rc (2 links), not via the server (3).
        assert_eq!(g.next_hops(2)[0], Some(2));
        assert_eq!(g.next_hops(3)[0], Some(1));
    }

    #[test]
    fn equal_hops_prefer_the_faster_link() {
        // A square 0—1—3 and 0—2—3: 0 reaches 3 via the faster side.
        let g = GraphSpec {
            hosts: ["a", "b", "c", "d"].map(String::from).to_vec(),
            links: vec![
                link("ab", 0, 1, 50.0),
                link("ac", 0, 2, 10.0),
                link("bd", 1, 3, 10.0),
                link("cd", 2, 3, 10.0),
            ],
        };
        assert_eq!(g.next_hops(0)[3], Some(1));
    }

    #[test]
    fn validation_rejects_islands_and_duplicates() {
        let g = GraphSpec {
            hosts: ["a", "b", "c"].map(String::from).to_vec(),
            links: vec![link("ab", 0, 1, 1.0)],
        };
        assert!(g.validate().is_err(), "c is unreachable");
        let g = GraphSpec {
            hosts: ["a", "b"].map(String::from).to_vec(),
            links: vec![link("x", 0, 1, 1.0), link("x", 1, 0, 1.0)],
        };
        assert!(g.validate().is_err(), "link name twice");
        let g = GraphSpec {
            hosts: ["a", "b"].map(String::from).to_vec(),
            links: vec![link("x", 0, 0, 1.0)],
        };
        assert!(g.validate().is_err(), "a loop");
    }
}
