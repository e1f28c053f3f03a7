//! Relay configs built as values: [`RawConfig`] is the relay's own serde
//! layer, so a builder cannot write a key the relay does not know, and the
//! file is written by `toml`.

use std::path::Path;

pub use splitway_relay::config::raw::{
    RawAccel, RawConfig, RawForwarding, RawLimits, RawListener, RawPeer, RawPolicy, RawPool,
    RawRoute, RawTimeouts, RawTls, RawTuning, RawTurbo, RawVia,
};
pub use splitway_relay::config::{DataPath, Intercept, ListenMode};

/// A relay named `name` with its admin endpoint at `admin` and the shared
/// key in `psk_file` (when it has peers or a peer listener).
pub fn relay(name: &str, admin: &str, psk_file: Option<&Path>) -> RawConfig {
    RawConfig {
        name: name.to_owned(),
        admin: Some(admin.to_owned()),
        psk_file: psk_file.map(|p| p.display().to_string()),
        ..RawConfig::default()
    }
}

/// `[limits] max_connections`.
pub fn max_connections(n: usize) -> RawLimits {
    RawLimits {
        max_connections: Some(n),
        ..RawLimits::default()
    }
}

/// Writes `cfg` as its TOML file.
pub fn write(path: &Path, cfg: &RawConfig) -> std::io::Result<()> {
    std::fs::write(path, cfg.to_toml())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a builder writes is what the relay reads.
    #[test]
    fn a_built_config_is_valid() {
        let mut cfg = relay("rc", "127.0.0.1:9191", None);
        let mut socks = RawListener::new(ListenMode::Socks5, "127.0.0.1:1080");
        socks.reuse_port = Some(true);
        cfg.listen.push(socks);
        cfg.route.push(RawRoute::new("0.0.0.0/0", "direct"));
        cfg.limits = Some(max_connections(7));
        let parsed = splitway_relay::Config::parse_str(&cfg.to_toml())
            .unwrap_or_else(|e| panic!("{}\n{e:?}", cfg.to_toml()));
        assert_eq!(parsed.name, "rc");
        assert_eq!(parsed.admin, Some("127.0.0.1:9191".parse().unwrap()));
        assert!(parsed.listeners[0].reuse_port);
        assert_eq!(parsed.limits.max_connections, 7);
    }
}
