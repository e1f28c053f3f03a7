//! The pool's live parameters (`PUT /params`): each peer's watermarks,
//! declared with splitway-control's generic [`ParamSpec::new`]; `admin.rs`
//! declares them for every configured peer.

use splitway_control::{ParamKind, ParamSpec};

/// The names of a peer's two watermarks, `(low, high)`, which `admin.rs`
/// reads back together.
pub fn param_names(peer: &str) -> (String, String) {
    (format!("pool.{peer}.low"), format!("pool.{peer}.high"))
}

/// `pool.<peer>.low`: refill starts below this many idle connections.
/// Same range as the config's `pool.low`.
pub fn param_low(peer: &str) -> ParamSpec {
    ParamSpec::new(
        param_names(peer).0,
        ParamKind::Int { min: 0, max: 4096 },
        format!("refill the pool to peer {peer} when fewer idle connections remain"),
    )
}

/// `pool.<peer>.high`: refill tops the pool up to this many.
pub fn param_high(peer: &str) -> ParamSpec {
    ParamSpec::new(
        param_names(peer).1,
        ParamKind::Int { min: 0, max: 4096 },
        format!("refill the pool to peer {peer} up to this many idle connections"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_names_the_peer_in_its_name_and_description() {
        let spec = param_low("rs");
        assert_eq!(spec.name, "pool.rs.low");
        assert_eq!(spec.kind, ParamKind::Int { min: 0, max: 4096 });
        assert_eq!(
            spec.description,
            "refill the pool to peer rs when fewer idle connections remain"
        );
    }

    #[test]
    fn high_names_the_peer_in_its_name_and_description() {
        let spec = param_high("rs");
        assert_eq!(spec.name, "pool.rs.high");
        assert_eq!(spec.kind, ParamKind::Int { min: 0, max: 4096 });
        assert_eq!(
            spec.description,
            "refill the pool to peer rs up to this many idle connections"
        );
    }
}
