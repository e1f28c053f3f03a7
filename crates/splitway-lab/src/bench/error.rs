//! How the bench fails, and who failed.

use crate::runner::LabError;

/// What failed in the bench, and who.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bench: {tool} failed: {detail}")]
    Tool { tool: String, detail: String },
    #[error("bench internal: {op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bench namespace: {0}")]
    Netns(#[from] splitway_sys::SysError),
}

impl From<BenchError> for LabError {
    fn from(e: BenchError) -> Self {
        match e {
            BenchError::Tool { tool, detail } => LabError::Peer {
                tool,
                host: "bench namespace".into(),
                detail,
            },
            BenchError::Io { op, source } => LabError::Io { op, source },
            other => LabError::Peer {
                tool: "bench".into(),
                host: "bench namespace".into(),
                detail: other.to_string(),
            },
        }
    }
}
