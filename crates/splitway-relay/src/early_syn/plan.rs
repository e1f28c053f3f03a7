//! The state and reason of early SYN's status line, from the pieces of the
//! config it needs (`Asked`) and the detector's outcome: `accel.rs`'s list
//! wraps it.

use crate::accel_state::AccelState::{self, Active, Off, Unavailable};
use crate::accel_state::off_reason;
use crate::config::{Config, Switch};

use super::watched_interfaces;

/// What the config asks of early SYN.
#[derive(Debug, Clone, Default)]
pub struct Asked {
    /// `[accel] early_syn` as resolved.
    pub on: bool,
    /// The file says `early_syn = false`.
    pub turned_off: bool,
    /// The file leaves it on `auto`, which samples LAN prefixes' SYNs.
    pub auto: bool,
    /// `[accel] strict`: it holds the SYNs and starts their legs itself.
    pub strict: bool,
    /// A tproxy listener with `intercept`.
    pub intercepting: bool,
    /// That, or a syn-option listener with `watch`: somewhere to see SYNs.
    pub watching: bool,
    /// Where the detector attaches (`watched_interfaces`).
    pub interfaces: Vec<String>,
}

impl Asked {
    pub fn of(cfg: &Config) -> Asked {
        let requested = cfg.accel.requested.early_syn;
        let listeners = &cfg.listeners;
        let intercepting = listeners
            .iter()
            .any(|l| l.mode.intercepts() && l.intercept.is_some());
        Asked {
            on: cfg.accel.early_syn,
            turned_off: requested == Switch::Off,
            auto: requested == Switch::Auto,
            strict: cfg.accel.strict,
            intercepting,
            watching: intercepting
                || listeners
                    .iter()
                    .any(|l| l.mode.syn_carries_dst() && !l.watch.is_empty()),
            interfaces: watched_interfaces(cfg),
        }
    }
}

/// Early SYN's line. `detector`: the outcome of loading (`--check`:
/// probing) the SYN detector, None when not tried yet.
pub fn state(asked: &Asked, detector: Option<&Result<String, String>>) -> (AccelState, String) {
    if asked.strict {
        return (
            Off,
            "strict mode holds the SYNs and starts their legs itself".into(),
        );
    }
    if !asked.on {
        // Resolved off with somewhere to watch: only PROXY headers do that.
        let why = if asked.watching {
            "a tproxy listener takes PROXY headers (the client is known only after accept)"
        } else {
            "no tproxy listener with `intercept` or syn-option listener with `watch` (nowhere to watch SYNs)"
        };
        return (Off, off_reason(asked.turned_off, "early_syn", why));
    }
    // What `auto` adds to `true` for intercepted SYNs (`NearClients`; SYNs
    // carrying the agent's option are always reported).
    let near = if asked.auto && asked.intercepting {
        "; client prefixes whose handshakes take under 200 µs (a LAN) get 1 SYN in 16 reported"
    } else {
        ""
    };
    // What the detector cannot see, said where an operator looks first.
    let unwalked = "; IPv6 SYNs behind AH or over four extension headers start at accept (early_syn_total{outcome=\"ipv6_unwalked\"})";
    match detector {
        None => (
            Active,
            format!(
                "BPF SYN detector to attach on {}{near}{unwalked}",
                asked.interfaces.join(", ")
            ),
        ),
        Some(Ok(how)) => (Active, format!("{how}{near}{unwalked}")),
        Some(Err(e)) => (Unavailable, format!("{e}; legs start at accept")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNWALKED: &str = "; IPv6 SYNs behind AH or over four extension headers start at accept (early_syn_total{outcome=\"ipv6_unwalked\"})";
    const NEAR: &str =
        "; client prefixes whose handshakes take under 200 µs (a LAN) get 1 SYN in 16 reported";

    /// Auto, one intercepting tproxy listener on eth0.
    fn intercepting() -> Asked {
        Asked {
            on: true,
            auto: true,
            intercepting: true,
            watching: true,
            interfaces: vec!["eth0".into()],
            ..Asked::default()
        }
    }

    #[test]
    fn strict_mode_takes_the_syns_whatever_else_is_asked() {
        let asked = Asked {
            strict: true,
            ..intercepting()
        };
        assert_eq!(
            state(&asked, Some(&Ok("attached".into()))),
            (
                Off,
                "strict mode holds the SYNs and starts their legs itself".into()
            )
        );
    }

    #[test]
    fn turned_off_says_the_key() {
        let asked = Asked {
            on: false,
            turned_off: true,
            auto: false,
            ..intercepting()
        };
        assert_eq!(
            state(&asked, None),
            (Off, "turned off ([accel] early_syn = false)".into())
        );
    }

    #[test]
    fn auto_off_with_a_watched_listener_blames_proxy_headers() {
        let asked = Asked {
            on: false,
            ..intercepting()
        };
        assert_eq!(
            state(&asked, None),
            (
                Off,
                "a tproxy listener takes PROXY headers (the client is known only after accept)"
                    .into()
            )
        );
    }

    #[test]
    fn auto_off_without_a_watched_listener_says_nowhere() {
        assert_eq!(
            state(&Asked::default(), None),
            (
                Off,
                "no tproxy listener with `intercept` or syn-option listener with `watch` (nowhere to watch SYNs)"
                    .into()
            )
        );
    }

    #[test]
    fn untried_detector_names_its_interfaces_and_auto_samples_near_prefixes() {
        let asked = Asked {
            interfaces: vec!["eth0".into(), "eth1".into()],
            ..intercepting()
        };
        assert_eq!(
            state(&asked, None),
            (
                Active,
                format!("BPF SYN detector to attach on eth0, eth1{NEAR}{UNWALKED}")
            )
        );
        // `true`, or only syn-option listeners watched: every SYN reported.
        let on = Asked {
            auto: false,
            ..asked.clone()
        };
        let watched_only = Asked {
            intercepting: false,
            ..asked
        };
        for asked in [on, watched_only] {
            assert_eq!(
                state(&asked, None),
                (
                    Active,
                    format!("BPF SYN detector to attach on eth0, eth1{UNWALKED}")
                )
            );
        }
    }

    #[test]
    fn attached_detector_says_how() {
        let how = Ok("tc SYN detector attached on eth0".to_owned());
        assert_eq!(
            state(&intercepting(), Some(&how)),
            (
                Active,
                format!("tc SYN detector attached on eth0{NEAR}{UNWALKED}")
            )
        );
    }

    #[test]
    fn failed_detector_is_unavailable_and_legs_start_at_accept() {
        let failed = Err("loading: Operation not permitted".to_owned());
        assert_eq!(
            state(&intercepting(), Some(&failed)),
            (
                Unavailable,
                "loading: Operation not permitted; legs start at accept".into()
            )
        );
    }
}
