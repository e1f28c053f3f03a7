//! The process's own resources, read from `/proc` at each scrape under
//! the names every Prometheus client library uses (`process_*`, no
//! `splitway_` prefix), so the usual dashboards and alerts apply: CPU,
//! resident and virtual memory, open descriptors against their limit, and
//! the start time.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's USER_HZ,
/// which the kernel fixes at 100 for every architecture it exports to user
/// space (`sysconf(_SC_CLK_TCK)` answers 100).
const USER_HZ: f64 = 100.0;

/// Reads `/proc/self` at each scrape; a file it cannot read leaves its
/// series out of that scrape rather than failing the page.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of the process.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessSample {
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl ProcessSample {
    pub fn read() -> ProcessSample {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let times = stat.as_deref().and_then(stat_times);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        ProcessSample {
            cpu_seconds: times.map(|(cpu, _)| cpu as f64 / USER_HZ),
            start_time_seconds: times
                .zip(boot)
                .map(|((_, start), boot)| boot as f64 + start as f64 / USER_HZ),
            resident_bytes: status_kib(&status, "VmRSS:").map(|k| k * 1024),
            virtual_bytes: status_kib(&status, "VmSize:").map(|k| k * 1024),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|s| open_files_limit(&s)),
        }
    }
}

/// `utime + stime` and `starttime`, in clock ticks, of a `stat` line. The
/// command name (field 2) may hold spaces and parentheses: fields are
/// counted from its closing parenthesis.
fn stat_times(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state): field n is rest's (n - 3)th.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((field(14)? + field(15)?, field(22)?))
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A `kB` value of `/proc/self/status`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn open_files_limit(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessSample::read();
        if let Some(v) = s.cpu_seconds {
            let counter = ConstCounter::new(v);
            let e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time spent, in seconds.",
                None,
                counter.metric_type(),
            )?;
            counter.encode(e)?;
        }
        let gauges: [(&str, &str, Option<f64>); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Open file descriptors (sockets, pipes, files).",
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "The limit of open file descriptors (RLIMIT_NOFILE, soft).",
                s.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
                s.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(v) = value else { continue };
            let gauge = ConstGauge::new(v);
            let e = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(e)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_past_a_name_with_parentheses() {
        // Fields 14, 15 (utime, stime) and 22 (starttime) of a process
        // whose name is "a) (b".
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[14 - 3] = "250".into();
        fields[15 - 3] = "50".into();
        fields[22 - 3] = "12345".into();
        let line = format!("42 (a) (b) {}", fields.join(" "));
        assert_eq!(stat_times(&line), Some((300, 12345)));
    }

    #[test]
    fn this_process_is_read() {
        let s = ProcessSample::read();
        assert!(s.resident_bytes.is_some_and(|b| b > 0), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(s.max_fds.is_some_and(|n| n >= s.open_fds.unwrap()), "{s:?}");
        let start = s.start_time_seconds.expect("start time");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started in the last day, and not in the future (tick rounding).
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} {now}"
        );
        assert!(s.cpu_seconds.is_some());
        assert_eq!(
            open_files_limit(
                "Max open files            1024                 524288               files     \n"
            ),
            Some(1024)
        );
    }
}
