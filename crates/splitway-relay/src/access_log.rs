//! The access log (`[access_log]`, off by default): one line per closed
//! connection, written by the session's single exit: when it ended, the
//! client, the original destination, the next hop, bytes each way, how long
//! it lasted and how it ended (and who failed). Text (`key=value`) or JSON
//! lines, appended to a file opened at start.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use splitway_proto::Destination;
use tracing::warn;

use crate::config::{AccessLogConfig, AccessLogFormat};
use crate::error::RelayError;
use crate::policy::LogThrottle;

/// The open access log.
pub struct AccessLog {
    file: Mutex<std::fs::File>,
    format: AccessLogFormat,
}

/// One closed connection.
pub struct Entry<'a> {
    pub conn_id: u64,
    /// The listener mode that accepted it.
    pub mode: &'static str,
    pub client: SocketAddr,
    pub dst: &'a Destination,
    /// The next hop: a peer relay's name, `direct`, or none (no leg was up).
    pub via: Option<&'a str>,
    pub to_server: u64,
    pub to_client: u64,
    pub duration: Duration,
    /// The close reason (`splitway_connections_closed_total`'s label).
    pub outcome: &'static str,
    /// Who failed, when it failed.
    pub culprit: Option<&'static str>,
    pub error: Option<String>,
}

/// One warning a second at most when the log cannot be written (a full disk
/// fails every line).
static WRITE_ERRORS: LogThrottle = LogThrottle::new();

impl AccessLog {
    /// The access log `[access_log]` asks for, opened; `None` when off.
    pub fn start(
        cfg: Option<&AccessLogConfig>,
    ) -> Result<Option<std::sync::Arc<AccessLog>>, RelayError> {
        let Some(cfg) = cfg else {
            return Ok(None);
        };
        let log =
            AccessLog::open(&cfg.path, cfg.format).map_err(|source| RelayError::AccessLog {
                path: cfg.path.clone(),
                source,
            })?;
        Ok(Some(std::sync::Arc::new(log)))
    }

    /// Opens (creating, appending to) the file at `path`.
    pub fn open(path: &Path, format: AccessLogFormat) -> std::io::Result<AccessLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(AccessLog {
            file: Mutex::new(file),
            format,
        })
    }

    /// Appends `entry` as one line, in one write (O_APPEND keeps lines whole
    /// however many threads write). A failed write is warned about,
    /// throttled, and counts nothing else: the connection is over either way.
    pub fn write(&self, entry: &Entry<'_>) {
        let line = match self.format {
            AccessLogFormat::Text => text(entry, SystemTime::now()),
            AccessLogFormat::Json => json(entry, SystemTime::now()),
        };
        let result = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .write_all(line.as_bytes());
        if let Err(e) = result
            && let Some(suppressed) = WRITE_ERRORS.admit()
        {
            warn!(error = %e, suppressed, "cannot write the access log");
        }
    }
}

/// `key=value` pairs; values with spaces or quotes (errors, domain names
/// cannot have them) are quoted.
fn text(e: &Entry<'_>, now: SystemTime) -> String {
    let mut line = String::with_capacity(256);
    // Writing to a String cannot fail.
    let _ = write!(
        line,
        "time={} conn={:016x} mode={} client={} dst={} via={} to_server={} to_client={} duration_ms={:.1} outcome={}",
        rfc3339(now),
        e.conn_id,
        e.mode,
        e.client,
        e.dst,
        e.via.unwrap_or("-"),
        e.to_server,
        e.to_client,
        e.duration.as_secs_f64() * 1e3,
        e.outcome,
    );
    if let Some(culprit) = e.culprit {
        let _ = write!(line, " culprit={culprit}");
    }
    if let Some(error) = &e.error {
        let _ = write!(line, " error={error:?}");
    }
    line.push('\n');
    line
}

fn json(e: &Entry<'_>, now: SystemTime) -> String {
    let value = serde_json::json!({
        "time": rfc3339(now),
        "conn": format!("{:016x}", e.conn_id),
        "mode": e.mode,
        "client": e.client.to_string(),
        "dst": e.dst.to_string(),
        "via": e.via,
        "to_server": e.to_server,
        "to_client": e.to_client,
        "duration_ms": (e.duration.as_secs_f64() * 1e4).round() / 10.0,
        "outcome": e.outcome,
        "culprit": e.culprit,
        "error": e.error,
    });
    let mut line = value.to_string();
    line.push('\n');
    line
}

/// UTC, millisecond precision: `2026-11-27T23:40:01.250Z`.
fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dst: &Destination) -> Entry<'_> {
        Entry {
            conn_id: 0xab,
            mode: "socks5",
            client: "127.0.0.1:40000".parse().unwrap(),
            dst,
            via: Some("rs"),
            to_server: 10,
            to_client: 2000,
            duration: Duration::from_micros(12_345),
            outcome: "upstream_reset",
            culprit: Some("server"),
            error: Some("server 10.0.0.9:80: forward: reset \"x\"".into()),
        }
    }

    #[test]
    fn dates_are_utc_calendar_dates() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_824_001_250);
        assert_eq!(rfc3339(t), "2026-11-28T00:00:01.250Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn text_lines_quote_errors_and_json_lines_parse() {
        let dst = Destination::Ip("10.0.0.9:80".parse().unwrap());
        let e = entry(&dst);
        let line = text(&e, UNIX_EPOCH);
        assert_eq!(
            line,
            "time=1970-01-01T00:00:00.000Z conn=00000000000000ab mode=socks5 client=127.0.0.1:40000 dst=10.0.0.9:80 via=rs to_server=10 to_client=2000 duration_ms=12.3 outcome=upstream_reset culprit=server error=\"server 10.0.0.9:80: forward: reset \\\"x\\\"\"\n"
        );
        let v: serde_json::Value = serde_json::from_str(&json(&e, UNIX_EPOCH)).unwrap();
        assert_eq!(v["via"], "rs");
        assert_eq!(v["to_client"], 2000);
        assert_eq!(v["duration_ms"], 12.3);
        assert_eq!(v["outcome"], "upstream_reset");
    }
}
