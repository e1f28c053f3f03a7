//! The state and reason of 0-RTT's status line, from the pieces it needs
//! (no `Config`): `accel.rs`'s planner wraps it.

use crate::accel_state::AccelState::{self, Active, Off, Unavailable};

/// 0-RTT switched on: what it does here. `plain_peer_legs`: this relay
/// dials or accepts a peer leg without TLS (TLS legs bind the challenge to
/// the session instead). `hello_register`: what guards accepted Hellos
/// against replays (`Ok`), or why Hellos are refused (`Err`); None when no
/// plain peer listener takes them.
pub fn state(
    plain_peer_legs: bool,
    hello_register: Option<&Result<String, String>>,
) -> (AccelState, String) {
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
        let (s, why) = state(false, None);
        assert_eq!(s, Off);
        assert!(why.contains("TLS legs bind the challenge"), "{why}");
    }

    #[test]
    fn a_dialer_alone_is_active_and_a_guarded_acceptor_says_how() {
        assert_eq!(state(true, None).0, Active);
        let guard = Ok("replays refused by the host-wide register".to_owned());
        let (s, why) = state(true, Some(&guard));
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
            state(true, Some(&refused)),
            (
                Unavailable,
                "the strike register cannot be created".to_owned()
            )
        );
    }
}
