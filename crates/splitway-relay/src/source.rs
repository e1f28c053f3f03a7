//! Where validation reads the files a config names (keys, certificates) and
//! the host facts it checks against (the kernel's congestion controls).
//! Injected, so that [`Config::parse_str`](crate::config::Config::parse_str) and the
//! fuzzer built on it touch no file: a fuzzed `psk_file = "/dev/zero"` is
//! never opened.

use std::io::{self, Read};
use std::path::Path;

/// What parsing may read beyond the config text.
pub trait Source {
    /// The file at `path`, refused if longer than `max` bytes (a device or
    /// a wrong path must not be read forever). `what` names the kind of file
    /// in that refusal ("a key file").
    fn read(&self, path: &Path, max: u64, what: &str) -> io::Result<Vec<u8>>;

    /// The kernel's congestion control names; empty when unknown (then any
    /// well-formed name is accepted).
    fn congestion_controls(&self) -> Vec<String>;
}

/// The real filesystem and `/proc`: what [`Config::load`](crate::config::Config::load)
/// and [`Config::parse`](crate::config::Config::parse) use.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filesystem;

impl Source for Filesystem {
    fn read(&self, path: &Path, max: u64, what: &str) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)?
            .take(max + 1)
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("longer than {max} bytes: not {what}"),
            ));
        }
        Ok(bytes)
    }

    fn congestion_controls(&self) -> Vec<String> {
        splitway_sys::sock::available_congestion_controls()
    }
}

/// Reads nothing: every file is reported unreadable and the kernel's
/// congestion controls unknown. For checks of the text alone and fuzzing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFiles;

impl Source for NoFiles {
    fn read(&self, _: &Path, _: u64, _: &str) -> io::Result<Vec<u8>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "key files are not read when parsing text alone",
        ))
    }

    fn congestion_controls(&self) -> Vec<String> {
        Vec::new()
    }
}
