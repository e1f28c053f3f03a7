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

#[cfg(test)]
mod tests {
    use super::*;

    /// The probes answer for this host: root as `id -u` says, and as root
    /// (which `make test` needs) a namespace and, inside a fresh one, the
    /// BPF SYN detector's load and attach.
    #[test]
    fn probes_answer_for_this_host() {
        let out = std::process::Command::new("id")
            .arg("-u")
            .output()
            .expect("run id -u");
        let root = String::from_utf8_lossy(&out.stdout).trim() == "0";
        assert_eq!(is_root(), root);
        let required = std::env::var("SPLITWAY_REQUIRE_NETNS").as_deref() == Ok("1");
        if !root {
            assert!(!required, "SPLITWAY_REQUIRE_NETNS=1 needs root");
            assert!(netns("swtb").is_err(), "namespaces need root");
            return;
        }
        netns::remove_stale("swtb");
        netns("swtb").expect("a namespace as root");
        let ns = Netns::create(&netns::unique_name("swtb")).expect("namespace");
        let attached = ns.run_in(bpf_attach).expect("enter the namespace");
        assert!(
            attached.is_ok() || !required,
            "the BPF SYN detector does not attach here: {attached:?}"
        );
    }
}
