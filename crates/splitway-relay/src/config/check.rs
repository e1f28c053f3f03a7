//! The issue collector every section validator writes to, and the value
//! checks several sections share (addresses, durations, prefixes).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use serde::de::DeserializeOwned;

use serde_path_to_error::Segment;

use super::explain;
use super::parse_duration;
use super::types::ConfigIssue;
use crate::source::Source;

/// Collects issues while walking the file.
pub(super) struct Checker<'a> {
    pub issues: Vec<ConfigIssue>,
    pub source: &'a dyn Source,
    /// Relative paths inside the file are resolved against it.
    pub base: &'a Path,
    /// The kernel's congestion controls, read once per parse.
    congestion_controls: Option<Vec<String>>,
}

impl<'a> Checker<'a> {
    pub fn new(source: &'a dyn Source, base: &'a Path) -> Checker<'a> {
        Checker {
            issues: Vec::new(),
            source,
            base,
            congestion_controls: None,
        }
    }

    pub fn err(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue {
            key: key.into(),
            message: message.into(),
            at: None,
        });
    }

    /// Whether an issue was recorded under exactly `key`.
    pub fn has_issue(&self, key: &str) -> bool {
        self.issues.iter().any(|i| i.key == key)
    }

    pub fn congestion_controls(&mut self) -> Vec<String> {
        let source = self.source;
        self.congestion_controls
            .get_or_insert_with(|| source.congestion_controls())
            .clone()
    }

    /// Deserializes one value, recording each failure under its full key
    /// path (`listen[0].intercept.ports[1]`) in plain words. A key that
    /// fails is left out and the rest deserialized again, so every bad key
    /// of an entry is reported, not only the first; the entry without them
    /// is returned for the checks of its other keys (the file stays invalid
    /// all the same). `None` if no usable entry is left.
    pub fn section<T: DeserializeOwned>(&mut self, key: &str, value: &toml::Value) -> Option<T> {
        let mut value = value.clone();
        let mut left_out: Vec<String> = Vec::new();
        // Each round leaves out one key of the value, so this ends.
        loop {
            let error = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
                Ok(v) => return Some(v),
                Err(e) => e,
            };
            let path: Vec<Segment> = error.path().iter().cloned().collect();
            let message = error.inner().message().trim().to_owned();
            let at = |segments: &[Segment]| join(key, segments);
            if let Some(field) = message
                .strip_prefix("missing field `")
                .and_then(|f| f.strip_suffix('`'))
            {
                // A key left out above is reported already, as what it was.
                let missing = format!("{}.{field}", at(&path));
                if !left_out.contains(&missing) {
                    self.err(missing, explain::plain(&message));
                }
                // A table inside the entry that lacks it is left out in
                // turn, so that the keys after it are still checked.
                let cut = path
                    .iter()
                    .rposition(|s| matches!(s, Segment::Map { .. }))?;
                if !leave_out(&mut value, &path[..=cut]) {
                    return None;
                }
                left_out.push(at(&path[..=cut]));
                continue;
            }
            // An unknown key: serde names it in the message, not the path.
            let unknown = message
                .strip_prefix("unknown field `")
                .and_then(|rest| rest.split('`').next())
                .map(str::to_owned);
            let mut full = path.clone();
            if let Some(name) = &unknown
                && !matches!(full.last(), Some(Segment::Map { key }) if key == name)
            {
                full.push(Segment::Map { key: name.clone() });
            }
            self.err(at(&full), explain::plain(&message));
            // Leave out the innermost table key holding the failure.
            let cut = full
                .iter()
                .rposition(|s| matches!(s, Segment::Map { .. }))?;
            if !leave_out(&mut value, &full[..=cut]) {
                return None;
            }
            left_out.push(at(&full[..=cut]));
        }
    }

    /// An optional table of the file, deserialized; `None` when absent or
    /// unusable (the latter with its issue recorded).
    pub fn table<T: DeserializeOwned>(&mut self, table: &toml::Table, key: &str) -> Option<T> {
        table.get(key).and_then(|v| self.section(key, v))
    }

    /// An array of tables (`[[listen]]` etc.), each element deserialized alone.
    pub fn elements<T: DeserializeOwned>(
        &mut self,
        table: &toml::Table,
        key: &str,
    ) -> Vec<(String, Option<T>)> {
        match table.get(key) {
            None => Vec::new(),
            Some(toml::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let k = format!("{key}[{i}]");
                    let parsed = self.section::<T>(&k, v);
                    (k, parsed)
                })
                .collect(),
            Some(_) => {
                self.err(key, format!("must be an array of tables ([[{key}]])"));
                Vec::new()
            }
        }
    }

    pub fn socket_addr(&mut self, key: &str, text: &str) -> Option<SocketAddr> {
        match text.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.err(
                    key,
                    format!("`{text}` is not an IP:port address (IPv6 as [addr]:port)"),
                );
                None
            }
        }
    }

    pub fn duration(&mut self, key: &str, text: &str) -> Option<Duration> {
        match parse_duration(text) {
            Some(d) => Some(d),
            None => {
                self.err(
                    key,
                    format!("`{text}` is not a duration (e.g. \"500ms\", \"10s\", \"5m\", \"1h\")"),
                );
                None
            }
        }
    }

    /// A prefix without host bits, `None` with the issue recorded.
    /// `example` completes "is not a prefix (e.g. ...)".
    pub fn prefix(&mut self, key: &str, text: &str, example: &str) -> Option<IpNet> {
        match text.parse::<IpNet>() {
            Ok(n) if n.trunc() != n => {
                self.err(
                    key,
                    format!("`{text}` has host bits set (did you mean {}?)", n.trunc()),
                );
                None
            }
            Ok(n) => Some(n),
            Err(_) => {
                self.err(key, format!("`{text}` is not a prefix (e.g. {example})"));
                None
            }
        }
    }

    /// A list of prefixes without host bits, each error under `key[i]`.
    pub fn prefixes(&mut self, key: &str, list: &[String]) -> Vec<IpNet> {
        list.iter()
            .enumerate()
            .filter_map(|(i, text)| {
                self.prefix(
                    &format!("{key}[{i}]"),
                    text,
                    "10.0.0.0/8, 192.0.2.7/32, ::1/128",
                )
            })
            .collect()
    }

    /// An interface name as the kernel takes it, else the issue under `key`.
    pub fn interface(&mut self, key: String, iface: &str) -> bool {
        let ok = !(iface.is_empty() || iface.len() > 15 || iface.contains(['"', ' ', '/']));
        if !ok {
            self.err(key, format!("`{iface}` is not an interface name"));
        }
        ok
    }
}

/// Relay and peer names: short, lowercase, usable in keys and metrics.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// `key` followed by serde's path into its value, as the file's keys are
/// written (`listen[0].intercept.ports[1]`).
fn join(key: &str, segments: &[Segment]) -> String {
    let mut out = key.to_owned();
    for s in segments {
        match s {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out.push('.');
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// Removes the key at `path` (its last step a table key) from `value`;
/// false if the path does not lead to it.
fn leave_out(value: &mut toml::Value, path: &[Segment]) -> bool {
    let Some((Segment::Map { key }, parents)) = path.split_last() else {
        return false;
    };
    let mut node = value;
    for step in parents {
        node = match (step, node) {
            (Segment::Map { key }, toml::Value::Table(t)) => match t.get_mut(key) {
                Some(v) => v,
                None => return false,
            },
            (Segment::Seq { index }, toml::Value::Array(a)) => match a.get_mut(*index) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match node {
        toml::Value::Table(t) => t.remove(key).is_some(),
        _ => false,
    }
}
