//! The state and reason of the pool's status line, from the pieces of the
//! config it needs: `accel.rs`'s list wraps it.

use crate::accel_state::AccelState::{self, Active, Off};
use crate::accel_state::off_reason;

/// The pool's line. `on`: `[accel] pool` as resolved; `turned_off`: the
/// file says `pool = false`; `peers`: each `[[peer]]`'s name and its
/// watermarks (`low`, `high`).
pub fn state(on: bool, turned_off: bool, peers: &[(&str, usize, usize)]) -> (AccelState, String) {
    let none = "no [[peer]] to pool connections to";
    if !on {
        return (Off, off_reason(turned_off, "pool", none));
    }
    if peers.is_empty() {
        return (Off, none.into());
    }
    let sizes: Vec<String> = peers
        .iter()
        .map(|(name, low, high)| format!("{name} {low}..{high}"))
        .collect();
    (
        Active,
        format!("authenticated connections kept ready: {}", sizes.join(", ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turned_off_says_the_key() {
        assert_eq!(
            state(false, true, &[("rs", 2, 8)]),
            (Off, "turned off ([accel] pool = false)".into())
        );
    }

    #[test]
    fn auto_off_and_on_without_peers_say_there_is_nothing_to_pool_to() {
        let nothing = (Off, "no [[peer]] to pool connections to".to_owned());
        assert_eq!(state(false, false, &[]), nothing);
        assert_eq!(state(true, false, &[]), nothing);
    }

    #[test]
    fn active_lists_each_peers_watermarks() {
        assert_eq!(
            state(true, false, &[("rs", 2, 8), ("rt", 3, 9)]),
            (
                Active,
                "authenticated connections kept ready: rs 2..8, rt 3..9".into()
            )
        );
    }
}
