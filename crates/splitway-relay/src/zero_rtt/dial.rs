//! The dialing end of a 0-RTT relay leg, without I/O: the Hello's bytes,
//! the Confirm owed once the peer's proof is in, and which Rejects send
//! the dialer back to the challenge. `peer/upstream.rs` connects, writes
//! and reads the proof around them (`peer/` takes Hellos through this
//! room's window, so the room importing `peer` would close a circle).

use splitway_proto::auth::{AuthError, Dialer, RejectReason};
use splitway_proto::header::Header;

use crate::error::ConnError;
use crate::leg_io::FrameError;

use super::unix_ms;

/// Hello ‖ Header ‖ first bytes (as many as the Hello's MAC covers) for
/// `peer`: the first write of a 0-RTT leg, and how many of `early_data`
/// it carries.
pub(crate) fn hello(
    dialer: &mut Dialer,
    peer: &str,
    header: &Header,
    early_data: &[u8],
) -> Result<(Vec<u8>, usize), ConnError> {
    let mut encoded = Vec::with_capacity(header.encoded_len());
    header.encode(&mut encoded);
    dialer
        .hello(unix_ms(), &encoded, early_data)
        .map_err(|e| ConnError::Internal(format!("hello for {peer}: {e}")))
}

/// Our Confirm and the first bytes the Hello could not cover, once the
/// peer's proof is in. The peer forwards nothing the Hello's MAC does not
/// cover until the Confirm arrives: it proves we see this connection.
pub(crate) fn confirm(
    dialer: &mut Dialer,
    peer: &str,
    early_data: &[u8],
    covered: usize,
) -> Result<Vec<u8>, ConnError> {
    let mut confirm = dialer
        .take_confirm()
        .ok_or_else(|| ConnError::Internal(format!("no confirm for {peer}")))?
        .to_vec();
    confirm.extend_from_slice(&early_data[covered..]);
    Ok(confirm)
}

/// The peer's Reject when it is worth a retry with the challenge: stale
/// (clock skew, restart), overloaded (replay window full), or it does not
/// take 0-RTT Hellos at all.
pub(crate) fn refused(e: &FrameError<AuthError>) -> Option<RejectReason> {
    match e {
        FrameError::Bad(AuthError::Rejected(
            r @ (RejectReason::Stale
            | RejectReason::Overloaded
            | RejectReason::Malformed
            | RejectReason::UnsupportedVersion),
        )) => Some(*r),
        _ => None,
    }
}
