//! The state and reason of learned windows' status line, from the pieces
//! of the config it needs and the algorithm's registration: `accel.rs`'s
//! list wraps it.

use crate::accel_state::AccelState::{self, Active, Off, Unavailable};
use crate::accel_state::off_reason;
use crate::config::LEARNED_WINDOW_CC;

/// Learned windows' line. `on`: `[accel] learned_window` as resolved;
/// `turned_off`: the file says `false`; `turbo`: `[accel.turbo]` is set;
/// `relay_legs`: a `[[peer]]` or a peer listener. `registered`: the leg
/// keys the algorithm serves, or why it cannot run; None when not tried.
pub fn state(
    on: bool,
    turned_off: bool,
    turbo: bool,
    relay_legs: bool,
    registered: Option<&Result<Vec<String>, String>>,
) -> (AccelState, String) {
    if !on {
        let why = if turbo {
            "[accel.turbo] sets the relay legs' initial window"
        } else if !relay_legs {
            "no relay legs (no [[peer]] and no peer listener)"
        } else {
            ""
        };
        return (Off, off_reason(turned_off, "learned_window", why));
    }
    match registered {
        None => (
            Active,
            format!("relay legs without a `congestion` key to run {LEARNED_WINDOW_CC}"),
        ),
        Some(Ok(keys)) if keys.is_empty() => (
            Off,
            "every relay leg names its own congestion control".into(),
        ),
        Some(Ok(keys)) => (
            Active,
            format!(
                "{LEARNED_WINDOW_CC} on {}: each relay leg starts from the window the last one to the same peer reached (RTT-checked, paced, retreats on loss)",
                keys.join(", ")
            ),
        ),
        Some(Err(e)) => (
            Unavailable,
            format!("{e}; relay legs slow-start from the kernel's initial window"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turned_off_says_the_key() {
        assert_eq!(
            state(false, true, true, false, None),
            (Off, "turned off ([accel] learned_window = false)".into())
        );
    }

    #[test]
    fn auto_off_says_turbo_or_no_relay_legs() {
        assert_eq!(
            state(false, false, true, true, None),
            (
                Off,
                "[accel.turbo] sets the relay legs' initial window".into()
            )
        );
        assert_eq!(
            state(false, false, false, false, None),
            (
                Off,
                "no relay legs (no [[peer]] and no peer listener)".into()
            )
        );
        // `auto` resolves off only for those two; anything else is blank.
        assert_eq!(state(false, false, false, true, None), (Off, String::new()));
    }

    #[test]
    fn not_registered_yet_says_which_legs_will_run_it() {
        assert_eq!(
            state(true, false, false, true, None),
            (
                Active,
                "relay legs without a `congestion` key to run splitway_resume".into()
            )
        );
    }

    #[test]
    fn registered_for_no_leg_is_off() {
        assert_eq!(
            state(true, false, false, true, Some(&Ok(Vec::new()))),
            (
                Off,
                "every relay leg names its own congestion control".into()
            )
        );
    }

    #[test]
    fn registered_names_the_legs_it_serves() {
        let keys = Ok(vec!["rs".to_owned(), "10.0.0.0/8".to_owned()]);
        assert_eq!(
            state(true, false, false, true, Some(&keys)),
            (
                Active,
                "splitway_resume on rs, 10.0.0.0/8: each relay leg starts from the window the last one to the same peer reached (RTT-checked, paced, retreats on loss)"
                    .into()
            )
        );
    }

    #[test]
    fn refused_registration_is_unavailable_and_says_the_fallback() {
        let refused = Err("no BTF".to_owned());
        assert_eq!(
            state(true, false, false, true, Some(&refused)),
            (
                Unavailable,
                "no BTF; relay legs slow-start from the kernel's initial window".into()
            )
        );
    }
}
