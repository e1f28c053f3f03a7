//! Relay configuration: any text either parses into a config whose
//! cross-references hold, or yields at least one issue, each naming a key.
//! Never panics, and the same text always gives the same answer. Parsed
//! with `Config::parse_str`, whose source reads no file (keys, TLS files,
//! `/proc`): the fuzzer must not name `/dev/zero` and have it read.
//!
//! Shared by the cargo-fuzz target and the stable corpus replay test.

use splitway_relay::Config;
use splitway_relay::config::Via;

/// Panics if `data` breaks a property above.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = Config::parse_str(text);
    match &first {
        Ok(cfg) => {
            assert!(!cfg.listeners.is_empty(), "a config that accepts nothing");
            for r in &cfg.routes {
                if let Via::Peer(i) = r.via {
                    assert!(i < cfg.peers.len(), "route to a missing peer");
                }
            }
            for p in &cfg.policy.allow_ports {
                assert!(*p.start() >= 1 && p.start() <= p.end(), "{p:?}");
            }
            for n in cfg
                .policy
                .allow_destinations
                .iter()
                .chain(&cfg.policy.deny_destinations)
            {
                assert_eq!(n.trunc(), *n, "prefix with host bits");
            }
            let _ = cfg.warnings();
        }
        Err(issues) => {
            assert!(!issues.is_empty(), "refused without a reason");
            assert!(issues.iter().all(|i| !i.key.is_empty()), "{issues:?}");
        }
    }
    let again = Config::parse_str(text);
    match (&first, &again) {
        (Ok(_), Ok(_)) => {}
        (Err(a), Err(b)) => assert_eq!(a, b, "issues differ between two parses"),
        _ => panic!("two parses of the same text disagree"),
    }
}
