//! The BPF congestion controls this process registered (`splitway_cubic`,
//! ...; see `splitway_sys::cc` and docs/congestion.md).
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

use crate::Config;
use crate::config::LEARNED_WINDOW_CC;

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

/// Every `congestion` key of `cfg` that names a shipped algorithm, with the
/// name, in file order.
pub fn shipped_in(cfg: &Config) -> Vec<(String, String)> {
    let mut uses = Vec::new();
    for (i, p) in cfg.peers.iter().enumerate() {
        uses.push((
            format!("peer[{i}].congestion"),
            p.tuning.congestion.as_ref(),
        ));
    }
    uses.push((
        "direct.congestion".to_owned(),
        cfg.direct.congestion.as_ref(),
    ));
    uses.push((
        "client.congestion".to_owned(),
        cfg.client.congestion.as_ref(),
    ));
    uses.push((
        "upstream.congestion".to_owned(),
        cfg.upstream.congestion.as_ref(),
    ));
    uses.into_iter()
        .filter_map(|(key, cc)| {
            let cc = cc?;
            cc::is_shipped(cc).then(|| (key, cc.clone()))
        })
        .collect()
}

/// Gives every relay leg whose config names no congestion control the
/// learned-window algorithm: legs dialed to each `[[peer]]`, and legs
/// accepted from upstream relays (`[upstream]`) when a peer listener
/// exists. Client and server legs face hosts we do not control and keep
/// the kernel's behaviour. Returns the keys it filled, in file order.
pub fn fill_learned_window(cfg: &mut Config) -> Vec<String> {
    let mut filled = Vec::new();
    for (i, p) in cfg.peers.iter_mut().enumerate() {
        if p.tuning.congestion.is_none() {
            p.tuning.congestion = Some(LEARNED_WINDOW_CC.to_owned());
            filled.push(format!("peer[{i}].congestion"));
        }
    }
    let accepts_relays = cfg.listeners.iter().any(|l| l.mode.accepts_relays());
    if accepts_relays && cfg.upstream.congestion.is_none() {
        cfg.upstream.congestion = Some(LEARNED_WINDOW_CC.to_owned());
        filled.push("upstream.congestion".to_owned());
    }
    filled
}

/// Gives relay legs that name no congestion control the learned-window
/// algorithm once `register` accepts it (the relay: [`ensure`]; `--check`:
/// [`probe`]). If it cannot be registered, `cfg` is left as it was: the
/// legs keep the kernel's default, and the reason goes to `--check`,
/// `/status` and `accel_state`. The keys it filled, or why not.
pub fn learn_windows(
    cfg: &mut Config,
    register: fn(&str) -> Result<(), CcError>,
) -> Result<Vec<String>, String> {
    let mut learning = cfg.clone();
    let keys = fill_learned_window(&mut learning);
    if keys.is_empty() {
        return Ok(keys);
    }
    register(LEARNED_WINDOW_CC).map_err(|e| e.to_string())?;
    *cfg = learning;
    Ok(keys)
}

/// Whether `name` (a shipped algorithm) can be registered here, tried for
/// real (a kernel without struct_ops is named by the trial itself):
/// registered and released at once, nothing pinned; a name another
/// process holds counts as working.
pub fn probe(name: &str) -> Result<(), CcError> {
    cc::register_trial(name).map(drop)
}

/// Registers every shipped algorithm `cfg` uses that this process does not
/// hold yet. The first failure names its key.
pub fn register_for(cfg: &Config) -> Result<(), CongestionError> {
    for (key, name) in shipped_in(cfg) {
        ensure(&name).map_err(|cause| CongestionError {
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

/// For `relay --check`: whether each shipped algorithm `cfg` names can be
/// registered here, tried for real (registered, then released at once; a
/// name a running relay holds counts as working). One line per problem,
/// naming the key.
pub fn check(cfg: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, name) in shipped_in(cfg) {
        if let Err(e) = probe(&name) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_bpf_congestion_control_is_accepted_on_every_leg() {
        let cfg = crate::config::Config::parse_str(
            r#"
            name = "rc"
            [[listen]]
            mode = "socks5"
            addr = "127.0.0.1:1080"
            [direct]
            congestion = "splitway_cubic"
            [client]
            congestion = "splitway_cubic"
            [upstream]
            congestion = "splitway_cubic"
            [[route]]
            dst = "0.0.0.0/0"
            via = "direct"
            "#,
        )
        .expect("shipped name accepted");
        let uses = shipped_in(&cfg);
        let keys: Vec<&str> = uses.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "direct.congestion",
                "client.congestion",
                "upstream.congestion"
            ]
        );
    }
}
