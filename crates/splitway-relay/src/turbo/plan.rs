//! The state and reason of Turbo-Start's status line: `accel.rs`'s list
//! wraps it.

use crate::accel_state::AccelState::{self, Active, Off};
use crate::config::Turbo;

/// Turbo-Start's line; `turbo`: `[accel.turbo]`, opt-in only (no `auto`).
pub fn state(turbo: Option<&Turbo>) -> (AccelState, String) {
    match turbo {
        Some(t) => (
            Active,
            format!(
                "initcwnd {} initrwnd {} on routes to relays",
                t.initcwnd, t.initrwnd
            ),
        ),
        None => (
            Off,
            "opt-in only ([accel.turbo]): it changes routes for whole prefixes".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_names_the_windows_its_routes_carry() {
        let turbo = Turbo {
            initcwnd: 40,
            initrwnd: 60,
            buffer: 65536,
        };
        assert_eq!(
            state(Some(&turbo)),
            (Active, "initcwnd 40 initrwnd 60 on routes to relays".into())
        );
    }

    #[test]
    fn unset_says_it_is_opt_in_and_why() {
        assert_eq!(
            state(None),
            (
                Off,
                "opt-in only ([accel.turbo]): it changes routes for whole prefixes".into()
            )
        );
    }
}
