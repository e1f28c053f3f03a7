//! TFO's three lines of `--check` and `ctl status`: each gives its state
//! and the reason, in words an operator can act on. `accel.rs`'s list
//! wraps them.

use crate::accel_state::AccelState::{self, Active, Off, Unavailable};
use crate::accel_state::off_reason;

use super::{FIX, Sysctl};

/// TFO on peer legs: the 0-RTT Hello rides the SYN. The dialing end needs
/// the client bit, the accepting end the server bit. `plain_dials` and
/// `plain_accepts`: this relay dials, and accepts, plain (non-TLS) peer legs.
pub fn peer(
    zero_rtt: bool,
    plain_dials: bool,
    plain_accepts: bool,
    host: Sysctl,
) -> (AccelState, String) {
    let mut missing = Vec::new();
    if plain_dials && !host.client() {
        missing.push("the client bit (1): Hellos to peers leave after the handshake");
    }
    if plain_accepts && !host.server() {
        missing.push("the server bit (2): upstream relays' Hellos arrive after the handshake");
    }
    if !zero_rtt {
        (
            Off,
            "needs zero_rtt (the Hello is what rides the SYN)".into(),
        )
    } else if !plain_dials && !plain_accepts {
        (Off, "no plain (non-TLS) peer legs".into())
    } else if missing.is_empty() {
        (
            Active,
            format!(
                "Hellos ride the SYN once a cookie is held ({})",
                host.describe()
            ),
        )
    } else {
        (
            Unavailable,
            format!(
                "{} lacks {}; {FIX}",
                host.describe(),
                missing.join(", and ")
            ),
        )
    }
}

/// TFO from clients: `on` as `[accel] tfo` resolved, `turned_off` when
/// the file says `tfo = false`; `client_facing`: a listener other than
/// peer.
pub fn from_clients(
    on: bool,
    turned_off: bool,
    client_facing: bool,
    host: Sysctl,
) -> (AccelState, String) {
    if !on {
        (Off, off_reason(turned_off, "tfo", ""))
    } else if !client_facing {
        (Off, "no client-facing listener".into())
    } else if host.server() {
        (
            Active,
            "clients that send data in their SYN are accepted at the SYN".into(),
        )
    } else {
        (
            Unavailable,
            format!("{} lacks the server bit (2); {FIX}", host.describe()),
        )
    }
}

/// TFO to servers: opt-in only (`config::Resolved::to_servers`).
pub fn to_servers(on: bool, turned_off: bool, host: Sysctl) -> (AccelState, String) {
    if !on {
        (
            Off,
            off_reason(
                turned_off,
                "tfo",
                "opt-in only ([accel] tfo = true): SYN data can be replayed to a server that did not ask for TFO, and middleboxes towards arbitrary servers drop such SYNs",
            ),
        )
    } else if host.client() {
        (
            Active,
            "the client's first bytes ride the SYN to servers whose cookie is held".into(),
        )
    } else {
        (
            Unavailable,
            format!("{} lacks the client bit (1); {FIX}", host.describe()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_names_the_missing_bit_and_the_fix() {
        let client_only = Sysctl(Some(1));
        let (state, why) = peer(true, true, true, client_only);
        assert_eq!(state, Unavailable);
        assert!(
            why.contains("the server bit (2)") && why.contains(FIX),
            "{why}"
        );
        assert_eq!(peer(true, true, false, client_only).0, Active);
        assert_eq!(peer(false, true, true, Sysctl(Some(3))).0, Off);
        assert_eq!(peer(true, false, false, Sysctl(Some(3))).0, Off);

        let (state, why) = from_clients(true, false, true, client_only);
        assert_eq!(state, Unavailable);
        assert!(why.contains("lacks the server bit (2)"), "{why}");
        assert_eq!(from_clients(true, false, false, client_only).0, Off);
        assert_eq!(
            from_clients(false, true, true, client_only),
            (Off, "turned off ([accel] tfo = false)".into())
        );

        let (state, why) = to_servers(false, false, client_only);
        assert_eq!(state, Off);
        assert!(why.starts_with("opt-in only"), "{why}");
        assert_eq!(to_servers(true, false, client_only).0, Active);
        assert_eq!(to_servers(true, false, Sysctl(Some(2))).0, Unavailable);
    }

    const FULL: Sysctl = Sysctl(Some(3));
    const CLIENT_ONLY: Sysctl = Sysctl(Some(1));

    #[test]
    fn peer_off_needs_zero_rtt_then_plain_legs() {
        assert_eq!(
            peer(false, true, true, FULL),
            (
                Off,
                "needs zero_rtt (the Hello is what rides the SYN)".into()
            )
        );
        assert_eq!(
            peer(true, false, false, FULL),
            (Off, "no plain (non-TLS) peer legs".into())
        );
    }

    #[test]
    fn peer_active_names_the_setting() {
        assert_eq!(
            peer(true, true, true, FULL),
            (
                Active,
                "Hellos ride the SYN once a cookie is held (net.ipv4.tcp_fastopen = 3)".into()
            )
        );
    }

    #[test]
    fn peer_unavailable_lists_every_missing_bit() {
        assert_eq!(
            peer(true, true, true, Sysctl(Some(0))),
            (
                Unavailable,
                format!(
                    "net.ipv4.tcp_fastopen = 0 lacks the client bit (1): Hellos to peers leave after the handshake, and the server bit (2): upstream relays' Hellos arrive after the handshake; {FIX}"
                )
            )
        );
        assert_eq!(
            peer(true, true, false, Sysctl(None)),
            (
                Unavailable,
                format!(
                    "net.ipv4.tcp_fastopen unreadable lacks the client bit (1): Hellos to peers leave after the handshake; {FIX}"
                )
            )
        );
    }

    #[test]
    fn from_clients_off_says_why() {
        assert_eq!(
            from_clients(false, true, true, FULL),
            (Off, "turned off ([accel] tfo = false)".into())
        );
        assert_eq!(from_clients(false, false, true, FULL), (Off, String::new()));
        assert_eq!(
            from_clients(true, false, false, FULL),
            (Off, "no client-facing listener".into())
        );
    }

    #[test]
    fn from_clients_active_or_missing_the_server_bit() {
        assert_eq!(
            from_clients(true, false, true, FULL),
            (
                Active,
                "clients that send data in their SYN are accepted at the SYN".into()
            )
        );
        assert_eq!(
            from_clients(true, false, true, CLIENT_ONLY),
            (
                Unavailable,
                format!("net.ipv4.tcp_fastopen = 1 lacks the server bit (2); {FIX}")
            )
        );
    }

    #[test]
    fn to_servers_off_says_turned_off_or_opt_in() {
        assert_eq!(
            to_servers(false, true, FULL),
            (Off, "turned off ([accel] tfo = false)".into())
        );
        assert_eq!(
            to_servers(false, false, FULL),
            (
                Off,
                "opt-in only ([accel] tfo = true): SYN data can be replayed to a server that did not ask for TFO, and middleboxes towards arbitrary servers drop such SYNs"
                    .into()
            )
        );
    }

    #[test]
    fn to_servers_active_or_missing_the_client_bit() {
        assert_eq!(
            to_servers(true, false, CLIENT_ONLY),
            (
                Active,
                "the client's first bytes ride the SYN to servers whose cookie is held".into()
            )
        );
        assert_eq!(
            to_servers(true, false, Sysctl(Some(2))),
            (
                Unavailable,
                format!("net.ipv4.tcp_fastopen = 2 lacks the client bit (1); {FIX}")
            )
        );
    }
}
