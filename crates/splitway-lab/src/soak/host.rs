//! Host-wide figures the soak records: kernel TCP memory, load, namespace counters.

use std::fs;

use splitway_sys::netns::Netns;

use super::spec::*;

/// `/proc/net/sockstat`'s TCP line: (mem pages, sockets allocated). Both
/// are global to the kernel, whatever namespace reads them.
pub(super) fn tcp_sockstat() -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("TCP:"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let field = |key: &str| -> Option<u64> {
        let i = words.iter().position(|w| *w == key)?;
        words.get(i + 1)?.parse().ok()
    };
    Some((field("mem")?, field("alloc")?))
}

pub(super) fn tcp_mem_limits() -> [u64; 3] {
    let text = fs::read_to_string("/proc/sys/net/ipv4/tcp_mem").unwrap_or_default();
    let mut v = text.split_whitespace().filter_map(|w| w.parse().ok());
    [
        v.next().unwrap_or(0),
        v.next().unwrap_or(0),
        v.next().unwrap_or(0),
    ]
}

pub(super) fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The namespace's TcpExt memory counters, read inside it.
pub(super) fn namespace_counters(label: &str, ns: &Netns) -> NamespaceCounters {
    let mut c = NamespaceCounters {
        namespace: label.into(),
        ..NamespaceCounters::default()
    };
    let Ok(counters) = ns.tcp_ext() else {
        return c;
    };
    let get = |name: &str| counters.get(name).copied().unwrap_or(0);
    c.memory_pressures = get("TCPMemoryPressures");
    c.rcvq_drops = get("TCPRcvQDrop");
    c.prune_called = get("PruneCalled");
    c.abort_on_memory = get("TCPAbortOnMemory");
    c
}
