//! splitway-sys: the one crate that talks to the kernel.
//!
//! Every `unsafe` block of the project lives here, each with a `SAFETY:`
//! comment. Other crates get safe wrappers: socket options, splice and
//! pipes, netfilter and route setup, network namespaces, TUN devices and
//! real-time scheduling for the lab, the BPF loader, and adoption of
//! listening sockets passed by a service manager (socket activation), and
//! the io_uring forwarder of the data-path study (`uring`, not used by the
//! relay; see docs/data-path.md).

pub mod activation;
pub mod bpf;
/// The congestion-control loader under its former path.
pub use bpf::cc;
pub mod hops;
pub mod mem;
mod netlink;
pub mod netns;
pub mod nfqueue;
pub mod rt;
pub mod rtnl;
pub mod sock;
pub mod splice;
pub mod tproxy;
pub mod tun;
pub mod turbo;
#[cfg(feature = "uring")]
pub mod uring;

use thiserror::Error;

/// Errors from system calls and system commands. These are always
/// "internal" from the relay's point of view: the local host refused.
#[derive(Debug, Error)]
pub enum SysError {
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("command {cmd} failed: {detail}")]
    Command { cmd: String, detail: String },
    #[error("{0}")]
    Internal(String),
    /// Loading, attaching or reading a BPF program or map failed.
    #[error("bpf {op}: {detail}")]
    Bpf { op: String, detail: String },
}

impl SysError {
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        SysError::Io {
            op: op.into(),
            source,
        }
    }
}
