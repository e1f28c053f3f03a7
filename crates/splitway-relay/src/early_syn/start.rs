//! The SYN detector's load and attach at start (issue #31), on a thread of
//! its own while `nft` installs the relay's rules, another thread registers
//! the congestion controls and the relay binds its listeners; the relay
//! builds the early-SYN table from the outcome. Most of the load is aya's
//! parse of the kernel's BTF: megabytes of small allocations, which the
//! relay binary keeps in the one heap arena the heap trim before READY=1
//! reaches (`splitway_sys::mem::one_heap_arena`).

use splitway_sys::SysError;
use splitway_sys::bpf::{PlainPorts, SynWatch, TcHook};

use crate::beside::Beside;
use crate::config::Config;

/// The detector's load: attached, or why not, and where.
pub struct Detector {
    pub attached: Result<SynWatch, SysError>,
    /// The interfaces it watches.
    pub interfaces: Vec<String>,
}

impl Detector {
    /// Starts loading and attaching the detector when the config runs it:
    /// early SYN on and strict mode off (strict mode sees every SYN in its
    /// queue). The thread starts in the caller's network namespace.
    pub fn start(cfg: &Config) -> Option<Beside<Detector>> {
        if cfg.accel.strict || !cfg.accel.early_syn {
            return None;
        }
        let interfaces = super::watched_interfaces(cfg);
        let (ports, option_ports) = super::watched_ports(cfg);
        Some(Beside::start("load-syn-watch", move || {
            // Only syn-option listeners watched: no port gets every SYN.
            let attached = SynWatch::attach_full(
                &interfaces,
                PlainPorts::Only(&ports),
                &option_ports,
                TcHook::Auto,
            );
            Detector {
                attached,
                interfaces,
            }
        }))
    }
}
