//! The SYN detector's load and attach at start (issue #31). The relay runs
//! it while `nft` installs its rules and another thread registers the
//! congestion controls, and builds the early-SYN table from the outcome.
//! It runs on the relay's own thread rather than one of its own: aya's
//! parse of the kernel's BTF makes megabytes of small allocations, which a
//! short-lived thread would leave in an arena of its own, out of reach of
//! the heap trim before READY=1 (4.4 MB more idle RSS in one start of
//! three when it ran on a thread).

use splitway_sys::SysError;
use splitway_sys::bpf::{PlainPorts, SynWatch, TcHook};

use crate::config::Config;

/// The detector's load: attached, or why not, and where.
pub struct Detector {
    pub attached: Result<SynWatch, SysError>,
    /// The interfaces it watches.
    pub interfaces: Vec<String>,
}

impl Detector {
    /// Loads and attaches the detector in the calling thread's namespace
    /// when the config runs it: early SYN on and strict mode off (strict
    /// mode sees every SYN in its queue).
    pub fn load(cfg: &Config) -> Option<Detector> {
        if cfg.accel.strict || !cfg.accel.early_syn {
            return None;
        }
        let interfaces = super::watched_interfaces(cfg);
        let (ports, option_ports) = super::watched_ports(cfg);
        // Only syn-option listeners watched: no port gets every SYN.
        let attached = SynWatch::attach_full(
            &interfaces,
            PlainPorts::Only(&ports),
            &option_ports,
            TcHook::Auto,
        );
        Some(Detector {
            attached,
            interfaces,
        })
    }
}
