//! What `splitway_resume` learned and did, read from its maps
//! (`bpf/splitway_resume.c`): the saved window per peer (`sw_resume_peers`)
//! and its event counters (`sw_resume_stats`).
//!
//! The algorithm is registered machine-wide and one instance serves every
//! relay on the host, so its maps may belong to another process's
//! registration (and, under `ip netns exec`, no bpf filesystem shares the
//! pinned copy). The maps are therefore found by name among the host's
//! loaded maps, the newest first: what this reads is the host's state, not
//! this process's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use aya::maps::{Array, HashMap, Map, MapData};

const PEERS_MAP: &str = "sw_resume_peers";
const STATS_MAP: &str = "sw_resume_stats";
/// `RESUME_MAX_AGE_NS` in the C: an older entry is not resumed from.
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// `struct resume_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResumeKey {
    pub(crate) family: u32,
    pub(crate) addr: [u32; 4],
}

/// `struct resume_val`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResumeVal {
    pub(crate) cwnd: u32,
    pub(crate) srtt_us: u32,
    pub(crate) at_ns: u64,
    pub(crate) exited_slow_start: u32,
    pub(crate) bdp: u32,
}

/// `struct resume_events`: one counter per `EV_*`, in the C's order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResumeEvents {
    pub(crate) n: [u64; 5],
}

// SAFETY: each is a #[repr(C)] record of unsigned integers with no padding
// (sizes and offsets pinned against the C by `layout`'s test), so every bit
// pattern is a valid value and the bytes the kernel copies are all defined.
unsafe impl aya::Pod for ResumeKey {}
// SAFETY: as above.
unsafe impl aya::Pod for ResumeVal {}
// SAFETY: as above.
unsafe impl aya::Pod for ResumeEvents {}

const AF_INET: u32 = libc::AF_INET as u32;
const AF_INET6: u32 = libc::AF_INET6 as u32;

/// One peer's saved window.
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedWindow {
    pub peer: IpAddr,
    /// The largest final congestion window saved since the last loss.
    pub cwnd_segments: u32,
    /// The path's bandwidth-delay product without its queue (the best
    /// measurement since the last loss), at `min_rtt`.
    pub bdp_segments: u32,
    /// The minimum RTT of the connection that measured the BDP: the
    /// path's, without queueing.
    pub min_rtt: Duration,
    pub age: Duration,
    /// A saving connection left slow start (a loss or HyStart), so the
    /// window is a capacity estimate rather than how far it got.
    pub capacity_estimate: bool,
}

impl LearnedWindow {
    /// The window a new leg whose RTT matches `min_rtt` jumps to: the BDP
    /// capped at the cwnd, or half the cwnd where no delivery rate was
    /// measured (`jump_for` in the C).
    pub fn jump_segments(&self) -> u32 {
        if self.bdp_segments == 0 {
            self.cwnd_segments / 2
        } else {
            self.bdp_segments.min(self.cwnd_segments)
        }
    }

    /// Whether a new leg would still resume from it.
    pub fn is_current(&self) -> bool {
        self.age <= MAX_AGE
    }
}

/// The algorithm's counters since its maps were created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResumeEventCounts {
    /// Connections that started from a saved window.
    pub jumps: u64,
    /// Saved windows refused because the RTT no longer matched.
    pub rtt_mismatches: u64,
    /// Jumps whose unvalidated phase ended without a loss.
    pub validated: u64,
    /// Losses in the unvalidated phase: the window retreated and the
    /// peer's entry was forgotten.
    pub retreats: u64,
    /// Windows saved at the end of a connection.
    pub saved: u64,
}

/// The host's learned state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResumeState {
    /// Newest first.
    pub windows: Vec<LearnedWindow>,
    pub events: ResumeEventCounts,
}

/// Reads the live maps; `Ok(None)` when no `splitway_resume` maps are
/// loaded on the host (the algorithm is not registered).
pub fn read() -> Result<Option<ResumeState>, String> {
    let (Some(peers), Some(stats)) = (newest_map(PEERS_MAP)?, newest_map(STATS_MAP)?) else {
        return Ok(None);
    };
    let now = crate::rt::now_ns();
    let peers: HashMap<MapData, ResumeKey, ResumeVal> =
        HashMap::try_from(Map::LruHashMap(peers)).map_err(|e| format!("{PEERS_MAP}: {e}"))?;
    let mut windows = Vec::new();
    for entry in peers.iter() {
        // An entry evicted between the key walk and its lookup is skipped.
        let Ok((key, val)) = entry else { continue };
        let Some(peer) = peer_addr(&key) else {
            continue;
        };
        windows.push(LearnedWindow {
            peer,
            cwnd_segments: val.cwnd,
            bdp_segments: val.bdp,
            min_rtt: Duration::from_micros(u64::from(val.srtt_us)),
            age: Duration::from_nanos(now.saturating_sub(val.at_ns)),
            capacity_estimate: val.exited_slow_start != 0,
        });
    }
    windows.sort_by_key(|w| w.age);
    let stats: Array<MapData, ResumeEvents> =
        Array::try_from(Map::Array(stats)).map_err(|e| format!("{STATS_MAP}: {e}"))?;
    let n = stats.get(&0, 0).map_err(|e| format!("{STATS_MAP}: {e}"))?.n;
    Ok(Some(ResumeState {
        windows,
        events: ResumeEventCounts {
            jumps: n[0],
            rtt_mismatches: n[1],
            validated: n[2],
            retreats: n[3],
            saved: n[4],
        },
    }))
}

/// The loaded map named `name` with the highest id (the newest
/// registration's), if any.
fn newest_map(name: &str) -> Result<Option<MapData>, String> {
    let mut newest: Option<u32> = None;
    for info in aya::maps::loaded_maps() {
        // A map freed while the list is walked is no longer of interest.
        let Ok(info) = info else { continue };
        if info.name_as_str() == Some(name) && newest.is_none_or(|id| info.id() > id) {
            newest = Some(info.id());
        }
    }
    newest
        .map(|id| MapData::from_id(id).map_err(|e| format!("{name} (map id {id}): {e}")))
        .transpose()
}

fn peer_addr(key: &ResumeKey) -> Option<IpAddr> {
    // The C copies the kernel's address words as they are: network order.
    let bytes = |words: &[u32]| -> Vec<u8> { words.iter().flat_map(|w| w.to_ne_bytes()).collect() };
    match key.family {
        AF_INET => {
            let b = bytes(&key.addr[..1]);
            Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])))
        }
        AF_INET6 => {
            let b: [u8; 16] = bytes(&key.addr).try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_in_network_order() {
        let v4 = ResumeKey {
            family: AF_INET,
            addr: [u32::from_ne_bytes([10, 0, 1, 2]), 0, 0, 0],
        };
        assert_eq!(peer_addr(&v4), Some("10.0.1.2".parse().unwrap()));
        let six: Ipv6Addr = "fd00::1:2".parse().unwrap();
        let o = six.octets();
        let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
        let v6 = ResumeKey {
            family: AF_INET6,
            addr: [word(0), word(4), word(8), word(12)],
        };
        assert_eq!(peer_addr(&v6), Some(IpAddr::V6(six)));
        let other = ResumeKey {
            family: 1,
            addr: [0; 4],
        };
        assert_eq!(peer_addr(&other), None);
    }
}
