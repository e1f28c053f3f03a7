//! `splitway agent`: the client-host programs of `bpf/agent_synopt.c`,
//! attached to a cgroup v2 and pinned under a bpffs directory (default
//! [`DEFAULT_PIN_DIR`]) so they outlive the command that enabled them.
//!
//! connect4/connect6 redirect a connect() to a routed destination to its
//! relay; sockops writes the original destination into the SYN as the
//! `splitway_proto::syn_option` TCP option. Disabling removes the pinned
//! links, which detaches the programs (no process holds them).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, Map, MapData};
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSockAddr, SockOps};
use aya::{Ebpf, EbpfLoader};

use super::syn_watch::bpf_err;
use crate::SysError;

static AGENT_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent_synopt.o"));

/// Where `agent enable` pins programs and maps unless told otherwise.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/splitway/agent";

const LINKS: [(&str, &str); 3] = [
    ("agent_connect4", "link_connect4"),
    ("agent_connect6", "link_connect6"),
    ("agent_sockops", "link_sockops"),
];
const MAPS: [(&str, &str); 5] = [
    ("agent_routes4", "routes4"),
    ("agent_routes6", "routes6"),
    ("agent_conns", "conns"),
    ("agent_stats", "stats"),
    ("agent_cfg", "cfg"),
];

/// One route: connections to `prefix/prefix_len` go to `relay`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRoute {
    pub prefix: IpAddr,
    pub prefix_len: u8,
    pub relay: SocketAddr,
    /// IPv6 only: the index the relay knows this prefix by (the compact
    /// indexed option); `None` writes the full 23-byte IPv6 form.
    pub v6_index: Option<u8>,
}

/// Counters of the loaded programs (slots of `agent_stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentStats {
    pub redirected_v4: u64,
    pub redirected_v6: u64,
    pub options_written: u64,
    /// SYNs without room for the option (`bpf_reserve_hdr_opt`: -ENOSPC).
    pub options_no_space: u64,
    pub options_store_failed: u64,
    /// Probe mode: the largest option length the last SYN could reserve.
    pub probe_max_len: u64,
    /// Redirects whose destination could not be remembered (map full).
    pub lost: u64,
    /// Connects not redirected because their route's option would not fit
    /// the SYN ([`AgentStatus::option_space`]): they went direct.
    pub fallback_direct: u64,
    /// Connects that went direct because their destination was refused
    /// through the relay within the last minute (`fallback_direct` on).
    pub fallback_refused: u64,
    /// Redirected connections reset before they received a byte (the relay
    /// found no option or refused the destination), with fallback on.
    pub refusals_seen: u64,
}

/// What `agent status` reports.
#[derive(Debug, Clone)]
pub struct AgentStatus {
    pub pin_dir: PathBuf,
    pub routes: Vec<AgentRoute>,
    pub stats: AgentStats,
    pub probe: bool,
    /// Free SYN option bytes the agent assumes (0: unknown, never falls back).
    pub option_space: u32,
    /// A destination refused through the relay goes direct for a minute.
    pub fallback_direct: bool,
}

/// What `enable` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnableOutcome {
    Attached,
    /// Already enabled: only the routes (and probe flag) were replaced.
    RoutesReplaced,
}

// Layouts shared with bpf/agent_synopt.c (pinned there, checked by
// `bpf::layout`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct RouteVal {
    pub(super) relay: [u32; 4],
    pub(super) relay_port: u16,
    pub(super) v6_index: u8,
    pub(super) suffix_len: u8,
}
// SAFETY: plain-old-data with no padding (16 + 2 + 1 + 1 = 20 bytes, align 4).
unsafe impl aya::Pod for RouteVal {}

fn pin_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// True when `dir` holds a pinned agent.
pub fn is_enabled(pin_dir: &Path) -> bool {
    LINKS.iter().any(|(_, pin)| pin_path(pin_dir, pin).exists())
}

/// Loads, attaches to `cgroup` and pins the agent; when it is already
/// enabled, replaces its routes only.
/// `option_space` is the free option bytes in this host's SYNs (see
/// [`syn_option_space`]); a route whose option does not fit goes direct.
/// With `fallback_direct`, a destination whose redirected connection was
/// reset before any byte came back goes direct for the next minute.
pub fn enable(
    pin_dir: &Path,
    cgroup: &Path,
    routes: &[AgentRoute],
    probe: bool,
    option_space: u32,
    fallback_direct: bool,
) -> Result<EnableOutcome, SysError> {
    let values = route_values(routes)?;
    let cfg = [u32::from(probe), option_space, u32::from(fallback_direct)];
    if is_enabled(pin_dir) {
        write_routes(pin_dir, &values)?;
        write_cfg(pin_dir, cfg)?;
        return Ok(EnableOutcome::RoutesReplaced);
    }
    // Maps left pinned without links (an enable that was killed midway)
    // would make pinning fail: clear them first.
    disable(pin_dir)?;
    let cgroup_dir = std::fs::File::open(cgroup)
        .map_err(|e| SysError::io(format!("open cgroup {}", cgroup.display()), e))?;
    if pin_dir.starts_with(super::BPFFS) {
        super::ensure_bpffs()
            .map_err(|e| SysError::io(format!("mount a bpf filesystem at {}", super::BPFFS), e))?;
    }
    std::fs::create_dir_all(pin_dir)
        .map_err(|e| SysError::io(format!("create {}", pin_dir.display()), e))?;
    let result = attach_and_pin(pin_dir, &cgroup_dir, &values, cfg);
    if result.is_err() {
        // Leave nothing half-enabled; the attach error is the one to report.
        let _cleanup = disable(pin_dir);
    }
    result.map(|()| EnableOutcome::Attached)
}

fn attach_and_pin(
    pin_dir: &Path,
    cgroup: &std::fs::File,
    values: &[(IpAddr, u8, RouteVal)],
    cfg: [u32; 3],
) -> Result<(), SysError> {
    if let Some(why) = super::SKIPPED {
        return Err(SysError::Bpf {
            op: "load agent_synopt object".into(),
            detail: why.into(),
        });
    }
    let mut ebpf = EbpfLoader::new()
        .load(AGENT_OBJECT)
        .map_err(|e| bpf_err("load agent_synopt object", e))?;
    for (name, pin) in MAPS {
        map_of(&mut ebpf, name)?
            .pin(pin_path(pin_dir, pin))
            .map_err(|e| bpf_err(format!("pin map {name}"), e))?;
    }
    write_routes(pin_dir, values)?;
    write_cfg(pin_dir, cfg)?;
    for (name, pin) in LINKS {
        let program = ebpf.program_mut(name).ok_or_else(|| SysError::Bpf {
            op: "find program".into(),
            detail: format!("{name} missing from the object"),
        })?;
        // Loads `program` as `$ty`, attaches it to the cgroup and takes its
        // link (sock_ops and the connect hooks differ only in type).
        macro_rules! cgroup_link {
            ($ty:ty) => {{
                let p: &mut $ty = program
                    .try_into()
                    .map_err(|e| bpf_err(format!("program {name}"), e))?;
                p.load()
                    .map_err(|e| bpf_err(format!("load {name} (verifier)"), e))?;
                let id = p
                    // Through bpf_link_create (which refuses attach flags),
                    // links always coexist with other programs on the cgroup.
                    .attach(cgroup, CgroupAttachMode::Single)
                    .map_err(|e| bpf_err(format!("attach {name}"), e))?;
                p.take_link(id)
                    .map_err(|e| bpf_err(format!("take link {name}"), e))?
                    .try_into()
                    .map_err(|e| bpf_err(format!("link {name}"), e))?
            }};
        }
        let link: FdLink = if name == "agent_sockops" {
            cgroup_link!(SockOps)
        } else {
            cgroup_link!(CgroupSockAddr)
        };
        link.pin(pin_path(pin_dir, pin))
            .map_err(|e| bpf_err(format!("pin link {name}"), e))?;
    }
    Ok(())
}

/// Unpins everything under `pin_dir` (detaching the programs). `Ok(false)`:
/// nothing was enabled there.
pub fn disable(pin_dir: &Path) -> Result<bool, SysError> {
    let mut removed = false;
    for (_, pin) in LINKS.iter().chain(MAPS.iter()) {
        let path = pin_path(pin_dir, pin);
        match std::fs::remove_file(&path) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SysError::io(format!("unpin {}", path.display()), e)),
        }
    }
    match std::fs::remove_dir(pin_dir) {
        Ok(()) => {}
        // Not ours to remove when it holds anything else (e.g. --pin-dir
        // /sys/fs/bpf itself).
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
            ) => {}
        Err(e) => return Err(SysError::io(format!("remove {}", pin_dir.display()), e)),
    }
    Ok(removed)
}

/// The pinned agent's routes and counters; `None` when not enabled.
pub fn status(pin_dir: &Path) -> Result<Option<AgentStatus>, SysError> {
    if !is_enabled(pin_dir) {
        return Ok(None);
    }
    let mut routes = Vec::new();
    let r4: LpmTrie<MapData, [u8; 4], RouteVal> = pinned(pin_dir, "routes4")?;
    for entry in r4.iter() {
        let (key, val) = entry.map_err(|e| bpf_err("read routes4", e))?;
        routes.push(route_of(
            IpAddr::V4(Ipv4Addr::from(key.data())),
            key.prefix_len(),
            &val,
            false,
        ));
    }
    let r6: LpmTrie<MapData, [u8; 16], RouteVal> = pinned(pin_dir, "routes6")?;
    for entry in r6.iter() {
        let (key, val) = entry.map_err(|e| bpf_err("read routes6", e))?;
        routes.push(route_of(
            IpAddr::V6(Ipv6Addr::from(key.data())),
            key.prefix_len(),
            &val,
            true,
        ));
    }
    let stats: Array<MapData, u64> = pinned(pin_dir, "stats")?;
    let slot = |i: u32| stats.get(&i, 0).map_err(|e| bpf_err("read stats", e));
    let stats_out = AgentStats {
        redirected_v4: slot(0)?,
        redirected_v6: slot(1)?,
        options_written: slot(2)?,
        options_no_space: slot(3)?,
        options_store_failed: slot(4)?,
        probe_max_len: slot(5)?,
        lost: slot(6)?,
        fallback_direct: slot(7)?,
        fallback_refused: slot(8)?,
        refusals_seen: slot(9)?,
    };
    let cfg: Array<MapData, u32> = pinned(pin_dir, "cfg")?;
    let probe = cfg.get(&0, 0).map_err(|e| bpf_err("read cfg", e))? != 0;
    let option_space = cfg.get(&1, 0).map_err(|e| bpf_err("read cfg", e))?;
    let fallback_direct = cfg.get(&2, 0).map_err(|e| bpf_err("read cfg", e))? != 0;
    Ok(Some(AgentStatus {
        pin_dir: pin_dir.to_path_buf(),
        routes,
        stats: stats_out,
        probe,
        option_space,
        fallback_direct,
    }))
}

fn route_of(prefix: IpAddr, prefix_len: u32, val: &RouteVal, v6: bool) -> AgentRoute {
    let port = u16::from_be(val.relay_port);
    let relay = if v6 {
        let mut octets = [0u8; 16];
        for (i, word) in val.relay.iter().enumerate() {
            octets[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        SocketAddr::from((Ipv6Addr::from(octets), port))
    } else {
        SocketAddr::from((Ipv4Addr::from(val.relay[0].to_ne_bytes()), port))
    };
    AgentRoute {
        prefix,
        prefix_len: prefix_len as u8,
        relay,
        v6_index: (val.v6_index != 0).then(|| val.v6_index - 1),
    }
}

fn route_values(routes: &[AgentRoute]) -> Result<Vec<(IpAddr, u8, RouteVal)>, SysError> {
    let mut out = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let bad = |why: String| {
            SysError::Internal(format!("route {i} ({}/{}): {why}", r.prefix, r.prefix_len))
        };
        let mut val = RouteVal {
            relay_port: r.relay.port().to_be(),
            ..RouteVal::default()
        };
        match (r.prefix, r.relay) {
            (IpAddr::V4(_), SocketAddr::V4(relay)) => {
                if r.prefix_len > 32 {
                    return Err(bad("prefix length above 32".into()));
                }
                if r.v6_index.is_some() {
                    return Err(bad("an IPv4 route has no prefix index".into()));
                }
                val.relay[0] = u32::from_ne_bytes(relay.ip().octets());
            }
            (IpAddr::V6(_), SocketAddr::V6(relay)) => {
                if r.prefix_len > 128 {
                    return Err(bad("prefix length above 128".into()));
                }
                for (j, chunk) in relay.ip().octets().chunks_exact(4).enumerate() {
                    val.relay[j] = u32::from_ne_bytes(chunk.try_into().expect("4 bytes"));
                }
                if let Some(index) = r.v6_index {
                    if index > 0x7f {
                        return Err(bad(format!("prefix index {index} above 127")));
                    }
                    let n = splitway_suffix_len(r.prefix_len);
                    if n == 0 || n > 12 {
                        return Err(bad(format!(
                            "the indexed option needs a prefix of /32 to /127 (this one leaves {n} suffix bytes)"
                        )));
                    }
                    val.v6_index = index + 1;
                    val.suffix_len = n as u8;
                }
            }
            _ => return Err(bad("relay address family differs from the prefix's".into())),
        }
        if r.relay.port() == 0 {
            return Err(bad("relay port 0".into()));
        }
        out.push((r.prefix, r.prefix_len, val));
    }
    Ok(out)
}

/// Suffix bytes of the indexed IPv6 form (as `syn_option::suffix_len_for`).
fn splitway_suffix_len(prefix_len: u8) -> usize {
    (128usize.saturating_sub(prefix_len as usize)).div_ceil(8)
}

fn write_routes(pin_dir: &Path, values: &[(IpAddr, u8, RouteVal)]) -> Result<(), SysError> {
    let mut r4: LpmTrie<MapData, [u8; 4], RouteVal> = pinned(pin_dir, "routes4")?;
    let old4: Vec<_> = r4
        .keys()
        .collect::<Result<_, _>>()
        .map_err(|e| bpf_err("read routes4", e))?;
    for key in old4 {
        r4.remove(&key).map_err(|e| bpf_err("clear routes4", e))?;
    }
    let mut r6: LpmTrie<MapData, [u8; 16], RouteVal> = pinned(pin_dir, "routes6")?;
    let old6: Vec<_> = r6
        .keys()
        .collect::<Result<_, _>>()
        .map_err(|e| bpf_err("read routes6", e))?;
    for key in old6 {
        r6.remove(&key).map_err(|e| bpf_err("clear routes6", e))?;
    }
    for (prefix, len, val) in values {
        match prefix {
            IpAddr::V4(a) => r4
                .insert(&Key::new(u32::from(*len), a.octets()), *val, 0)
                .map_err(|e| bpf_err("insert route", e))?,
            IpAddr::V6(a) => r6
                .insert(&Key::new(u32::from(*len), a.octets()), *val, 0)
                .map_err(|e| bpf_err("insert route", e))?,
        }
    }
    Ok(())
}

fn write_cfg(pin_dir: &Path, cfg: [u32; 3]) -> Result<(), SysError> {
    let mut map: Array<MapData, u32> = pinned(pin_dir, "cfg")?;
    for (slot, value) in (0u32..).zip(cfg) {
        map.set(slot, value, 0).map_err(|e| {
            bpf_err(
                "write cfg (an agent pinned by an older splitway has fewer settings: disable it first)",
                e,
            )
        })?;
    }
    Ok(())
}

/// Free option bytes in a SYN of the calling thread's network namespace:
/// 40 less what Linux itself puts there (MSS 4; timestamps, with or
/// without SACK-permitted, 12; SACK-permitted alone 4; window scale 4).
/// Matches the 20 bytes `agent enable --probe` measures with the defaults.
pub fn syn_option_space() -> Result<u32, SysError> {
    let on = |name: &str| -> Result<bool, SysError> {
        let path = format!("/proc/sys/net/ipv4/{name}");
        let text =
            std::fs::read_to_string(&path).map_err(|e| SysError::io(format!("read {path}"), e))?;
        Ok(text.trim() != "0")
    };
    Ok(option_space_for(
        on("tcp_timestamps")?,
        on("tcp_sack")?,
        on("tcp_window_scaling")?,
    ))
}

fn option_space_for(timestamps: bool, sack: bool, window_scaling: bool) -> u32 {
    let ts_sack = match (timestamps, sack) {
        (true, _) => 12,
        (false, true) => 4,
        (false, false) => 0,
    };
    40 - 4 - ts_sack - if window_scaling { 4 } else { 0 }
}

fn pinned<T>(pin_dir: &Path, pin: &str) -> Result<T, SysError>
where
    T: TryFrom<Map>,
    <T as TryFrom<Map>>::Error: std::error::Error,
{
    let path = pin_path(pin_dir, pin);
    let data =
        MapData::from_pin(&path).map_err(|e| bpf_err(format!("open {}", path.display()), e))?;
    let map = Map::from_map_data(data).map_err(|e| bpf_err(format!("map {pin}"), e))?;
    T::try_from(map).map_err(|e| bpf_err(format!("map {pin} type"), e))
}

fn map_of<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Map, SysError> {
    ebpf.map_mut(name).ok_or_else(|| SysError::Bpf {
        op: "find map".into(),
        detail: format!("{name} missing from the object"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults leave the 20 bytes the probe measured
    /// (lab-results/syn-option-space-20261124.txt); the IPv4 form (12
    /// padded) always fits, the full IPv6 form (24) only without timestamps.
    #[test]
    fn option_space_follows_the_syn_options_linux_adds() {
        assert_eq!(option_space_for(true, true, true), 20);
        assert_eq!(option_space_for(true, false, true), 20);
        assert_eq!(option_space_for(false, true, true), 28);
        assert_eq!(option_space_for(false, false, false), 36);
    }
}
