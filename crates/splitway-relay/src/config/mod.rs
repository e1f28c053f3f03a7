//! The relay's TOML configuration: parsing and whole-file validation.
//!
//! - `raw`: the file as written (serde, `deny_unknown_fields`); builders
//!   write configs through it.
//! - one validator per section (`admin`, `tls`, `listen`, `peer`, `route`,
//!   `tuning`, `limits`, `policy`, `accel`, `keys`), each turning its raw
//!   section into the types of `types` and recording every problem with
//!   its key; one bad element does not hide the errors of the others.
//! - `crate::source`: the files (keys, certificates) and host facts
//!   validation reads, injected: [`Config::parse_str`] reads none.
//! - `diff`: what a reload changes between two configs.
//! - `users`: an explicit listener's `auth_file` (proxy clients' users).

mod accel;
mod admin;
mod check;
pub mod diff;
mod explain;
mod keys;
mod limits;
mod listen;
mod peer;
mod policy;
pub mod raw;
mod route;
mod tls;
mod tuning;
mod types;
mod users;

use std::path::Path;

use crate::policy::{is_host_local, is_link_local};

pub use crate::source::{Filesystem, NoFiles, Source};
pub use raw::RawConfig;
pub use types::*;
pub use users::ProxyUsers;

/// The one duration syntax of config files, `PUT /params` and the command
/// line: "250ms", "10s", "5m", "1h" (a bare number is seconds).
pub use splitway_control::params::parse_duration;

impl Config {
    /// Reads and validates a config file. Relative paths inside it (the PSK
    /// file) are resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
            path: shown.clone(),
            issues: vec![ConfigIssue {
                key: "(file)".into(),
                message: format!("cannot read: {e}"),
                at: None,
            }],
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::parse(&text, base).map_err(|issues| ConfigErrors {
            path: shown,
            issues,
        })
    }

    /// Parses and validates config text; `base` resolves relative paths.
    pub fn parse(text: &str, base: &Path) -> Result<Config, Vec<ConfigIssue>> {
        Config::parse_with(text, base, &Filesystem)
    }

    /// Parses and validates config text without touching the filesystem:
    /// a `psk_file` (or `psk_file_previous`, or a `[tls]` file) is reported
    /// as unreadable, and congestion control names are checked for form
    /// only. For checks of the text alone, and for fuzzing.
    pub fn parse_str(text: &str) -> Result<Config, Vec<ConfigIssue>> {
        Config::parse_with(text, Path::new("."), &NoFiles)
    }

    /// Parses and validates config text, reading files through `source`.
    pub fn parse_with(
        text: &str,
        base: &Path,
        source: &dyn Source,
    ) -> Result<Config, Vec<ConfigIssue>> {
        let table: toml::Table = match toml::from_str(text) {
            Ok(t) => t,
            Err(e) => {
                return Err(vec![ConfigIssue {
                    key: "(syntax)".into(),
                    message: e.message().trim().replace('\n', " "),
                    at: e
                        .span()
                        .map(|s| explain::Spans::new(text).location(text, s.start)),
                }]);
            }
        };
        let c = &mut check::Checker::new(source, base);
        admin::unknown_keys(c, &table);
        let name = admin::name(c, &table);
        let admin = admin::admin(c, &table);
        let metrics = admin::metrics(c, &table, admin);
        let workers = admin::workers(c, &table);
        let tls = tls::tls(c, &table);
        let listeners = listen::listeners(c, &table, &tls);
        let (peers, peer_names) = peer::peers(c, &table, &tls);
        let routes = route::routes(c, &table, &peers, &peer_names, &listeners);
        let direct = tuning::leg(c, &table, "direct");
        let client = tuning::leg(c, &table, "client");
        let upstream = tuning::leg(c, &table, "upstream");
        let timeouts = limits::timeouts(c, &table);
        let forwarding = limits::forwarding(c, &table);
        let access_log = limits::access_log(c, &table);
        let limits = limits::limits(c, &table);
        let policy = policy::policy(c, &table);
        let mut accel = accel::accel(c, &table, &listeners, &peers);
        accel::loss_isolation(c, &mut accel, &listeners, &client);
        accel::cross_checks(c, &accel, &listeners, &peers, &timeouts);
        let keys = keys::keys(c, &table);
        match name {
            Some(name) if c.issues.is_empty() => Ok(Config {
                name,
                psk_file: keys.psk_file,
                psk: keys.psk,
                psk_previous: keys.psk_previous,
                admin,
                metrics,
                workers,
                listeners,
                peers,
                routes,
                direct,
                client,
                upstream,
                timeouts,
                forwarding,
                accel,
                limits,
                policy,
                tls: tls.context,
                access_log,
            }),
            _ => {
                let mut issues = std::mem::take(&mut c.issues);
                // Spans only for a file with errors: a valid one is parsed once.
                let spans = explain::Spans::new(text);
                for issue in &mut issues {
                    issue.at = spans
                        .find(&issue.key)
                        .map(|s| spans.location(text, s.start));
                }
                // In the file's order, as an editor walks them; what the
                // file lacks (no place to point at) last.
                issues.sort_by_key(|i| i.at.map_or((usize::MAX, 0), |a| (a.line, a.column)));
                Err(issues)
            }
        }
    }

    /// Warnings that do not stop the relay but an operator should see.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let explicit = l.mode.is_explicit_proxy();
            if explicit && !l.addr.ip().is_loopback() && l.allow_clients.is_empty() {
                w.push(format!(
                    "listen[{i}]: {} listener on non-loopback {} without allow_clients: only loopback clients are accepted",
                    l.mode.as_str(),
                    l.addr
                ));
            }
        }
        if !self.policy.allow_local_destinations {
            for n in &self.policy.allow_destinations {
                if is_host_local(n.network()) {
                    w.push(format!(
                        "policy.allow_destinations: {n} is host-local: only loopback clients reach it unless policy.allow_local_destinations = true"
                    ));
                }
            }
        }
        if !self.policy.allow_link_local {
            for n in &self.policy.allow_destinations {
                if is_link_local(n.network()) {
                    w.push(format!(
                        "policy.allow_destinations: {n} is link-local: refused anyway unless policy.allow_link_local = true"
                    ));
                }
            }
        }
        if self.routes.is_empty() {
            w.push("no [[route]]: every connection will be refused (no route)".into());
        }
        let (v4, v6) = route::client_families(&self.listeners);
        for r in self.routes.iter().filter(|r| r.reveal.client_source) {
            let other = match r.dst {
                ipnet::IpNet::V4(_) => v6.then_some("IPv6"),
                ipnet::IpNet::V6(_) => v4.then_some("IPv4"),
            };
            if let Some(other) = other {
                w.push(format!(
                    "route {}: source = \"client\": {other} clients whose destination falls in this route are refused (a leg cannot leave from a client address of the other family)",
                    r.dst
                ));
            }
        }
        w
    }

    /// Every `congestion` key this config sets, as (key path, algorithm),
    /// in file order: what `congestion::register_for` and its `--check`
    /// read.
    pub fn congestion_keys(&self) -> Vec<(String, String)> {
        let peers = self
            .peers
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("peer[{i}].congestion"), &p.tuning.congestion));
        let legs = [
            ("direct.congestion", &self.direct.congestion),
            ("client.congestion", &self.client.congestion),
            ("upstream.congestion", &self.upstream.congestion),
        ]
        .map(|(key, cc)| (key.to_owned(), cc));
        peers
            .chain(legs)
            .filter_map(|(key, cc)| Some((key, cc.clone()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests;
