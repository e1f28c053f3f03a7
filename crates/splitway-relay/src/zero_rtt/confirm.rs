//! The accepting end's last step of a 0-RTT relay leg: the Confirm an
//! accepted Hello still owes (`peer/downstream.rs` accepts the Hello
//! through the window, the session reads the Confirm before forwarding
//! more than the covered bytes).

use std::time::Duration;

use splitway_proto::zero_rtt::Confirmation;
use tokio::net::TcpStream;

use crate::error::ConnError;
use crate::leg_io::{FrameError, read_frame};
use crate::metrics::{AuthFailureReason, Metrics, auth_reason};

use super::metrics::{ZeroRttMetrics, ZeroRttOutcome};

/// An accepted Hello whose dialer has not yet sent its Confirm: nothing
/// beyond the bytes the Hello's MAC covers may be forwarded before it, in
/// either direction (a replayed Hello never gets one).
pub struct Unconfirmed {
    check: Confirmation,
    /// What followed the covered bytes: the Confirm, then client bytes.
    buf: Vec<u8>,
    /// Where a missing Confirm is counted.
    hellos: ZeroRttMetrics,
}

impl Unconfirmed {
    /// An accepted Hello's `check`, the bytes after its covered ones, and
    /// the window's counts (`HelloWindow::accepted`).
    pub(crate) fn new(check: Confirmation, buf: Vec<u8>, hellos: ZeroRttMetrics) -> Self {
        Unconfirmed { check, buf, hellos }
    }

    /// Reads the Confirm within `deadline`; returns the client bytes that
    /// came after it. Counted as `unconfirmed` when it fails.
    pub async fn confirm(
        self,
        stream: &TcpStream,
        deadline: Duration,
        metrics: &Metrics,
    ) -> Result<Vec<u8>, ConnError> {
        let Unconfirmed {
            check,
            mut buf,
            hellos,
        } = self;
        let read = tokio::time::timeout(
            deadline,
            read_frame(stream, &mut buf, |b| {
                check.on_confirm(b).map(|o| o.map(|n| ((), n)))
            }),
        )
        .await;
        let (reason, err) = match read {
            Ok(Ok(())) => return Ok(buf),
            Err(_) => (
                AuthFailureReason::Timeout,
                ConnError::ClientTimeout(deadline),
            ),
            Ok(Err(FrameError::Bad(e))) => (auth_reason(&e), ConnError::PeerAuth(e)),
            Ok(Err(FrameError::Closed)) => (
                AuthFailureReason::Closed,
                ConnError::ClientProtocol("closed before its 0-RTT confirm".into()),
            ),
            Ok(Err(FrameError::Io(source))) => (
                AuthFailureReason::Closed,
                ConnError::ClientIo {
                    op: "read confirm",
                    source,
                },
            ),
        };
        hellos.count(ZeroRttOutcome::Unconfirmed);
        metrics.auth_failure(reason);
        Err(err)
    }
}
