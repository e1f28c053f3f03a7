//! Errors of one relayed connection, each saying who failed.

use std::io;
use std::net::SocketAddr;

use crate::metrics::{CloseReason, DenyReason};
use splitway_proto::header::ReplyStatus;

/// Who is to blame for a failure: what an operator needs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Culprit {
    /// The client (or, for a peer listener, the upstream relay that dialed us).
    Client,
    /// The final server.
    Server,
    /// The next relay in the chain.
    PeerRelay,
    /// This relay itself (resources, configuration, bugs).
    Internal,
}

impl Culprit {
    pub fn as_str(self) -> &'static str {
        match self {
            Culprit::Client => "client",
            Culprit::Server => "server",
            Culprit::PeerRelay => "peer relay",
            Culprit::Internal => "internal",
        }
    }
}

/// Why a connection could not be set up or ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("client: {op}: {source}")]
    ClientIo {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("client: bad request: {0}")]
    ClientProtocol(String),
    #[error("client: handshake not finished within {0:?}")]
    ClientTimeout(std::time::Duration),
    /// A proxy client's credentials are missing, malformed or not in the
    /// listener's `auth_file`; `user`, when it named one.
    #[error("client: proxy credentials refused{}: {why}", .user.as_ref().map(|u| format!(" for user \"{u}\"")).unwrap_or_default())]
    ClientCredentials {
        user: Option<String>,
        why: &'static str,
    },
    #[error("client {client} not allowed on this listener")]
    ClientNotAllowed { client: SocketAddr },
    #[error("upstream relay closed an authenticated connection without using it")]
    PooledUnused,
    #[error("upstream relay failed TLS: {0}")]
    ClientTls(String),
    #[error("upstream relay failed authentication: {0}")]
    PeerAuth(#[from] splitway_proto::auth::AuthError),
    #[error("peer relay {peer}: {op}: {source}")]
    PeerIo {
        peer: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("peer relay {peer}: TLS: {detail}")]
    PeerTls { peer: String, detail: String },
    #[error("peer relay {peer}: protocol error: {detail}")]
    PeerProtocol { peer: String, detail: String },
    #[error("peer relay {peer} refused our authentication: {reason}")]
    PeerRejected { peer: String, reason: String },
    #[error("peer relay {peer}: timed out {during}")]
    PeerTimeout { peer: String, during: &'static str },
    #[error("peer relay {peer} reported: {}", .status.as_str())]
    Downstream { peer: String, status: ReplyStatus },
    #[error("server {addr}: connect: {source}")]
    ServerConnect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("server {addr}: {op}: {source}")]
    ServerIo {
        addr: SocketAddr,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("server {addr}: connect timed out")]
    ServerTimeout { addr: SocketAddr },
    #[error("cannot resolve {host}: {detail}")]
    Resolve { host: String, detail: String },
    #[error("no route to {0}")]
    NoRoute(SocketAddr),
    #[error("relay chain TTL exceeded")]
    TtlExceeded,
    #[error("client: destination refused by policy: {0}")]
    Denied(#[from] crate::policy::Denial),
    /// `source = "client"`: the leg could not leave from the client's address.
    #[error("cannot dial server {server} from client address {client}: {detail}")]
    ClientSource {
        client: SocketAddr,
        server: SocketAddr,
        detail: String,
    },
    #[error("internal: {0}")]
    Internal(String),
}

impl ConnError {
    pub fn culprit(&self) -> Culprit {
        match self {
            ConnError::ClientIo { .. }
            | ConnError::ClientProtocol(_)
            | ConnError::ClientTimeout(_)
            | ConnError::ClientNotAllowed { .. }
            | ConnError::ClientCredentials { .. }
            | ConnError::PeerAuth(_)
            | ConnError::Denied(_)
            | ConnError::ClientTls(_)
            | ConnError::PooledUnused => Culprit::Client,
            ConnError::PeerIo { .. }
            | ConnError::PeerTls { .. }
            | ConnError::PeerProtocol { .. }
            | ConnError::PeerTimeout { .. }
            | ConnError::PeerRejected { .. }
            | ConnError::Downstream { .. } => Culprit::PeerRelay,
            ConnError::ServerConnect { .. }
            | ConnError::ServerIo { .. }
            | ConnError::ServerTimeout { .. } => Culprit::Server,
            ConnError::Resolve { .. } | ConnError::NoRoute(_) | ConnError::TtlExceeded => {
                Culprit::Internal
            }
            ConnError::Internal(_) | ConnError::ClientSource { .. } => Culprit::Internal,
        }
    }

    /// The status reported upstream (Reply frame, SOCKS reply, HTTP status).
    pub fn reply_status(&self) -> ReplyStatus {
        match self {
            ConnError::ServerConnect { source, .. } => status_for_connect_error(source),
            ConnError::ServerTimeout { .. } | ConnError::PeerTimeout { .. } => ReplyStatus::Timeout,
            ConnError::Downstream { status, .. } => *status,
            ConnError::Resolve { .. } => ReplyStatus::Unreachable,
            ConnError::NoRoute(_) => ReplyStatus::NoRoute,
            ConnError::TtlExceeded => ReplyStatus::TtlExceeded,
            ConnError::ClientNotAllowed { .. }
            | ConnError::ClientCredentials { .. }
            | ConnError::Denied(_) => ReplyStatus::NotAllowed,
            ConnError::ClientProtocol(_) => ReplyStatus::BadHeader,
            ConnError::PeerIo { .. }
            | ConnError::ServerIo { .. }
            | ConnError::PeerProtocol { .. }
            | ConnError::PeerTls { .. } => ReplyStatus::Unreachable,
            _ => ReplyStatus::Internal,
        }
    }

    /// Why the connection was refused by access policy, here or (for a
    /// `NotAllowed` Reply) at the next relay; `None` for other failures.
    pub fn deny_reason(&self) -> Option<DenyReason> {
        match self {
            ConnError::Denied(d) => Some(d.reason()),
            ConnError::ClientNotAllowed { .. } => Some(DenyReason::Client),
            ConnError::ClientCredentials { .. } => Some(DenyReason::Credentials),
            ConnError::Downstream {
                status: ReplyStatus::NotAllowed,
                ..
            } => Some(DenyReason::Downstream),
            _ => None,
        }
    }

    /// The metrics label for a connection that ended with this error.
    pub fn close_reason(&self) -> CloseReason {
        match self {
            ConnError::ClientIo { .. } => CloseReason::ClientReset,
            ConnError::ClientProtocol(_) => CloseReason::BadRequest,
            ConnError::ClientTimeout(_) => CloseReason::HandshakeTimeout,
            ConnError::ClientNotAllowed { .. } => CloseReason::NotAllowed,
            // Told apart from an unreachable server: a DNS problem is the
            // operator's to fix, not the network's.
            ConnError::Resolve { .. } => CloseReason::ResolveFailed,
            ConnError::PeerAuth(_)
            | ConnError::ClientTls(_)
            | ConnError::PeerRejected { .. }
            | ConnError::ClientCredentials { .. } => CloseReason::AuthFailed,
            // An upstream pool retiring a connection it never needed.
            ConnError::PooledUnused => CloseReason::Completed,
            _ => match self.reply_status() {
                ReplyStatus::Refused => CloseReason::ConnectRefused,
                ReplyStatus::Unreachable => CloseReason::ConnectUnreachable,
                ReplyStatus::Timeout => CloseReason::ConnectTimeout,
                ReplyStatus::NoRoute => CloseReason::NoRoute,
                ReplyStatus::TtlExceeded => CloseReason::TtlExceeded,
                ReplyStatus::NotAllowed => CloseReason::NotAllowed,
                ReplyStatus::BadHeader => CloseReason::BadRequest,
                _ => CloseReason::Internal,
            },
        }
    }
}

fn status_for_connect_error(e: &io::Error) -> ReplyStatus {
    match e.raw_os_error() {
        Some(libc_consts::ECONNREFUSED) => ReplyStatus::Refused,
        Some(libc_consts::ETIMEDOUT) => ReplyStatus::Timeout,
        _ => ReplyStatus::Unreachable,
    }
}

/// errno values without pulling libc into this crate.
mod libc_consts {
    pub const ECONNREFUSED: i32 = 111;
    pub const ETIMEDOUT: i32 = 110;
}

/// Errors that stop the relay as a whole (startup, listeners).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("cannot open the access log {}: {source}", path.display())]
    AccessLog {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {addr} ({mode}): {source}")]
    Listen {
        addr: SocketAddr,
        mode: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot install TPROXY interception for {addr}: {source}")]
    Intercept {
        addr: SocketAddr,
        #[source]
        source: splitway_sys::SysError,
    },
    /// `accel.strict` was asked for and this host cannot hold SYNs.
    #[error("accel.strict: {0}")]
    Strict(String),
    /// A listening socket passed by the service manager (socket
    /// activation) that the config cannot use.
    #[error("inherited listening socket {addr} (fd {fd}): {reason}")]
    Inherited {
        addr: String,
        fd: i32,
        reason: String,
    },
    /// The host lacks what the config names (an interface to intercept on).
    #[error(transparent)]
    Host(#[from] crate::preflight::HostIssues),
    /// Its own message names the admin API.
    #[error(transparent)]
    Admin(#[from] splitway_control::ControlError),
    /// A BPF congestion control the config names could not be registered.
    #[error(transparent)]
    Congestion(#[from] crate::congestion::CongestionError),
    #[error("internal: {0}")]
    Internal(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Denial;

    #[test]
    fn denials_map_to_not_allowed_everywhere() {
        let ip = "192.0.2.1".parse().unwrap();
        for (denial, reason) in [
            (Denial::Port(22), DenyReason::Port),
            (Denial::NotAllowed(ip), DenyReason::Destination),
            (Denial::Denied(ip), DenyReason::Destination),
            (Denial::Local(ip), DenyReason::Local),
        ] {
            let e = ConnError::from(denial);
            assert_eq!(e.reply_status(), ReplyStatus::NotAllowed, "{e}");
            assert_eq!(e.close_reason(), CloseReason::NotAllowed, "{e}");
            assert_eq!(e.deny_reason(), Some(reason), "{e}");
            assert_eq!(e.culprit(), Culprit::Client, "{e}");
        }
        let downstream = ConnError::Downstream {
            peer: "rs".into(),
            status: ReplyStatus::NotAllowed,
        };
        assert_eq!(downstream.close_reason(), CloseReason::NotAllowed);
        assert_eq!(downstream.deny_reason(), Some(DenyReason::Downstream));
        let credentials = ConnError::ClientCredentials {
            user: Some("alice".into()),
            why: "wrong user name or password",
        };
        assert_eq!(credentials.culprit(), Culprit::Client);
        assert_eq!(credentials.close_reason(), CloseReason::AuthFailed);
        assert_eq!(credentials.deny_reason(), Some(DenyReason::Credentials));
        assert_eq!(
            credentials.to_string(),
            "client: proxy credentials refused for user \"alice\": wrong user name or password"
        );
        let refused = ConnError::Downstream {
            peer: "rs".into(),
            status: ReplyStatus::Refused,
        };
        assert_eq!(refused.deny_reason(), None);
        assert_eq!(
            ConnError::NoRoute(([10, 0, 0, 1], 80).into()).deny_reason(),
            None
        );
    }

    #[test]
    fn resolve_failure_has_its_own_close_reason() {
        let e = ConnError::Resolve {
            host: "nowhere.test".into(),
            detail: "no addresses".into(),
        };
        assert_eq!(e.close_reason(), CloseReason::ResolveFailed);
        assert_eq!(e.reply_status(), ReplyStatus::Unreachable);
    }
}
