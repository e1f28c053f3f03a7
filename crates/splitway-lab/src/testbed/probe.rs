//! What this host can do, asked before a test or a run needs it.

use splitway_sys::netns::{self, Netns};

/// Whether the effective uid is 0 (the `Uid:` line of /proc/self/status).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Whether network namespaces can be created here: root, and one namespace
/// named with `prefix` created (and removed again). `Err` says why not.
pub fn netns(prefix: &str) -> Result<(), String> {
    if !is_root() {
        return Err("not running as root".into());
    }
    let name = netns::unique_name(prefix);
    Netns::create(&name)
        .map(drop)
        .map_err(|e| format!("cannot create a network namespace: {e}"))
}

/// Whether the BPF SYN detector loads and attaches here (early SYN,
/// syn-option `watch`). `Err` says why not.
pub fn bpf_attach() -> Result<(), String> {
    splitway_sys::bpf::SynWatch::probe().map_err(|e| e.to_string())
}
