//! Early SYN's live parameter (`PUT /params`): its switch, declared with
//! splitway-control's generic [`ParamSpec::new`]; `admin.rs` declares it
//! when the relay has an early-SYN table.

use splitway_control::{ParamKind, ParamSpec};

/// The switch's name, which `admin.rs` matches a change against.
pub const PARAM: &str = "early_syn";

/// `early_syn`: start the next leg at the client's SYN.
pub fn param() -> ParamSpec {
    ParamSpec::new(
        PARAM,
        ParamKind::Bool,
        "start the next leg when the client's SYN arrives",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_is_a_bool_named_early_syn() {
        let spec = param();
        assert_eq!(spec.name, "early_syn");
        assert_eq!(spec.kind, ParamKind::Bool);
        assert_eq!(
            spec.description,
            "start the next leg when the client's SYN arrives"
        );
    }
}
