//! What each listener mode is (its name, how its connections arrive),
//! which the rest of the relay (the config's checks, metrics labels, the
//! start) asks instead of matching on [`ListenMode`] itself.

use crate::config::ListenMode;

impl ListenMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ListenMode::Tproxy => "tproxy",
            ListenMode::Socks5 => "socks5",
            ListenMode::HttpConnect => "http-connect",
            ListenMode::Peer => "peer",
            ListenMode::SynOption => "syn-option",
        }
    }

    /// Upstream relays connect here (`mode = "peer"`).
    pub fn accepts_relays(self) -> bool {
        self == ListenMode::Peer
    }

    /// Connections arrive intercepted, addressed to their server (TPROXY).
    pub fn intercepts(self) -> bool {
        self == ListenMode::Tproxy
    }

    /// The destination rides the client's SYN (`mode = "syn-option"`).
    pub fn syn_carries_dst(self) -> bool {
        self == ListenMode::SynOption
    }

    /// The client names its destination in a proxy protocol and may be
    /// asked for credentials (SOCKS5, HTTP CONNECT).
    pub fn is_explicit_proxy(self) -> bool {
        matches!(self, ListenMode::Socks5 | ListenMode::HttpConnect)
    }
}
