//! Socket tuning of a kind of leg: `[direct]`, `[client]`, `[upstream]`
//! and each `[[peer]]`'s own keys.

use super::check::Checker;
use super::raw::RawTuning;
use super::types::LegTuning;

/// `[direct]`, `[client]` or `[upstream]`; defaults when absent or unusable.
pub(super) fn leg(c: &mut Checker, table: &toml::Table, key: &str) -> LegTuning {
    c.table::<RawTuning>(table, key)
        .map(|r| tuning(c, key, r))
        .unwrap_or_default()
}

pub(super) fn tuning(c: &mut Checker, key: &str, raw: RawTuning) -> LegTuning {
    let congestion = raw.congestion.and_then(|cc| congestion(c, key, cc));
    let mut buf = |name: &str, v: Option<u64>| -> Option<usize> {
        let v = v?;
        if !(4096..=1 << 30).contains(&v) {
            c.err(
                format!("{key}.{name}"),
                format!("{v} is outside 4096..=1073741824 bytes"),
            );
            None
        } else {
            Some(v as usize)
        }
    };
    let sndbuf = buf("sndbuf", raw.sndbuf);
    let rcvbuf = buf("rcvbuf", raw.rcvbuf);
    let mut duration_or_off = |name: &str, v: Option<String>| {
        v.and_then(|k| {
            if k == "off" {
                Some(None)
            } else {
                let d = c.duration(&format!("{key}.{name}"), &k)?;
                if d.is_zero() {
                    c.err(
                        format!("{key}.{name}"),
                        "must be greater than zero (\"off\" turns it off)",
                    );
                    return None;
                }
                Some(Some(d))
            }
        })
    };
    let keepalive = duration_or_off("keepalive", raw.keepalive);
    let user_timeout = duration_or_off("user_timeout", raw.user_timeout);
    LegTuning {
        congestion,
        nodelay: raw.nodelay,
        sndbuf,
        rcvbuf,
        keepalive,
        user_timeout,
    }
}

/// The key's algorithm, when [`crate::congestion::config::check_name`]
/// takes it.
fn congestion(c: &mut Checker, key: &str, cc: String) -> Option<String> {
    let available = c.congestion_controls();
    match crate::congestion::config::check_name(&cc, &available) {
        Ok(()) => Some(cc),
        Err(e) => {
            c.err(format!("{key}.congestion"), e);
            None
        }
    }
}
