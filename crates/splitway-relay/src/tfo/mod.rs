//! TCP Fast Open, in a room of its own (issue #31): what `[accel] tfo`
//! resolves to (`config`), what this host's `net.ipv4.tcp_fastopen`
//! allows (`Sysctl`), and the three lines `--check` and `ctl status` show
//! for it (`plan`): TFO on peer legs (the 0-RTT Hello in the SYN), from
//! clients, and to servers. The sockets themselves are set where they are
//! made: listeners (`Listener::fast_open`) and dials (`dial`, `peer`).

pub mod config;
pub mod plan;

/// The sysctl file that holds `tcp_fastopen` also holds the fix.
pub const FIX: &str = "set net.ipv4.tcp_fastopen = 3 (deploy/sysctl.d/60-splitway-tfo.conf)";

/// `net.ipv4.tcp_fastopen` of this network namespace, read once at start
/// (None: unreadable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sysctl(pub Option<u32>);

impl Sysctl {
    pub fn read() -> Sysctl {
        Sysctl(splitway_sys::sock::fastopen_sysctl())
    }

    /// The client bit (1): sockets of this host may send data in a SYN.
    pub fn client(self) -> bool {
        self.bit(1)
    }

    /// The server bit (2): listeners of this host may take data in a SYN.
    pub fn server(self) -> bool {
        self.bit(2)
    }

    fn bit(self, bit: u32) -> bool {
        self.0.is_some_and(|v| v & bit != 0)
    }

    /// The setting as an operator reads it.
    pub fn describe(self) -> String {
        match self.0 {
            Some(v) => format!("net.ipv4.tcp_fastopen = {v}"),
            None => "net.ipv4.tcp_fastopen unreadable".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bits_are_the_kernels() {
        assert!(Sysctl(Some(3)).client() && Sysctl(Some(3)).server());
        assert!(Sysctl(Some(1)).client() && !Sysctl(Some(1)).server());
        assert!(!Sysctl(Some(2)).client() && Sysctl(Some(2)).server());
        assert!(!Sysctl(None).client() && !Sysctl(None).server());
        assert_eq!(Sysctl(Some(1)).describe(), "net.ipv4.tcp_fastopen = 1");
        assert_eq!(Sysctl(None).describe(), "net.ipv4.tcp_fastopen unreadable");
    }
}
