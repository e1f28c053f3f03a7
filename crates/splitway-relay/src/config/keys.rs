//! `psk_file` and `psk_file_previous`: the relays' shared keys, read
//! through the parse's [`Source`](crate::source::Source).

use std::path::{Path, PathBuf};

use splitway_proto::auth::Psk;

use super::check::Checker;

/// A key file is a few dozen hex digits; anything much longer (or endless,
/// like a device) is a mistake, not a key.
const MAX_KEY_FILE: u64 = 16 * 1024;

/// The keys and where the current one came from.
pub(super) struct Keys {
    pub psk_file: Option<PathBuf>,
    pub psk: Option<Psk>,
    pub psk_previous: Option<Psk>,
}

pub(super) fn keys(c: &mut Checker, table: &toml::Table) -> Keys {
    // The PSK is needed as soon as any leg touches another relay. Judged
    // on the raw file, so an element with its own error still counts.
    let raw_peer_listener = match table.get("listen") {
        Some(toml::Value::Array(items)) => items
            .iter()
            .any(|l| l.get("mode").and_then(toml::Value::as_str) == Some("peer")),
        _ => false,
    };
    let needs_psk = table.contains_key("peer") || raw_peer_listener;
    let psk_file = c
        .table::<String>(table, "psk_file")
        .map(|p| absolute(c.base, &p));
    let psk = match &psk_file {
        Some(p) => key_file(c, "psk_file", p),
        None => {
            if needs_psk {
                c.err("psk_file", "missing: peers and peer listeners need the shared key (generate one with `splitway keygen`)");
            }
            None
        }
    };
    let base = c.base;
    let psk_previous = c
        .table::<String>(table, "psk_file_previous")
        .and_then(|p| key_file(c, "psk_file_previous", &absolute(base, &p)));
    if psk_previous.is_some() && psk.is_none() && !c.has_issue("psk_file") {
        c.err("psk_file_previous", "needs psk_file (the current key)");
    }
    Keys {
        psk_file,
        psk,
        psk_previous,
    }
}

/// Reads a pre-shared key file, recording a failure under `key`.
fn key_file(c: &mut Checker, key: &str, path: &Path) -> Option<Psk> {
    let read = c
        .source
        .read(path, MAX_KEY_FILE, "a key file")
        .and_then(|bytes| {
            String::from_utf8(bytes).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "stream did not contain valid UTF-8",
                )
            })
        });
    match read {
        Ok(text) => match Psk::from_hex(&text) {
            Ok(k) => Some(k),
            Err(e) => {
                c.err(key, format!("{}: {e}", path.display()));
                None
            }
        },
        Err(e) => {
            c.err(key, format!("cannot read {}: {e}", path.display()));
            None
        }
    }
}

/// `path` against `base`, made absolute (against the working directory, no
/// file touched): a relay started with `-c rc.toml` and reloaded through
/// the absolute path of its file names the same key file both times, so a
/// reload reports no change that did not happen.
pub(super) fn absolute(base: &Path, path: &str) -> PathBuf {
    let joined = base.join(path);
    std::path::absolute(&joined).unwrap_or(joined)
}
