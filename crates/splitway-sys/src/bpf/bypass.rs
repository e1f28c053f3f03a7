//! Co-located bypass (`bpf/bypass.c`): a cgroup sock_ops program pairs the two
//! ends of same-host TCP connections in a sockhash, and an sk_msg program
//! redirects each end's sends into its peer's receive queue.
//!
//! Everything lives in the kernel after [`enable`] returns: the sock_ops link
//! and the maps are pinned under [`PIN_DIR`], and the sk_msg program is held
//! by the sockhash it is attached to.
//!
//! [`disable`] never drops a byte. Detaching the sock_ops link stops new
//! pairings at once, but a paired socket's unread redirected data lives in
//! its sockhash entry (the psock): removing the socket from the map, or
//! freeing the map, discards it. So while paired sockets remain, the sockhash
//! (with its sk_msg program) is kept, renamed under `draining-<n>/`, and is
//! released by a later `disable` or `status` once its last socket closed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuArray, SockHash};
use aya::programs::links::FdLink;
use aya::programs::{BtfTracePoint, CgroupAttachMode, SkMsg, SockOps};
use aya::{Ebpf, EbpfLoader};

/// The compiled program, built by `build.rs` from `bpf/bypass.c`.
static BYPASS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bypass.o"));

/// Where the links and maps are pinned.
pub const PIN_DIR: &str = "/sys/fs/bpf/splitway/bypass";
/// The cgroup the link is attached to (bpffs holds only BPF objects).
pub const STATE_FILE: &str = "/run/splitway/bypass.cgroup";

const LINK_PIN: &str = "sockops_link";
/// The BTF raw tracepoint that counts what paired sockets' readers consumed.
const RECV_LINK_PIN: &str = "recv_link";
const SOCKS_PIN: &str = "socks";
const POLICY_PIN: &str = "policy";
const PORTS_PIN: &str = "ports";
const STATS_PIN: &str = "stats";

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

const POLICY_ENABLED: u32 = 1 << 0;
const POLICY_LOOPBACK_ONLY: u32 = 1 << 1;
const POLICY_PORTS: u32 = 1 << 2;
/// `BYP_PORTS` max_entries in bypass.c.
pub const MAX_PORTS: usize = 64;

/// `struct bypass_key` in bypass.c (48 bytes; pinned there, checked by
/// `bpf::layout`).
pub(super) type Key = [u8; 48];

/// Why a bypass operation failed. Every variant names the failing party.
#[derive(Debug, thiserror::Error)]
pub enum BypassError {
    #[error(
        "{path} is not a cgroup v2 directory (cgroup2 is mounted at {mount}); \
         pass a directory under that mount"
    )]
    NotCgroupV2 { path: PathBuf, mount: String },
    #[error("cgroup {path}: {source}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no bpf filesystem at /sys/fs/bpf, and mounting one failed (mount -t bpf bpf /sys/fs/bpf)"
    )]
    NoBpfFs,
    #[error("kernel refused BPF ({op}): {detail}; this needs root (CAP_BPF and CAP_NET_ADMIN)")]
    Permission { op: String, detail: String },
    #[error("kernel: {op}: {detail}")]
    Kernel { op: String, detail: String },
    #[error("bypass is already enabled on cgroup {current}; run `splitway bypass disable` first")]
    OtherCgroup { current: String },
    #[error("at most {MAX_PORTS} ports, got {0}")]
    TooManyPorts(usize),
    #[error("kernel BTF: {0}")]
    Btf(String),
    #[error("internal: {0}")]
    Internal(String),
    /// [`super::SKIPPED`]: this build carries no bypass.o.
    #[error("{0}")]
    NotBuilt(&'static str),
}

fn kernel(op: &str, e: impl std::error::Error) -> BypassError {
    // aya's errors keep the errno in their source chain.
    let mut detail = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        src = s.source();
    }
    let lower = detail.to_lowercase();
    if lower.contains("operation not permitted") || lower.contains("permission denied") {
        BypassError::Permission {
            op: op.to_owned(),
            detail,
        }
    } else {
        BypassError::Kernel {
            op: op.to_owned(),
            detail,
        }
    }
}

/// Which connections are paired.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Policy {
    /// Only connections with both addresses loopback (127/8, ::1, v4-mapped).
    pub loopback_only: bool,
    /// Only connections with either port in this list (empty: any port).
    pub ports: Vec<u16>,
}

/// The kernel's counters (`BYP_STATS`, summed over CPUs).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Sockets inserted into the sockhash at ESTABLISHED.
    pub sockets_paired: u64,
    /// Established sockets the policy left alone.
    pub excluded_by_policy: u64,
    /// Sockets with data before ESTABLISHED (TCP Fast Open): never paired.
    pub excluded_early_data: u64,
    /// Storage or map insertion failed: the socket stays plain TCP.
    pub insert_failed: u64,
    /// Sends over TCP between paired sockets: the peer's application had not
    /// yet read everything sent before (a stream, or a stalled reader), or
    /// had read nothing with recvmsg yet.
    pub messages_tcp: u64,
    /// Their bytes.
    pub bytes_tcp: u64,
    /// Sends redirected into the peer's receive queue.
    pub messages_redirected: u64,
    /// Their bytes.
    pub bytes_redirected: u64,
    /// Redirects whose peer had left the map (closed): sent over TCP.
    pub redirect_misses: u64,
    /// Sends on a mapped socket without state (should stay 0).
    pub no_state: u64,
    /// Sends over TCP because the peer is not paired (outside the cgroup or
    /// the policy).
    pub sends_without_peer: u64,
    /// recvmsg calls counted on paired sockets.
    pub reads_counted: u64,
    /// Connections that left the sockhash for plain TCP because they
    /// streamed (1 MiB over TCP since their last redirect).
    pub unpaired_streams: u64,
}

impl Counters {
    fn from_slice(v: &[u64]) -> Self {
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        Counters {
            sockets_paired: at(0),
            excluded_by_policy: at(1),
            excluded_early_data: at(2),
            insert_failed: at(3),
            messages_tcp: at(4),
            bytes_tcp: at(5),
            messages_redirected: at(6),
            bytes_redirected: at(7),
            redirect_misses: at(8),
            no_state: at(9),
            sends_without_peer: at(10),
            reads_counted: at(11),
            unpaired_streams: at(12),
        }
    }
}

/// A sockhash kept after `disable` until its sockets close.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Draining {
    pub pin: PathBuf,
    pub paired_sockets: usize,
}

/// What `status` reports (`splitway bypass status --json`, which the
/// tests read back).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// The sock_ops link is pinned (new connections are paired).
    pub enabled: bool,
    pub cgroup: Option<String>,
    pub policy: Option<Policy>,
    /// Sockets currently in the sockhash (both ends of a pair count).
    pub paired_sockets: usize,
    pub counters: Counters,
    pub draining: Vec<Draining>,
}

/// What `enable` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnableOutcome {
    Enabled,
    AlreadyEnabled,
    PolicyUpdated,
}

/// What `disable` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisableOutcome {
    NotEnabled,
    /// Detached; every pin removed.
    Disabled,
    /// Detached; these sockhashes still hold live paired sockets.
    Draining(Vec<Draining>),
}

/// The cgroup v2 mount point, from /proc/mounts.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_src, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// Checks that `path` is a cgroup v2 directory.
pub fn check_cgroup(path: &Path) -> Result<(), BypassError> {
    let magic = super::fs_magic(path).map_err(|source| BypassError::Cgroup {
        path: path.to_owned(),
        source,
    })?;
    if magic != CGROUP2_SUPER_MAGIC {
        return Err(BypassError::NotCgroupV2 {
            path: path.to_owned(),
            mount: cgroup2_mount()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "nowhere (no cgroup2 in /proc/mounts)".to_owned()),
        });
    }
    Ok(())
}

fn pin_dir() -> PathBuf {
    PathBuf::from(PIN_DIR)
}

fn ensure_pin_dir() -> Result<(), BypassError> {
    super::ensure_bpffs().map_err(|_| BypassError::NoBpfFs)?;
    std::fs::create_dir_all(pin_dir()).map_err(|e| kernel(&format!("mkdir {PIN_DIR}"), e))
}

fn open_pinned(name: &str) -> Result<Option<MapData>, BypassError> {
    let path = pin_dir().join(name);
    if !path.exists() {
        return Ok(None);
    }
    MapData::from_pin(&path)
        .map(Some)
        .map_err(|e| kernel(&format!("open {}", path.display()), e))
}

fn encode_policy(p: &Policy) -> u64 {
    let mut flags = POLICY_ENABLED;
    if p.loopback_only {
        flags |= POLICY_LOOPBACK_ONLY;
    }
    if !p.ports.is_empty() {
        flags |= POLICY_PORTS;
    }
    u64::from(flags)
}

/// Writes the policy into the (pinned or fresh) maps. Ports first, so the
/// flag that makes the program consult them is set only once they are there.
fn write_policy(policy_map: MapData, ports_map: MapData, p: &Policy) -> Result<(), BypassError> {
    let mut ports: BpfHashMap<MapData, u32, u8> =
        BpfHashMap::try_from(Map::HashMap(ports_map)).map_err(|e| kernel("ports map", e))?;
    let old: Vec<u32> = ports.keys().filter_map(Result::ok).collect();
    for port in &p.ports {
        ports
            .insert(u32::from(*port), 1, 0)
            .map_err(|e| kernel("ports map insert", e))?;
    }
    let mut policy: Array<MapData, u64> =
        Array::try_from(Map::Array(policy_map)).map_err(|e| kernel("policy map", e))?;
    policy
        .set(0, encode_policy(p), 0)
        .map_err(|e| kernel("policy map set", e))?;
    for port in old {
        if !p.ports.iter().any(|&q| u32::from(q) == port) {
            ports
                .remove(&port)
                .map_err(|e| kernel("ports map remove", e))?;
        }
    }
    Ok(())
}

fn read_policy() -> Result<Option<Policy>, BypassError> {
    let (Some(policy_map), Some(ports_map)) = (open_pinned(POLICY_PIN)?, open_pinned(PORTS_PIN)?)
    else {
        return Ok(None);
    };
    let policy: Array<MapData, u64> =
        Array::try_from(Map::Array(policy_map)).map_err(|e| kernel("policy map", e))?;
    let flags = policy.get(&0, 0).map_err(|e| kernel("policy map get", e))? as u32;
    let ports: BpfHashMap<MapData, u32, u8> =
        BpfHashMap::try_from(Map::HashMap(ports_map)).map_err(|e| kernel("ports map", e))?;
    let mut list: Vec<u16> = ports
        .keys()
        .filter_map(Result::ok)
        .filter_map(|p| u16::try_from(p).ok())
        .collect();
    list.sort_unstable();
    if flags & POLICY_PORTS == 0 {
        list.clear();
    }
    Ok(Some(Policy {
        loopback_only: flags & POLICY_LOOPBACK_ONLY != 0,
        ports: list,
    }))
}

fn count_socks(path: &Path) -> Result<usize, BypassError> {
    let data =
        MapData::from_pin(path).map_err(|e| kernel(&format!("open {}", path.display()), e))?;
    let socks: SockHash<MapData, Key> =
        SockHash::try_from(Map::SockHash(data)).map_err(|e| kernel("sockhash", e))?;
    Ok(socks.keys().filter(Result::is_ok).count())
}

fn read_counters(path: &Path) -> Result<Counters, BypassError> {
    if !path.exists() {
        return Ok(Counters::default());
    }
    let data =
        MapData::from_pin(path).map_err(|e| kernel(&format!("open {}", path.display()), e))?;
    let stats: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(Map::PerCpuArray(data)).map_err(|e| kernel("stats map", e))?;
    let mut sums = Vec::new();
    for values in stats.iter() {
        let values = values.map_err(|e| kernel("stats map read", e))?;
        sums.push(values.iter().sum());
    }
    Ok(Counters::from_slice(&sums))
}

fn read_state_cgroup() -> Option<String> {
    std::fs::read_to_string(STATE_FILE)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Attaches the bypass to `cgroup` with `policy`. Idempotent: on the same
/// cgroup it only updates the policy in place.
pub fn enable(cgroup: &Path, policy: &Policy) -> Result<EnableOutcome, BypassError> {
    if policy.ports.len() > MAX_PORTS {
        return Err(BypassError::TooManyPorts(policy.ports.len()));
    }
    check_cgroup(cgroup)?;
    let cgroup = cgroup
        .canonicalize()
        .map_err(|source| BypassError::Cgroup {
            path: cgroup.to_owned(),
            source,
        })?;
    let cgroup_text = cgroup.display().to_string();
    ensure_pin_dir()?;
    release_drained()?;

    if pin_dir().join(LINK_PIN).exists() {
        let current = read_state_cgroup().unwrap_or_else(|| "(unknown)".to_owned());
        if current != cgroup_text {
            return Err(BypassError::OtherCgroup { current });
        }
        let before = read_policy()?;
        if before.as_ref() == Some(policy) {
            return Ok(EnableOutcome::AlreadyEnabled);
        }
        let (Some(pm), Some(ports)) = (open_pinned(POLICY_PIN)?, open_pinned(PORTS_PIN)?) else {
            return Err(BypassError::Internal(format!(
                "{PIN_DIR}/{LINK_PIN} is pinned but its policy maps are not"
            )));
        };
        write_policy(pm, ports, policy)?;
        return Ok(EnableOutcome::PolicyUpdated);
    }

    // A half-done earlier enable (crash between pins): start clean.
    remove_pins(&[RECV_LINK_PIN, SOCKS_PIN, POLICY_PIN, PORTS_PIN, STATS_PIN])?;
    // The cgroup is recorded first, and nothing is paired until every
    // process's `may_pair_this_process_recently` answer is younger than the
    // record: a relay already running in the cgroup then never takes a
    // paired socket's short read as proof that it is drained.
    if let Some(dir) = Path::new(STATE_FILE).parent() {
        std::fs::create_dir_all(dir).map_err(|e| kernel("mkdir /run/splitway", e))?;
    }
    std::fs::write(STATE_FILE, format!("{cgroup_text}\n"))
        .map_err(|e| kernel(&format!("write {STATE_FILE}"), e))?;
    std::thread::sleep(MAY_PAIR_STALE + Duration::from_millis(100));
    let result = load_and_attach(&cgroup, policy);
    if result.is_err() {
        let _cleanup = remove_pins(&[
            LINK_PIN,
            RECV_LINK_PIN,
            SOCKS_PIN,
            POLICY_PIN,
            PORTS_PIN,
            STATS_PIN,
        ]);
        let _cleanup = std::fs::remove_file(STATE_FILE);
        return result;
    }
    Ok(EnableOutcome::Enabled)
}

/// The loaded program `name` of bypass.o, as its type.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P, BypassError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| BypassError::Internal(format!("bypass.o has no {name}")))?
        .try_into()
        .map_err(|e| kernel(&format!("{name} type"), e))
}

fn load_and_attach(cgroup: &Path, policy: &Policy) -> Result<EnableOutcome, BypassError> {
    if let Some(why) = super::SKIPPED {
        return Err(BypassError::NotBuilt(why));
    }
    // The kernel's BTF, read once: the read counter's field offsets come
    // from it, and its BTF tracepoint is loaded against it.
    use super::kernel_btf::{KernelBtf, VMLINUX};
    let btf_bytes = KernelBtf::open(Path::new(VMLINUX))
        .map_err(|e| BypassError::Btf(format!("{VMLINUX}: {e} (needs CONFIG_DEBUG_INFO_BTF)")))?;
    let (cookie_off, user_data_off) = sock_offsets(&btf_bytes)?;
    let btf = aya::Btf::parse(&btf_bytes, aya::Endianness::default())
        .map_err(|e| BypassError::Btf(format!("{VMLINUX}: {e}")))?;
    let mut ebpf: Ebpf = EbpfLoader::new()
        .override_global("COOKIE_OFF", &cookie_off, true)
        .override_global("USER_DATA_OFF", &user_data_off, true)
        .load(BYPASS_OBJECT)
        .map_err(|e| kernel("load bypass.o", e))?;
    // Load every program before taking maps out of `ebpf`: a taken map is
    // closed when dropped, and a program loaded later would name a dead fd.
    for name in ["bypass_msg", "bypass_sockops", "bypass_recv"] {
        let prog = ebpf
            .program_mut(name)
            .ok_or_else(|| BypassError::Internal(format!("bypass.o has no {name}")))?;
        match prog {
            aya::programs::Program::SkMsg(p) => p.load(),
            aya::programs::Program::SockOps(p) => p.load(),
            aya::programs::Program::BtfTracePoint(p) => p.load("sock_recv_length", &btf),
            _ => {
                return Err(BypassError::Internal(format!(
                    "{name} has an unexpected type"
                )));
            }
        }
        .map_err(|e| kernel(&format!("load {name}"), e))?;
    }
    let take = |ebpf: &mut Ebpf, name: &str| {
        ebpf.take_map(name)
            .ok_or_else(|| BypassError::Internal(format!("bypass.o has no map {name}")))
    };
    let policy_map = take(&mut ebpf, "BYP_POLICY")?;
    let ports_map = take(&mut ebpf, "BYP_PORTS")?;
    let stats_map = take(&mut ebpf, "BYP_STATS")?;
    let socks_map = take(&mut ebpf, "BYP_SOCKS")?;
    let dir = pin_dir();
    for (map, name) in [
        (&policy_map, POLICY_PIN),
        (&ports_map, PORTS_PIN),
        (&stats_map, STATS_PIN),
        (&socks_map, SOCKS_PIN),
    ] {
        map.pin(dir.join(name))
            .map_err(|e| kernel(&format!("pin {name}"), e))?;
    }
    let (Map::Array(pm), Map::HashMap(ports)) = (policy_map, ports_map) else {
        return Err(BypassError::Internal("policy/ports map types".into()));
    };
    write_policy(pm, ports, policy)?;
    let socks: SockHash<MapData, Key> =
        SockHash::try_from(socks_map).map_err(|e| kernel("sockhash", e))?;

    // sk_msg first, so a socket is never in the map without it.
    let msg: &mut SkMsg = program(&mut ebpf, "bypass_msg")?;
    let msg_link_id = msg
        .attach(socks.fd())
        .map_err(|e| kernel("attach sk_msg to sockhash", e))?;
    let msg_link = msg
        .take_link(msg_link_id)
        .map_err(|e| kernel("sk_msg link", e))?;
    // The map holds the attachment; dropping the link would detach it.
    std::mem::forget(msg_link);

    // The read counter before sock_ops: a socket paired before it ran would
    // lag behind its reads and stay on TCP for good.
    let recv: &mut BtfTracePoint = program(&mut ebpf, "bypass_recv")?;
    let recv_id = recv
        .attach()
        .map_err(|e| kernel("attach BTF tracepoint sock_recv_length", e))?;
    let recv_link: FdLink = recv
        .take_link(recv_id)
        .map_err(|e| kernel("BTF tracepoint link", e))?
        .into();
    recv_link
        .pin(dir.join(RECV_LINK_PIN))
        .map_err(|e| kernel("pin BTF tracepoint link", e))?;

    let cg = std::fs::File::open(cgroup).map_err(|source| BypassError::Cgroup {
        path: cgroup.to_owned(),
        source,
    })?;
    let ops: &mut SockOps = program(&mut ebpf, "bypass_sockops")?;
    let id = ops
        // A cgroup bpf_link is always multi-attach; link_create wants flags 0.
        .attach(&cg, CgroupAttachMode::Single)
        .map_err(|e| kernel("attach sock_ops to cgroup", e))?;
    let link = ops.take_link(id).map_err(|e| kernel("sock_ops link", e))?;
    let fd_link: FdLink = link
        .try_into()
        .map_err(|e| kernel("sock_ops link is not a bpf_link (kernel < 5.7?)", e))?;
    fd_link
        .pin(dir.join(LINK_PIN))
        .map_err(|e| kernel("pin sock_ops link", e))?;
    Ok(EnableOutcome::Enabled)
}

/// Where the kernel keeps a socket's cookie (`sock_common.skc_cookie`) and
/// its psock (`sock.sk_user_data`): the read counter skips sockets without a
/// psock and finds a paired socket's entry by its cookie.
fn sock_offsets(btf: &[u8]) -> Result<(u32, u32), BypassError> {
    let at = |strukt, member| {
        super::btf::member_offset(btf, strukt, member).map_err(|e| BypassError::Btf(e.to_string()))
    };
    // sock_common is struct sock's first member (checked, not assumed).
    let common = at("sock", "__sk_common")?;
    Ok((
        common + at("sock_common", "skc_cookie")?,
        at("sock", "sk_user_data")?,
    ))
}

fn remove_pins(names: &[&str]) -> Result<(), BypassError> {
    for name in names {
        let path = pin_dir().join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(kernel(&format!("unpin {}", path.display()), e)),
        }
    }
    Ok(())
}

fn draining_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(pin_dir())
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("draining-"))
        })
        .collect();
    dirs.sort();
    dirs
}

/// Frees drained sockhashes (no socket left); returns those still live.
fn release_drained() -> Result<Vec<Draining>, BypassError> {
    let mut live = Vec::new();
    for dir in draining_dirs() {
        let socks = dir.join(SOCKS_PIN);
        let n = if socks.exists() {
            count_socks(&socks)?
        } else {
            0
        };
        if n == 0 {
            for name in [SOCKS_PIN, STATS_PIN] {
                let p = dir.join(name);
                if p.exists() {
                    std::fs::remove_file(&p)
                        .map_err(|e| kernel(&format!("unpin {}", p.display()), e))?;
                }
            }
            std::fs::remove_dir(&dir)
                .map_err(|e| kernel(&format!("rmdir {}", dir.display()), e))?;
        } else {
            live.push(Draining {
                pin: dir,
                paired_sockets: n,
            });
        }
    }
    Ok(live)
}

/// Detaches the bypass. Idempotent. Paired sockets keep working: see the
/// module docs.
pub fn disable() -> Result<DisableOutcome, BypassError> {
    let dir = pin_dir();
    if !dir.exists() {
        return Ok(DisableOutcome::NotEnabled);
    }
    let was_enabled = dir.join(LINK_PIN).exists() || dir.join(SOCKS_PIN).exists();
    // Unpinning the links (their only references) detaches sock_ops and the
    // read counter. Paired sockets left draining then send over TCP: a
    // direction without read counts never meets the redirect rule, and TCP
    // after redirected data is read in order.
    remove_pins(&[LINK_PIN, RECV_LINK_PIN, POLICY_PIN, PORTS_PIN])?;
    let socks = dir.join(SOCKS_PIN);
    if socks.exists() {
        if count_socks(&socks)? == 0 {
            remove_pins(&[SOCKS_PIN, STATS_PIN])?;
        } else {
            let mut n = 0u32;
            let target = loop {
                let t = dir.join(format!("draining-{n}"));
                if !t.exists() {
                    break t;
                }
                n += 1;
            };
            std::fs::create_dir(&target)
                .map_err(|e| kernel(&format!("mkdir {}", target.display()), e))?;
            for name in [SOCKS_PIN, STATS_PIN] {
                let from = dir.join(name);
                if from.exists() {
                    std::fs::rename(&from, target.join(name))
                        .map_err(|e| kernel(&format!("rename {}", from.display()), e))?;
                }
            }
        }
    } else {
        remove_pins(&[STATS_PIN])?;
    }
    let _stale = std::fs::remove_file(STATE_FILE);
    let live = release_drained()?;
    if !live.is_empty() {
        return Ok(DisableOutcome::Draining(live));
    }
    let _empty = std::fs::remove_dir(&dir);
    if was_enabled {
        Ok(DisableOutcome::Disabled)
    } else {
        Ok(DisableOutcome::NotEnabled)
    }
}

/// Reads the current state (and frees drained sockhashes).
pub fn status() -> Result<Status, BypassError> {
    let dir = pin_dir();
    if !dir.exists() {
        return Ok(Status {
            enabled: false,
            cgroup: None,
            policy: None,
            paired_sockets: 0,
            counters: Counters::default(),
            draining: Vec::new(),
        });
    }
    let enabled = dir.join(LINK_PIN).exists();
    let socks = dir.join(SOCKS_PIN);
    let paired_sockets = if socks.exists() {
        count_socks(&socks)?
    } else {
        0
    };
    Ok(Status {
        enabled,
        cgroup: if enabled { read_state_cgroup() } else { None },
        policy: if enabled { read_policy()? } else { None },
        paired_sockets,
        counters: read_counters(&dir.join(STATS_PIN))?,
        draining: release_drained()?,
    })
}

/// Whether this process's sockets may be paired by the bypass: it is
/// enabled on a cgroup that holds this process, or a sockhash of an earlier
/// enable is still draining (its cgroup is no longer recorded, so any
/// process may own its sockets). A stat when the bypass is off; a few small
/// reads when on. A process that splices must not splice from a paired
/// socket: redirected data is invisible to splice(2) (docs/bypass.md).
fn may_pair_this_process() -> bool {
    let dir = pin_dir();
    if !dir.exists() {
        return false;
    }
    if !draining_dirs().is_empty() {
        return true;
    }
    // The state file comes first at an enable (see `enable`).
    let recorded = read_state_cgroup();
    if recorded.is_none() && !dir.join(LINK_PIN).exists() {
        return false;
    }
    let (Some(bypass_cgroup), Some(mount)) = (recorded, cgroup2_mount()) else {
        // Enabled, but where is unknown: assume here.
        return true;
    };
    // The v2 line of /proc/self/cgroup is "0::/path/under/the/mount".
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("0::")
                    .map(|p| mount.join(p.trim_start_matches('/')))
            })
        });
    own.is_none_or(|own| own.starts_with(Path::new(&bypass_cgroup)))
}

/// `may_pair_this_process()` as of at most [`MAY_PAIR_STALE`] ago: for
/// per-connection decisions, where the stat would be a syscall per
/// connection. `enable` records its cgroup and waits that long before it
/// pairs anything, so no socket is paired unseen.
pub fn may_pair_this_process_recently() -> bool {
    static BASE: OnceLock<Instant> = OnceLock::new();
    // Milliseconds since BASE of the last answer, plus one (0: never asked).
    static ASKED_AT: AtomicU64 = AtomicU64::new(0);
    static ANSWER: AtomicBool = AtomicBool::new(true);
    let now = u64::try_from(BASE.get_or_init(Instant::now).elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let asked = ASKED_AT.load(Ordering::Acquire);
    let stale = u64::try_from(MAY_PAIR_STALE.as_millis()).unwrap_or(u64::MAX);
    if asked == 0 || now.saturating_sub(asked) >= stale {
        let answer = may_pair_this_process();
        ANSWER.store(answer, Ordering::Release);
        ASKED_AT.store(now, Ordering::Release);
        return answer;
    }
    ANSWER.load(Ordering::Acquire)
}

/// How old [`may_pair_this_process_recently`]'s answer may be.
pub const MAY_PAIR_STALE: Duration = Duration::from_secs(1);

/// Counters of a drained-or-draining sockhash directory (for tests).
pub fn draining_counters(d: &Draining) -> Result<Counters, BypassError> {
    read_counters(&d.pin.join(STATS_PIN))
}
