//! Congestion control chosen per leg (issue #31's room): the `congestion`
//! keys' names (`config.rs`, called by the config's leg tuning), and the
//! BPF congestion controls this process registered (`splitway_cubic`,
//! ...; see `splitway_sys::cc` and docs/congestion.md). Sockets select
//! theirs where they are tuned (`tuning.rs`); which relay legs get the
//! learned-window algorithm by default is `learned_window`'s.
//!
//! Registration is per process, not per relay: names are machine-wide, and
//! each one is held by one link fd until the process exits (even by
//! SIGKILL), so the registry is a process-wide static. The relay registers
//! what its config uses at start; a reload registers what the new config
//! adds (load on demand); nothing is unregistered while the process runs,
//! since connections set up before a reload may still be opening legs with
//! the old choice.
//!
//! Only sockets the relay configures with `TCP_CONGESTION` use these
//! algorithms: registering one changes no default, so other processes'
//! sockets are never affected.

use std::collections::BTreeMap;
use std::sync::Mutex;

use splitway_api as api;
use splitway_sys::cc::{self, CcError, CcRegistered, Registration};
use thiserror::Error;
use tracing::{info, warn};

pub mod config;
mod start;

pub use start::{Registered, Registering};

/// A shipped algorithm a config names that could not be registered.
#[derive(Debug, Error)]
#[error("{key}: `{name}` could not be registered: {cause}")]
pub struct CongestionError {
    /// The config key, e.g. `peer[0].congestion`.
    pub key: String,
    pub name: String,
    pub cause: CcError,
}

enum Held {
    /// The link that keeps the algorithm registered.
    Owned { _link: Registration },
    /// Registered by another process when we asked; we re-register if it
    /// disappears (see [`ensure`]).
    Shared,
}

static REGISTRY: Mutex<BTreeMap<&'static str, Held>> = Mutex::new(BTreeMap::new());

/// The uses (key path, algorithm) that name a shipped algorithm.
fn shipped(uses: &[(String, String)]) -> impl Iterator<Item = &(String, String)> {
    uses.iter().filter(|(_, name)| cc::is_shipped(name))
}

/// Whether `name` (a shipped algorithm) can be registered here, tried for
/// real (a kernel without struct_ops is named by the trial itself):
/// registered and released at once, nothing pinned; a name another
/// process holds counts as working.
pub fn probe(name: &str) -> Result<(), CcError> {
    cc::register_trial(name).map(drop)
}

/// Registers every shipped algorithm of `uses` (a config's
/// `congestion_keys`) that this process does not hold yet. The first
/// failure names its key.
pub fn register_for(uses: &[(String, String)]) -> Result<(), CongestionError> {
    for (key, name) in shipped(uses) {
        ensure(name).map_err(|cause| CongestionError {
            key: key.clone(),
            name: name.clone(),
            cause,
        })?;
    }
    Ok(())
}

/// Makes sure `name` (a shipped algorithm) is registered machine-wide:
/// registers it if this process does not hold it, or if another process
/// held it and has since exited.
pub fn ensure(name: &str) -> Result<(), CcError> {
    let mut reg = REGISTRY.lock().expect("congestion registry lock");
    let known = reg.iter().find(|(n, _)| **n == name).map(|(n, h)| (*n, h));
    match known {
        Some((_, Held::Owned { .. })) => return Ok(()),
        Some((_, Held::Shared)) if cc::is_available(name) => return Ok(()),
        _ => {}
    }
    match cc::register(name)? {
        CcRegistered::Owned(r) => {
            info!(algorithm = r.name(), "registered BPF congestion control");
            reg.insert(r.name(), Held::Owned { _link: r });
        }
        CcRegistered::ByAnotherProcess => {
            warn!(
                algorithm = name,
                "BPF congestion control already registered by another process; using it (re-registered here if it goes away)"
            );
            let name = cc::shipped_names()
                .find(|n| *n == name)
                .expect("register() accepted a shipped name");
            reg.insert(name, Held::Shared);
        }
    }
    Ok(())
}

/// What `ctl status` shows: each shipped algorithm this process uses and
/// who holds its registration.
pub fn status() -> Vec<api::CongestionControl> {
    let reg = REGISTRY.lock().expect("congestion registry lock");
    reg.iter()
        .map(|(name, held)| api::CongestionControl {
            name: (*name).to_owned(),
            held_by: match held {
                Held::Owned { .. } => "this process",
                Held::Shared => "another process",
            }
            .to_owned(),
            available: cc::is_available(name),
        })
        .collect()
}

/// For `relay --check`: whether each shipped algorithm of `uses` (a
/// config's `congestion_keys`) can be registered here, tried for real
/// (registered, then released at once; a name a running relay holds
/// counts as working). One line per problem, naming the key.
pub fn check(uses: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, name) in shipped(uses) {
        if let Err(e) = probe(name) {
            problems.push(format!(
                "{key}: `{name}` is a BPF (struct_ops) congestion control and cannot be used on this host: {e}"
            ));
        }
    }
    problems
}

/// Whether this process registered the shipped algorithm `name`.
pub fn registered_here(name: &str) -> bool {
    REGISTRY
        .lock()
        .expect("congestion registry lock")
        .contains_key(name)
}
