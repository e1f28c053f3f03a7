//! Errors of the control plane itself (as opposed to a misbehaving admin
//! client, which is answered with an HTTP error and logged, never returned).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A failure of the admin server's own socket handling.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The admin listener could not be bound (address in use, no permission,
    /// address not local, ...).
    #[error("admin API: cannot listen on {addr}")]
    Bind {
        /// The address that was asked for.
        addr: SocketAddr,
        /// Why the kernel refused.
        #[source]
        source: io::Error,
    },
    /// The admin unix socket could not be created at `path`.
    #[error("admin API: cannot listen on unix socket {}", .path.display())]
    BindUnix {
        /// The socket path that was asked for.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The listening socket itself failed in a way retrying cannot fix
    /// (e.g. it is not listening). Per-connection failures never end up here.
    #[error(
        "admin API: listener{} failed",
        .addr.map(|addr| format!(" on {addr}")).unwrap_or_default()
    )]
    Accept {
        /// The listener's local address, if the kernel still reports one.
        addr: Option<SocketAddr>,
        /// The accept error.
        #[source]
        source: io::Error,
    },
}
