//! The link emulator: per link and per direction, random loss, a
//! rate-limited drop-tail queue and a fixed one-way delay with optional
//! jitter, applied to raw IP packets moved between two TUN devices by one
//! real-time thread per link. See `pipeline` for the per-packet semantics,
//! `link` for the thread, `stats` for the self-checks.

pub mod link;
pub mod pipeline;
pub mod rng;
pub mod stats;

pub use link::{LinkConfig, LinkHandle, PacketDevice, REALTIME_PRIORITY};
pub use pipeline::{DirectionParams, QueueBound};
pub use stats::{DirectionStats, EmuStats, LatenessSummary, LinkStats, TunCounters};

use splitway_sys::SysError;
use thiserror::Error;

/// Errors of the emulator, the topology and the fidelity run. All are
/// internal to the lab (the local host refused or the spec is invalid).
#[derive(Debug, Error)]
pub enum EmuError {
    #[error("invalid lab topology: {0}")]
    Spec(String),
    #[error("lab host setup failed: {0}")]
    Sys(#[from] SysError),
    #[error("lab internal: {op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("lab internal: {0}")]
    Internal(String),
}

impl EmuError {
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        EmuError::Io {
            op: op.into(),
            source,
        }
    }
}
