//! The top level's own keys: unknown keys, `name`, `admin`, `workers`.

use std::net::SocketAddr;

use super::check::{Checker, valid_name};
use super::explain;
use super::raw::TOP_LEVEL_KEYS;
use super::types::{DEFAULT_ADMIN, MAX_WORKERS};

/// Every top-level key that is not a known one.
pub(super) fn unknown_keys(c: &mut Checker, table: &toml::Table) {
    for key in table.keys() {
        if !TOP_LEVEL_KEYS.contains(&key.as_str()) {
            c.err(key.clone(), explain::unknown_key(key, TOP_LEVEL_KEYS));
        }
    }
}

pub(super) fn name(c: &mut Checker, table: &toml::Table) -> Option<String> {
    match table.get("name") {
        Some(v) => c.section::<String>("name", v).and_then(|n| {
            if valid_name(&n) {
                Some(n)
            } else {
                c.err("name", format!("`{n}` must be 1-32 of [a-z0-9_-]"));
                None
            }
        }),
        None => {
            c.err("name", "missing (a short name for this relay, e.g. \"rc\")");
            None
        }
    }
}

/// `admin`: an address, `"off"` or empty for none; absent: loopback 9090.
pub(super) fn admin(c: &mut Checker, table: &toml::Table) -> Option<SocketAddr> {
    match table.get("admin") {
        None => Some(DEFAULT_ADMIN.parse().expect("valid default")),
        Some(v) => match c.section::<String>("admin", v) {
            Some(s) if s.is_empty() || s == "off" => None,
            Some(s) => c.socket_addr("admin", &s),
            None => None,
        },
    }
}

/// `metrics`: an address serving only `GET /metrics`; absent or `"off"`:
/// none. It must differ from the admin address.
pub(super) fn metrics(
    c: &mut Checker,
    table: &toml::Table,
    admin: Option<SocketAddr>,
) -> Option<SocketAddr> {
    let s = c.section::<String>("metrics", table.get("metrics")?)?;
    if s.is_empty() || s == "off" {
        return None;
    }
    let addr = c.socket_addr("metrics", &s)?;
    if admin == Some(addr) {
        c.err(
            "metrics",
            "must differ from `admin` (the admin address serves /metrics too)",
        );
        return None;
    }
    Some(addr)
}

/// `workers`: how many threads run connections; absent: one per CPU.
pub(super) fn workers(c: &mut Checker, table: &toml::Table) -> Option<usize> {
    let n = c.section::<usize>("workers", table.get("workers")?)?;
    if (1..=MAX_WORKERS).contains(&n) {
        Some(n)
    } else {
        c.err(
            "workers",
            format!("must be 1 to {MAX_WORKERS} (absent: one per CPU)"),
        );
        None
    }
}
