//! `[policy]`: which destinations and ports clients may reach.

use std::ops::RangeInclusive;

use super::check::Checker;
use super::raw::RawPolicy;
use crate::policy::Policy;

pub(super) fn policy(c: &mut Checker, table: &toml::Table) -> Policy {
    let Some(raw) = c.table::<RawPolicy>(table, "policy") else {
        return Policy::default();
    };
    let allow_destinations = c.prefixes(
        "policy.allow_destinations",
        raw.allow_destinations.as_deref().unwrap_or_default(),
    );
    let deny_destinations = c.prefixes(
        "policy.deny_destinations",
        raw.deny_destinations.as_deref().unwrap_or_default(),
    );
    let allow_ports = raw
        .allow_ports
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, v)| port_range(c, &format!("policy.allow_ports[{i}]"), v))
        .collect();
    Policy {
        allow_destinations,
        deny_destinations,
        allow_ports,
        allow_local_destinations: raw.allow_local_destinations.unwrap_or(false),
        allow_link_local: raw.allow_link_local.unwrap_or(false),
        allow_host_addresses: raw.allow_host_addresses.unwrap_or(false),
        allow_relay_clients: raw.allow_relay_clients.unwrap_or(false),
    }
}

/// One `allow_ports` element: a port, or a "first-last" range.
fn port_range(c: &mut Checker, key: &str, value: &toml::Value) -> Option<RangeInclusive<u16>> {
    let port = |n: i64| u16::try_from(n).ok().filter(|&p| p != 0);
    let range = match value {
        toml::Value::Integer(n) => port(*n).map(|p| p..=p),
        toml::Value::String(s) => {
            let (first, last) = s.split_once('-').unwrap_or((s, s));
            match (first.trim().parse::<i64>(), last.trim().parse::<i64>()) {
                (Ok(a), Ok(b)) => match (port(a), port(b)) {
                    (Some(a), Some(b)) if a <= b => Some(a..=b),
                    (Some(_), Some(_)) => {
                        c.err(key, format!("`{s}`: the first port is above the last"));
                        return None;
                    }
                    _ => None,
                },
                _ => None,
            }
        }
        _ => None,
    };
    if range.is_none() {
        c.err(
            key,
            format!("`{value}` is not a port (1-65535) or a range like \"8000-8100\""),
        );
    }
    range
}
