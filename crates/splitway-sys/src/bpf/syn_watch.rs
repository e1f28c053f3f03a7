//! Early SYN: a tc ingress BPF program (`bpf/syn_watch.c`) that reports each
//! client's TCP SYN to user space, so the relay can start the next leg while
//! the kernel is still completing the client's handshake (KTCP's "Early
//! SYN"). The head start over `accept()` is about one client RTT.
//!
//! # What an event means
//!
//! A [`SynEvent`] is a **hint, not a promise**:
//! - every SYN is reported, so a client's SYN retransmissions (lost SYN-ACK,
//!   full accept queue) produce duplicate events with the same 4-tuple;
//! - a SYN may never become a connection (refused, dropped, a scan, a SYN
//!   flood), and a SYN to a port nobody listens on is reported too;
//! - events are lost when the ring buffer is full
//!   ([`SynWatch::dropped_events`] counts them); IPv6 hop-by-hop, routing,
//!   destination-options and first-fragment headers are walked (up to four),
//!   SYNs behind AH or deeper chains are not reported
//!   ([`SynWatch::ipv6_unwalked`] counts the packets), nor are SYNs in
//!   non-first IPv4 fragments;
//! - order between events from different CPUs is not guaranteed; `at_ns`
//!   (CLOCK_MONOTONIC) is the time the program ran.
//!
//! The relay therefore pairs events with accepted sockets by 4-tuple
//! (`client` = peer address, `original_dst` = local address of the accepted
//! socket; a dual-stack listener sees IPv4 clients as `::ffff:a.b.c.d` while
//! events carry plain IPv4) and expires unmatched events itself.
//!
//! The program never drops or holds a packet: it returns `TC_ACT_UNSPEC`
//! ("no opinion"), so other ingress programs and tc filters on the same
//! device still run, and the SYN is not delayed by user space.
//!
//! # Cost
//!
//! Every ingress packet of a watched device runs the program; non-SYN
//! packets only have their IP and TCP headers read. A reported SYN also
//! reserves and submits a ring buffer record, and when the reader is waiting
//! the kernel wakes it through an irq_work, which is charged to that SYN's
//! softirq. [`SynWatch::program_stats`] reports the kernel's own accounting
//! (with `sysctl kernel.bpf_stats_enabled=1`).
//!
//! # Attaching
//!
//! Interfaces are looked up in the **calling thread's** network namespace.
//! [`SynWatch::attach`] remembers that namespace and detaches there on drop,
//! so a `SynWatch` created inside a namespace (e.g. in
//! [`crate::netns::Netns::run_in`]) can be used and dropped from any thread.
//! On kernels with TCX (6.6+) the program is attached as a TCX link, which
//! needs no qdisc and disappears with the process even if it crashes; older
//! kernels use a cls_bpf direct-action filter on a clsact qdisc (added if
//! missing and then removed again on drop; a syn_watch filter left behind by
//! a crashed run is replaced). Both work on L3-only devices
//! (TUN): the program reads headers relative to the network header.

pub(super) mod event;

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::links::Link as _;
use aya::programs::tc::{NlOptions, SchedClassifierLink, TcAttachOptions};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType, TcError};
use aya::util::KernelVersion;
use aya::{Ebpf, EbpfLoader};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// CLOCK_MONOTONIC in nanoseconds: the clock of [`SynEvent::at_ns`]
/// (`bpf_ktime_get_ns`), for measuring an event's age.
pub use crate::rt::now_ns as monotonic_now_ns;
pub use event::{SynEvent, TcpOptions};

use crate::SysError;

/// The compiled program, built by `build.rs` from `bpf/syn_watch.c`.
static SYN_WATCH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/syn_watch.o"));

const PROGRAM: &str = "syn_watch";
const EVENTS_MAP: &str = "SW_EVENTS";
const PORTS_MAP: &str = "SW_PORTS";
const DROPPED_MAP: &str = "SW_DROPPED";
const NEAR_MAP: &str = "SW_NEAR";
const FILTER_PORTS_GLOBAL: &str = "SW_FILTER_PORTS";

// SW_PORTS value bits, as in bpf/syn_watch.c.
const PORT_PLAIN: u8 = 1;
const PORT_SYNOPT: u8 = 2;

/// SYNs from a near prefix ([`SynWatch::set_near`]) are reported for one
/// client port in this many (as `SW_NEAR_SAMPLE` in the C).
pub const NEAR_SAMPLE: u16 = 16;

/// Whether a near prefix's SYN from `client_port` is reported: bits 1-4
/// all 0, because connect() picks even ports, consecutive ones 2 apart (a
/// test of the low bits would sample one in 8, or none).
pub fn near_sample(client_port: u16) -> bool {
    (client_port >> 1).is_multiple_of(NEAR_SAMPLE)
}

/// A client prefix as `SW_NEAR` keys it: IPv4 /24, IPv6 /64 (v4-mapped
/// addresses count as IPv4).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NearKey {
    pub(super) family: u8,
    _pad: [u8; 7],
    pub(super) prefix: [u8; 8],
}
// SAFETY: plain-old-data with no implicit padding (1 + 7 + 8 = 16 bytes,
// align 1), every bit pattern valid.
unsafe impl aya::Pod for NearKey {}

/// The near prefix (`SW_NEAR`'s unit) that `ip` belongs to, as an address
/// with the host bits zero: IPv4 /24, IPv6 /64; v4-mapped addresses count
/// as IPv4.
pub fn near_prefix(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            IpAddr::from([a, b, c, 0])
        }
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            o[8..].fill(0);
            IpAddr::from(o)
        }
    }
}

impl NearKey {
    fn of(ip: IpAddr) -> NearKey {
        let mut prefix = [0u8; 8];
        // The host bits are zero, so whole leading bytes are the C's key.
        let family = match near_prefix(ip) {
            IpAddr::V4(v4) => {
                prefix[..4].copy_from_slice(&v4.octets());
                4
            }
            IpAddr::V6(v6) => {
                prefix.copy_from_slice(&v6.octets()[..8]);
                6
            }
        };
        NearKey {
            family,
            _pad: [0; 7],
            prefix,
        }
    }
}

/// Which ports get every SYN reported (interception).
#[derive(Debug, Clone, Copy)]
pub enum PlainPorts<'a> {
    /// Every port.
    All,
    /// Only these (none: only option-carrying SYNs are reported).
    Only(&'a [u16]),
}

/// How the program is hooked into tc ingress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcHook {
    /// TCX if the kernel has it (6.6+), else cls_bpf.
    Auto,
    /// A TCX link (kernel 6.6+), placed first among TCX programs. Needs no
    /// qdisc; invisible to `tc filter show`, visible to `bpftool net`.
    Tcx,
    /// A cls_bpf direct-action filter on the clsact qdisc (netlink).
    ClsBpf,
}

impl TcHook {
    fn resolve(self) -> TcHook {
        match self {
            TcHook::Auto if kernel_has_tcx() => TcHook::Tcx,
            TcHook::Auto => TcHook::ClsBpf,
            other => other,
        }
    }
}

fn kernel_has_tcx() -> bool {
    KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0))
}

/// Kernel-side cost of the program, from [`SynWatch::program_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramStats {
    /// The kernel's program id (`bpftool prog show id ID`).
    pub id: u32,
    /// Packets the program ran on, on every attached interface.
    pub runs: u64,
    /// Total time spent in the program.
    pub run_time_ns: u64,
}

/// One interface the program is attached to.
#[derive(Debug)]
struct Attachment {
    interface: String,
    /// `None` once detached.
    link: Option<SchedClassifierLink>,
    /// We added the clsact qdisc, so we remove it again.
    created_clsact: bool,
}

/// The ring buffer before and after registration with the tokio reactor:
/// registration needs a runtime, and `attach` may run on a plain thread.
enum Ring {
    Plain(RingBuf<MapData>),
    Registered(AsyncFd<RingBuf<MapData>>),
    /// Transient, only while switching between the two states above.
    Moving,
}

/// A loaded and attached SYN watcher. Dropping it detaches the program from
/// every interface (in the namespace it was attached in) and unloads it.
pub struct SynWatch {
    attachments: Vec<Attachment>,
    ring: Ring,
    dropped: PerCpuArray<MapData, u64>,
    near: BpfHashMap<MapData, NearKey, u8>,
    /// The network namespace `attach` ran in: netlink detaches by ifindex,
    /// which is only meaningful there.
    netns: File,
    hook: TcHook,
    // Declared last so it drops last: owns the program.
    ebpf: Ebpf,
}

impl SynWatch {
    /// Loads the program, watches SYNs to `ports` (every destination port if
    /// `ports` is empty) and attaches it to tc ingress of each interface in
    /// the calling thread's network namespace, using TCX where available.
    pub fn attach(interfaces: &[String], ports: &[u16]) -> Result<SynWatch, SysError> {
        SynWatch::attach_with(interfaces, ports, TcHook::Auto)
    }

    /// [`SynWatch::attach`] with an explicit hook.
    pub fn attach_with(
        interfaces: &[String],
        ports: &[u16],
        hook: TcHook,
    ) -> Result<SynWatch, SysError> {
        let plain = if ports.is_empty() {
            PlainPorts::All
        } else {
            PlainPorts::Only(ports)
        };
        SynWatch::attach_full(interfaces, plain, &[], hook)
    }

    /// Watches plain SYNs to `plain` ports and, on `option_ports`
    /// (syn-option listeners), only SYNs carrying splitway's destination
    /// option, reported with their TCP options ([`SynEvent::options`]).
    pub fn attach_full(
        interfaces: &[String],
        plain: PlainPorts<'_>,
        option_ports: &[u16],
        hook: TcHook,
    ) -> Result<SynWatch, SysError> {
        let hook = hook.resolve();
        let netns = File::open("/proc/thread-self/ns/net")
            .map_err(|e| SysError::io("open /proc/thread-self/ns/net", e))?;
        let plain_ports = match plain {
            PlainPorts::All => None,
            PlainPorts::Only(p) => Some(p),
        };
        let mut ebpf = load(plain_ports.is_some())?;

        let mut port_map: BpfHashMap<MapData, u16, u8> = take_map(&mut ebpf, PORTS_MAP)?
            .try_into()
            .map_err(|e| bpf_err(format!("open map {PORTS_MAP}"), e))?;
        let mut bits: std::collections::BTreeMap<u16, u8> = Default::default();
        for &port in plain_ports.unwrap_or_default() {
            *bits.entry(port).or_default() |= PORT_PLAIN;
        }
        for &port in option_ports {
            *bits.entry(port).or_default() |= PORT_SYNOPT;
        }
        for (port, b) in bits {
            port_map
                .insert(port, b, 0)
                .map_err(|e| bpf_err(format!("watch port {port}"), e))?;
        }
        let ring: RingBuf<MapData> = take_map(&mut ebpf, EVENTS_MAP)?
            .try_into()
            .map_err(|e| bpf_err(format!("open map {EVENTS_MAP}"), e))?;
        let dropped: PerCpuArray<MapData, u64> = take_map(&mut ebpf, DROPPED_MAP)?
            .try_into()
            .map_err(|e| bpf_err(format!("open map {DROPPED_MAP}"), e))?;

        let near: BpfHashMap<MapData, NearKey, u8> = take_map(&mut ebpf, NEAR_MAP)?
            .try_into()
            .map_err(|e| bpf_err(format!("open map {NEAR_MAP}"), e))?;

        let mut watch = SynWatch {
            attachments: Vec::with_capacity(interfaces.len()),
            ring: Ring::Plain(ring),
            dropped,
            near,
            netns,
            hook,
            ebpf,
        };
        // On error `watch` drops here and detaches what was attached so far.
        for interface in interfaces {
            watch.attach_one(interface)?;
        }
        Ok(watch)
    }

    fn attach_one(&mut self, interface: &str) -> Result<(), SysError> {
        let mut attachment = Attachment {
            interface: interface.to_owned(),
            link: None,
            created_clsact: false,
        };
        let options = match self.hook {
            TcHook::Tcx => TcAttachOptions::TcxOrder(LinkOrder::first()),
            TcHook::ClsBpf | TcHook::Auto => {
                attachment.created_clsact = add_clsact(interface)?;
                if !attachment.created_clsact {
                    remove_stale_filters(interface)?;
                }
                TcAttachOptions::Netlink(NlOptions::default())
            }
        };
        // Pushed before attaching so Drop removes a qdisc we just created
        // even if attaching fails.
        self.attachments.push(attachment);
        let program = program_mut(&mut self.ebpf)?;
        let link_id = program
            .attach_with_options(interface, TcAttachType::Ingress, options)
            .map_err(|e| bpf_err(format!("attach tc ingress on {interface}"), e))?;
        let link = program
            .take_link(link_id)
            .map_err(|e| bpf_err(format!("take link on {interface}"), e))?;
        if let Some(last) = self.attachments.last_mut() {
            last.link = Some(link);
        }
        Ok(())
    }

    /// Can this kernel and process load the program and attach it? Loads
    /// it, and on TCX kernels attaches it to `lo` of the calling thread's
    /// namespace and detaches it again at once. On older kernels it only
    /// loads (attaching there would mean adding a qdisc to `lo`).
    pub fn probe() -> Result<(), SysError> {
        let mut ebpf = load(true)?;
        if TcHook::Auto.resolve() == TcHook::Tcx {
            let program = program_mut(&mut ebpf)?;
            let link_id = program
                .attach_with_options(
                    "lo",
                    TcAttachType::Ingress,
                    TcAttachOptions::TcxOrder(LinkOrder::last()),
                )
                .map_err(|e| bpf_err("probe: attach tcx ingress on lo", e))?;
            program
                .detach(link_id)
                .map_err(|e| bpf_err("probe: detach from lo", e))?;
        }
        Ok(())
    }

    /// Which hook the program is attached with (never `Auto`).
    pub fn hook(&self) -> TcHook {
        self.hook
    }

    /// The next event already in the ring buffer, without waiting.
    pub fn try_next(&mut self) -> Result<Option<SynEvent>, SysError> {
        let ring = match &mut self.ring {
            Ring::Plain(ring) => ring,
            Ring::Registered(fd) => fd.get_mut(),
            Ring::Moving => return Err(SysError::Internal("ring buffer lost".into())),
        };
        match ring.next() {
            Some(record) => SynEvent::decode(&record).map(Some),
            None => Ok(None),
        }
    }

    /// Waits for the next event. Needs a tokio runtime: the ring buffer's fd
    /// is registered with the runtime of the first call, and registered
    /// again with the current one if that runtime has shut down.
    /// Cancel-safe: an event is only consumed when it is returned.
    pub async fn next(&mut self) -> Result<SynEvent, SysError> {
        let mut reregistered = false;
        loop {
            if let Some(event) = self.try_next()? {
                return Ok(event);
            }
            // The kernel wakes the reader only when it has caught up, so
            // readiness is cleared before the ring is checked again (top of
            // the loop), never after: a record submitted in between still
            // sets readiness or is seen by that check.
            let waited = match self.registered()?.readable().await {
                Ok(mut guard) => {
                    guard.clear_ready();
                    Ok(())
                }
                Err(e) => Err(e),
            };
            if let Err(e) = waited {
                if reregistered {
                    return Err(SysError::io("wait for SYN ring buffer", e));
                }
                // Typically "runtime is being shut down": the fd belongs to
                // an earlier runtime. Hand it to the current one.
                reregistered = true;
                self.deregister();
            }
        }
    }

    fn deregister(&mut self) {
        if let Ring::Registered(_) = self.ring {
            let Ring::Registered(fd) = std::mem::replace(&mut self.ring, Ring::Moving) else {
                unreachable!("checked just above");
            };
            self.ring = Ring::Plain(fd.into_inner());
        }
    }

    fn registered(&mut self) -> Result<&AsyncFd<RingBuf<MapData>>, SysError> {
        if let Ring::Plain(_) = self.ring {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(SysError::Internal(
                    "SynWatch::next needs a tokio runtime".into(),
                ));
            }
            let Ring::Plain(ring) = std::mem::replace(&mut self.ring, Ring::Moving) else {
                unreachable!("checked just above");
            };
            // SAFETY: the RingBuf owns its map fd, keeps it open for its whole
            // life and always returns that same fd; it is only ever borrowed
            // (get_mut to consume records), never replaced, while registered.
            match unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) } {
                Ok(fd) => self.ring = Ring::Registered(fd),
                Err(e) => {
                    let (ring, cause) = e.into_parts();
                    self.ring = Ring::Plain(ring);
                    return Err(SysError::io("register SYN ring buffer with tokio", cause));
                }
            }
        }
        match &self.ring {
            Ring::Registered(fd) => Ok(fd),
            _ => Err(SysError::Internal("ring buffer lost".into())),
        }
    }

    /// The program's cumulative run count and run time over every packet it
    /// saw (not only SYNs). The kernel counts only while the sysctl
    /// `kernel.bpf_stats_enabled` is 1 (off by default: the accounting
    /// itself costs tens of ns per run); otherwise both are 0.
    pub fn program_stats(&self) -> Result<ProgramStats, SysError> {
        let program: &SchedClassifier = self
            .ebpf
            .program(PROGRAM)
            .ok_or_else(|| SysError::Bpf {
                op: "find program".into(),
                detail: format!("{PROGRAM} missing from the object"),
            })?
            .try_into()
            .map_err(|e| bpf_err(format!("program {PROGRAM}"), e))?;
        let info = program
            .info()
            .map_err(|e| bpf_err(format!("query {PROGRAM} info"), e))?;
        Ok(ProgramStats {
            id: info.id(),
            runs: info.run_count(),
            run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
        })
    }

    /// Marks the prefix of `client` (IPv4 /24, IPv6 /64) near, or no longer
    /// near: plain SYNs from a near prefix are reported only from client
    /// ports for which [`near_sample`] holds.
    pub fn set_near(&mut self, client: IpAddr, near: bool) -> Result<(), SysError> {
        let key = NearKey::of(client);
        let r = if near {
            self.near.insert(key, 1, 0)
        } else {
            match self.near.remove(&key) {
                // Already gone: what was asked for.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
                {
                    Ok(())
                }
                other => other,
            }
        };
        r.map_err(|e| bpf_err(format!("update {NEAR_MAP} for {client}"), e))
    }

    /// Events lost because the ring buffer was full (user space too slow),
    /// summed over CPUs, since attach.
    pub fn dropped_events(&self) -> Result<u64, SysError> {
        self.counted(0)
    }

    /// IPv6 packets whose TCP header, if any, lay behind extension headers
    /// the program does not walk (AH, or more than four): a SYN among them
    /// was not reported. Hop-by-hop, routing, destination-options and first
    /// fragment headers are walked. Summed over CPUs, since attach.
    pub fn ipv6_unwalked(&self) -> Result<u64, SysError> {
        self.counted(1)
    }

    fn counted(&self, index: u32) -> Result<u64, SysError> {
        let per_cpu = self
            .dropped
            .get(&index, 0)
            .map_err(|e| bpf_err(format!("read {DROPPED_MAP}[{index}]"), e))?;
        Ok(per_cpu.iter().sum())
    }

    /// Detaches from every interface. cls_bpf filters are removed from a
    /// helper thread that enters the namespace `attach` ran in (netlink
    /// addresses devices by index, per namespace); TCX links are fds and
    /// need no namespace.
    fn detach_all(&mut self) -> Vec<SysError> {
        if self.attachments.is_empty() {
            return Vec::new();
        }
        let attachments = std::mem::take(&mut self.attachments);
        if self.hook == TcHook::Tcx {
            // TCX links are file descriptors: namespace-independent.
            return detach_attachments(attachments);
        }
        let netns = &self.netns;
        std::thread::scope(|scope| {
            scope
                .spawn(move || -> Vec<SysError> {
                    // SAFETY: setns only changes this (helper) thread's
                    // network namespace; `netns` is an open namespace fd
                    // borrowed for the duration of the call.
                    let rc = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) };
                    if rc != 0 {
                        return vec![SysError::io(
                            "setns into the SYN watcher's namespace",
                            std::io::Error::last_os_error(),
                        )];
                    }
                    detach_attachments(attachments)
                })
                .join()
                .unwrap_or_else(|_| vec![SysError::Internal("detach thread panicked".into())])
        })
    }
}

impl std::fmt::Debug for SynWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynWatch")
            .field("hook", &self.hook)
            .field("attachments", &self.attachments)
            .finish_non_exhaustive()
    }
}

impl Drop for SynWatch {
    fn drop(&mut self) {
        for error in self.detach_all() {
            tracing::warn!(%error, "SYN watcher: detaching failed");
        }
    }
}

fn detach_attachments(attachments: Vec<Attachment>) -> Vec<SysError> {
    let mut errors = Vec::new();
    for attachment in attachments {
        if let Some(link) = attachment.link
            && let Err(e) = link.detach()
        {
            errors.push(bpf_err(
                format!("detach tc ingress on {}", attachment.interface),
                e,
            ));
        }
        if attachment.created_clsact
            && let Err(e) = crate::netns::run(std::process::Command::new("tc").args([
                "qdisc",
                "del",
                "dev",
                &attachment.interface,
                "clsact",
            ]))
        {
            errors.push(e);
        }
    }
    errors
}

/// Removes syn_watch filters left on `interface` by a run that crashed
/// (cls_bpf filters, unlike TCX links, outlive their process).
fn remove_stale_filters(interface: &str) -> Result<(), SysError> {
    match aya::programs::tc::qdisc_detach_program(interface, TcAttachType::Ingress, PROGRAM) {
        Ok(()) => {
            tracing::warn!(interface, "removed a stale syn_watch tc filter");
            Ok(())
        }
        Err(TcError::IoError(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(bpf_err(
            format!("remove stale syn_watch filters on {interface}"),
            e,
        )),
    }
}

/// Adds the clsact qdisc; `Ok(false)` if it was already there.
fn add_clsact(interface: &str) -> Result<bool, SysError> {
    match aya::programs::tc::qdisc_add_clsact(interface) {
        Ok(()) => Ok(true),
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(bpf_err(format!("add clsact qdisc on {interface}"), e)),
    }
}

fn load(filter_ports: bool) -> Result<Ebpf, SysError> {
    if let Some(why) = super::SKIPPED {
        return Err(SysError::Bpf {
            op: "load syn_watch object".into(),
            detail: why.into(),
        });
    }
    let mut ebpf = EbpfLoader::new()
        .override_global(FILTER_PORTS_GLOBAL, &u8::from(filter_ports), true)
        .load(SYN_WATCH_OBJECT)
        .map_err(|e| bpf_err("load syn_watch object", e))?;
    program_mut(&mut ebpf)?
        .load()
        .map_err(|e| bpf_err("load syn_watch program (verifier)", e))?;
    Ok(ebpf)
}

fn program_mut(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, SysError> {
    ebpf.program_mut(PROGRAM)
        .ok_or_else(|| SysError::Bpf {
            op: "find program".into(),
            detail: format!("{PROGRAM} missing from the object"),
        })?
        .try_into()
        .map_err(|e| bpf_err(format!("program {PROGRAM}"), e))
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, SysError> {
    ebpf.take_map(name).ok_or_else(|| SysError::Bpf {
        op: "find map".into(),
        detail: format!("{name} missing from the object"),
    })
}

/// A `SysError::Bpf` with the whole source chain (aya nests the errno and
/// the verifier log below the top-level message).
pub(crate) fn bpf_err(op: impl Into<String>, error: impl std::error::Error) -> SysError {
    let mut detail = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        detail.push_str(": ");
        detail.push_str(&inner.to_string());
        source = inner.source();
    }
    SysError::Bpf {
        op: op.into(),
        detail,
    }
}
