//! The state and reason of 0-RTT's status line, from the pieces it needs
//! (no `Config`): `accel.rs`'s list wraps it.

use crate::accel_state::AccelState::{self, Active, Off, Unavailable};
use crate::accel_state::off_reason;

/// 0-RTT's line. `on`: `[accel] zero_rtt` as resolved; `turned_off`: the
/// file says `false`. `plain_peer_legs`: this relay dials or accepts a
/// peer leg without TLS (TLS legs bind the challenge to the session
/// instead). `hello_register`: what guards accepted Hellos against replays
/// (`Ok`), or why Hellos are refused (`Err`); None when no plain peer
/// listener takes them.
pub fn state(
    on: bool,
    turned_off: bool,
    plain_peer_legs: bool,
    hello_register: Option<&Result<String, String>>,
) -> (AccelState, String) {
    if !on {
        // `auto` resolves on (config/accel.rs): no reason of its own.
        return (Off, off_reason(turned_off, "zero_rtt", ""));
    }
    if !plain_peer_legs {
        return (
            Off,
            "no plain (non-TLS) peer legs: TLS legs bind the challenge to the session".into(),
        );
    }
    let base = "fresh peer legs open with the authenticated Hello (no challenge round trip); the challenge is the fallback";
    match hello_register {
        None => (Active, base.into()),
        Some(Ok(guard)) => (Active, format!("{base}; {guard}")),
        // Dialing with Hellos still works; taking them does not.
        Some(Err(why)) => (Unavailable, why.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_only_legs_need_no_hello() {
        let (s, why) = state(true, false, false, None);
        assert_eq!(s, Off);
        assert!(why.contains("TLS legs bind the challenge"), "{why}");
    }

    #[test]
    fn a_dialer_alone_is_active_and_a_guarded_acceptor_says_how() {
        assert_eq!(state(true, false, true, None).0, Active);
        let guard = Ok("replays refused by the host-wide register".to_owned());
        let (s, why) = state(true, false, true, Some(&guard));
        assert_eq!(s, Active);
        assert!(
            why.ends_with("; replays refused by the host-wide register"),
            "{why}"
        );
    }

    #[test]
    fn an_acceptor_without_its_register_is_unavailable_and_says_why() {
        let refused = Err("the strike register cannot be created".to_owned());
        assert_eq!(
            state(true, false, true, Some(&refused)),
            (
                Unavailable,
                "the strike register cannot be created".to_owned()
            )
        );
    }

    #[test]
    fn off_says_the_key_when_the_file_turned_it_off() {
        let refused = Err("the strike register cannot be created".to_owned());
        assert_eq!(
            state(false, true, true, Some(&refused)),
            (Off, "turned off ([accel] zero_rtt = false)".to_owned())
        );
        assert_eq!(state(false, false, true, None), (Off, String::new()));
    }
}
