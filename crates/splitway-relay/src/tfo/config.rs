//! `[accel] tfo`: what the key turns on.

/// What `[accel] tfo` resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// Client-facing listeners take data in the SYN (unless `tfo = false`).
    pub from_clients: bool,
    /// The client's first bytes ride the SYN to servers: opt-in only
    /// (`tfo = true`), as SYN data can be replayed to a server that did not
    /// ask for TFO, and middleboxes towards arbitrary servers drop such SYNs.
    pub to_servers: bool,
}

/// Resolves the key (`None`: not in the file).
pub fn resolve(requested: Option<bool>) -> Resolved {
    Resolved {
        from_clients: requested != Some(false),
        to_servers: requested == Some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_get_syn_data_only_when_asked() {
        let r = |from_clients, to_servers| Resolved {
            from_clients,
            to_servers,
        };
        assert_eq!(resolve(None), r(true, false));
        assert_eq!(resolve(Some(true)), r(true, true));
        assert_eq!(resolve(Some(false)), r(false, false));
    }
}
