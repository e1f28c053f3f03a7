//! The state and reason of strict mode's status line: `accel.rs`'s list
//! wraps it. Kept apart from the queue (`mod.rs`, which runs against a
//! snapshot) so the planners' list imports nothing above `state.rs`.

use crate::accel_state::AccelState::{self, Active, Off};

/// Strict mode's line; `on`: `[accel] strict`, opt-in only (no `auto`).
pub fn state(on: bool) -> (AccelState, String) {
    if on {
        (
            Active,
            "intercepted SYNs are held until the server accepted".into(),
        )
    } else {
        (
            Off,
            "opt-in only ([accel] strict = true): it delays every SYN by the path".into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_holds_the_syns() {
        assert_eq!(
            state(true),
            (
                Active,
                "intercepted SYNs are held until the server accepted".into()
            )
        );
    }

    #[test]
    fn off_says_it_is_opt_in_and_why() {
        assert_eq!(
            state(false),
            (
                Off,
                "opt-in only ([accel] strict = true): it delays every SYN by the path".into()
            )
        );
    }
}
