//! What the soak is: its addresses, ports and limits, its options, and the
//! figures it records.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

pub(super) const PREFIX: &str = "sws";
// Addresses of the testbed chain (`testbed::chain`, two relays).
pub(super) const RC_WEST: &str = "10.0.1.2";
pub(super) const RS_WEST: &str = "10.0.12.2";
pub(super) const SERVER: &str = "10.0.3.2";
pub(super) const SOCKS_PORT: u16 = 1080;
pub(super) const PEER_PORT: u16 = 7100;
pub(super) const SERVER_PORT: u16 = 5001;
/// Admin port of a host's first relay process; the next ones count up.
pub(super) const ADMIN_BASE_PORT: u16 = 9090;
/// Longest the ramp (every connection set up) may take.
pub(super) const RAMP_LIMIT: Duration = Duration::from_secs(300);
/// Connection setups in progress at once (keeps SYN queues from overflowing).
pub(super) const SETUP_CONCURRENCY: usize = 256;
/// Descriptors a relay needs beyond two per connection: listeners, admin,
/// epoll, and splice pipes held while bytes are in flight.
pub(super) const RELAY_FD_HEADROOM: u64 = 400;
/// Descriptors a relay may hold after the run beyond its baseline besides
/// its splice pipe cache (bounded per thread, see [`fd_margin`]).
pub(super) const FD_SLACK: u64 = 16;
/// Memory a relay may keep after the run beyond its baseline: allocator
/// caches, not per-connection state (10,000 connections leaking even 1 KiB
/// each would exceed it).
pub(super) const RSS_MARGIN: u64 = 16 * 1024 * 1024;
/// Largest socket buffer (tcp_rmem/tcp_wmem max) in the soak's namespaces.
/// Veth legs without delay need little (this is many BDPs); the defaults
/// (6–32 MiB) let tens of thousands of sockets exhaust the host's tcp_mem.
pub(super) const SOCKET_BUFFER_MAX: u64 = 256 * 1024;
/// An exchange moving at most this much (both directions) needs no bulk
/// slot: small messages flow freely and keep every connection in use.
pub(super) const SMALL_EXCHANGE: u64 = 4096;
/// How long after a round's end its connections may take to finish their
/// exchange and close; beyond it they count as stalled (an error).
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// Descriptors a generator process needs beyond one socket per connection.
pub(super) const GENERATOR_FD_HEADROOM: u64 = 256;
/// Share of connections one relay process may get above an even split:
/// SO_REUSEPORT spreads them by hash, not exactly evenly.
pub(super) const REUSEPORT_SKEW_PERCENT: u64 = 10;

/// `splitway lab soak` options.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Concurrent split connections, all open for the whole run.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// How long the connections keep exchanging data (e.g. 120s, 10m).
    #[arg(long, default_value = "10m", value_parser = splitway_control::params::duration_arg)]
    pub duration: Duration,
    /// Rounds: each opens every connection, exchanges for duration/rounds,
    /// closes them all; relay memory after each round shows a leak (growth)
    /// apart from allocator retention (a plateau).
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Mean pause between two exchanges on one connection, in ms.
    #[arg(long, default_value_t = 1000)]
    pub pause_ms: u64,
    /// Largest transfer of one exchange in one direction (bytes).
    #[arg(long, default_value_t = 2 * 1024 * 1024)]
    pub max_size: u64,
    /// splitway processes per relay host, sharing its listener with
    /// SO_REUSEPORT (each holds two sockets per connection it carries, and
    /// the open-file limit is per process).
    #[arg(long, default_value_t = 2)]
    pub relay_processes: usize,
    /// Exchanges larger than 4 KiB running at once over all connections
    /// (the others wait their turn): bounds the kernel socket memory the
    /// soak's own traffic takes.
    #[arg(long, default_value_t = 128)]
    pub bulk_slots: usize,
    /// Also write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Internal: run only the soak's server (inside the server namespace,
    /// in its own process so that each side has its own descriptor limit).
    #[arg(long, hide = true)]
    pub serve: bool,
}

/// Descriptors and memory of one relay at one moment.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Resources {
    pub fds: u64,
    pub rss_bytes: u64,
}

/// Descriptors a relay may keep after every connection closed: each of
/// its threads may cache up to `POOL_PER_THREAD` empty pipes (two
/// descriptors each) for reuse, plus a little slack.
pub(super) fn fd_margin(pid: u32) -> u64 {
    let threads = fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(1);
    threads * 2 * splitway_sys::splice::POOL_PER_THREAD as u64 + FD_SLACK
}

pub(super) fn resources(pid: u32) -> Option<Resources> {
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(Resources {
        fds,
        rss_bytes: kib * 1024,
    })
}

/// One relay process's figures over the run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RelayFigures {
    /// `rc1`, `rc2`, `rs1`, ...
    pub name: String,
    /// `rc` or `rs`.
    pub host: String,
    pub baseline: Resources,
    pub peak: Resources,
    pub after: Resources,
    /// After each round, every connection closed.
    pub after_rounds: Vec<Resources>,
    pub peak_connections_open: u64,
}

/// One relay host's processes together: sums taken at the same sample.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HostFigures {
    pub name: String,
    pub processes: usize,
    pub baseline: Resources,
    pub peak: Resources,
    pub after: Resources,
}

/// The host's TCP memory (`/proc/net/sockstat` "mem", in pages; global to
/// the kernel, so other work on the host counts too) against `tcp_mem`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TcpMemory {
    /// `net.ipv4.tcp_mem`: below, pressure, high (pages).
    pub tcp_mem: [u64; 3],
    pub baseline_pages: u64,
    pub peak_pages: u64,
    /// Sockets allocated host-wide at the TCP memory peak.
    pub sockets_at_peak: u64,
    /// Samples at or above the pressure threshold.
    pub samples_over_pressure: u64,
}

/// TcpExt counters of one soak namespace after the run (memory trouble
/// shows here: pressure entered, receive queue drops, pruning).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NamespaceCounters {
    pub namespace: String,
    pub memory_pressures: u64,
    pub rcvq_drops: u64,
    pub prune_called: u64,
    pub abort_on_memory: u64,
}

/// What a soak run did and saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SoakReport {
    pub connections_requested: usize,
    pub connections_made: u64,
    pub peak_concurrent: u64,
    pub duration_s: f64,
    pub ramp_s: f64,
    pub exchanges: u64,
    pub bytes_checked: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub relays: Vec<RelayFigures>,
    pub hosts: Vec<HostFigures>,
    pub tcp_memory: TcpMemory,
    pub namespaces: Vec<NamespaceCounters>,
    /// Load average (1, 5, 15 min) at the start and at the end.
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub failures: Vec<String>,
    pub notes: Vec<String>,
}
