//! The state and reason of loss isolation's status line, from the pieces
//! of the config it needs and the kernel's congestion controls (no
//! `Config`: `config` imports this room): `accel.rs`'s list wraps it.

use crate::accel_state::AccelState::{self, Active, Off, Unavailable};
use crate::accel_state::off_reason;

use super::LOSS_TOLERANT_CC;

/// Loss isolation's line. `on`: `[accel] loss_isolation` as resolved;
/// `turned_off`: the file says `false`; `client_congestion`: `[client]
/// congestion` is set; `available`: the kernel's congestion controls
/// (empty: unreadable, not held against it).
pub fn state(
    on: bool,
    turned_off: bool,
    client_congestion: bool,
    available: &[String],
) -> (AccelState, String) {
    if !on {
        let why = if client_congestion {
            "[client] congestion names the client legs' algorithm"
        } else {
            "no client-facing listener"
        };
        return (Off, off_reason(turned_off, "loss_isolation", why));
    }
    if !available.is_empty() && !available.iter().any(|a| a == LOSS_TOLERANT_CC) {
        return (
            Unavailable,
            format!(
                "this kernel has no {LOSS_TOLERANT_CC} (available: {}); client legs keep the default",
                available.join(" ")
            ),
        );
    }
    (
        Active,
        format!(
            "client legs to a client whose last leg lost ≥ 1 % without queueing (RTT within 25 % of its minimum) run {LOSS_TOLERANT_CC}; loss with a rising RTT or a clean leg returns it to the default"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACTIVE: &str = "client legs to a client whose last leg lost ≥ 1 % without queueing (RTT within 25 % of its minimum) run bbr; loss with a rising RTT or a clean leg returns it to the default";

    fn names(list: &str) -> Vec<String> {
        list.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn turned_off_says_the_key() {
        assert_eq!(
            state(false, true, true, &[]),
            (Off, "turned off ([accel] loss_isolation = false)".into())
        );
    }

    #[test]
    fn auto_off_says_client_congestion_or_no_client_listener() {
        assert_eq!(
            state(false, false, true, &[]),
            (
                Off,
                "[client] congestion names the client legs' algorithm".into()
            )
        );
        assert_eq!(
            state(false, false, false, &[]),
            (Off, "no client-facing listener".into())
        );
    }

    #[test]
    fn a_kernel_without_bbr_is_unavailable_and_lists_what_it_has() {
        assert_eq!(
            state(true, false, false, &names("reno cubic")),
            (
                Unavailable,
                "this kernel has no bbr (available: reno cubic); client legs keep the default"
                    .into()
            )
        );
    }

    #[test]
    fn active_with_bbr_or_an_unreadable_list() {
        for available in [names("reno cubic bbr"), Vec::new()] {
            assert_eq!(
                state(true, false, false, &available),
                (Active, ACTIVE.into())
            );
        }
    }
}
