//! `[accel] loss_isolation`: whether the room is on.

/// Resolves the key: `requested` (`None`: auto) is on where the relay has
/// client legs (`client_legs`: a listener other than peer) that run the
/// kernel's default (`client_named`: `[client] congestion` names their
/// algorithm itself). The error is the key's message.
pub fn resolve(
    requested: Option<bool>,
    client_legs: bool,
    client_named: bool,
) -> Result<bool, &'static str> {
    match requested {
        None => Ok(client_legs && !client_named),
        Some(true) if client_named => Err(
            "cannot be combined with [client] congestion, which names the client legs' algorithm itself",
        ),
        Some(on) => Ok(on),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_on_for_client_legs_on_the_default_algorithm() {
        assert_eq!(resolve(None, true, false), Ok(true));
        assert_eq!(
            resolve(None, false, false),
            Ok(false),
            "peer listeners only"
        );
        assert_eq!(resolve(None, true, true), Ok(false), "an algorithm named");
        assert_eq!(resolve(Some(false), true, false), Ok(false));
        assert_eq!(resolve(Some(true), false, false), Ok(true));
        assert!(resolve(Some(true), true, true).is_err());
    }
}
