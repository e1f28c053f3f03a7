//! The small sections of plain values: `[timeouts]`, `[forwarding]`,
//! `[limits]`, `[access_log]`.

use super::check::Checker;
use super::raw::{RawAccessLog, RawForwarding, RawLimits, RawTimeouts};
use super::types::{AccessLogConfig, Forwarding, Limits, Timeouts};

pub(super) fn timeouts(c: &mut Checker, table: &toml::Table) -> Timeouts {
    let mut timeouts = Timeouts::default();
    let Some(raw) = c.table::<RawTimeouts>(table, "timeouts") else {
        return timeouts;
    };
    for (name, text, slot) in [
        ("connect", raw.connect, &mut timeouts.connect),
        ("handshake", raw.handshake, &mut timeouts.handshake),
        ("idle", raw.idle, &mut timeouts.idle),
        (
            "pooled_header",
            raw.pooled_header,
            &mut timeouts.pooled_header,
        ),
    ] {
        if let Some(t) = text {
            let key = format!("timeouts.{name}");
            if let Some(d) = c.duration(&key, &t) {
                if d.is_zero() {
                    c.err(key, "must be greater than zero");
                } else {
                    *slot = d;
                }
            }
        }
    }
    timeouts
}

pub(super) fn forwarding(c: &mut Checker, table: &toml::Table) -> Forwarding {
    c.table::<RawForwarding>(table, "forwarding")
        .map(|r| Forwarding {
            data_path: r.data_path.unwrap_or_default(),
        })
        .unwrap_or_default()
}

pub(super) fn access_log(c: &mut Checker, table: &toml::Table) -> Option<AccessLogConfig> {
    let raw = c.table::<RawAccessLog>(table, "access_log")?;
    if raw.path.trim().is_empty() {
        c.err("access_log.path", "must name a file");
        return None;
    }
    Some(AccessLogConfig {
        path: c.base.join(&raw.path),
        format: raw.format.unwrap_or_default(),
    })
}

pub(super) fn limits(c: &mut Checker, table: &toml::Table) -> Limits {
    c.table::<RawLimits>(table, "limits")
        .map(|r| {
            let d = Limits::default();
            Limits {
                max_connections: r.max_connections.unwrap_or(d.max_connections),
                per_client: r.per_client.unwrap_or(d.per_client),
                handshaking_per_client: r
                    .handshaking_per_client
                    .unwrap_or(d.handshaking_per_client),
                credential_failures: r.credential_failures.unwrap_or(d.credential_failures),
            }
        })
        .unwrap_or_default()
}
