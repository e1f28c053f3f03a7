//! Relay↔relay legs: the authenticated handshake on both ends.
//!
//! Dialer (upstream): connect, wait for the Challenge, send Response+Header
//! in one write, then (concurrently with forwarding client data) read the
//! ServerProof and the Reply. Acceptor (downstream): send the Challenge at
//! accept, verify the Response, send the ServerProof, read the Header.
//! By default (`[accel] zero_rtt` unset or on) the dialer speaks first
//! instead: a Hello with the Header, in its TCP Fast Open SYN where the
//! kernel allows it and in the first segment after the handshake otherwise,
//! and the acceptor acts on it at once, guarded by a replay window shared
//! by every process on the host (a pinned BPF map), forwarding nothing but
//! the client bytes the Hello's MAC covers until the dialer's Confirm
//! arrives. The challenge is the fallback for a peer that refuses the Hello.
//! The Hello's and Confirm's bytes and the Confirm an accepted Hello owes
//! are the `zero_rtt` room's (`zero_rtt::hello`, `confirm`, `refused`,
//! `Unconfirmed`); this module connects, sends and reads the proof. `docs/protocol.md` has the frames byte by byte.

mod downstream;
mod upstream;

pub use downstream::{Accepted, accept};
pub use upstream::{PeerLeg, Pooled, connect, dial, dial_pooled};

use crate::metrics::PeerHandshake;
use rand::RngCore;
use splitway_proto::auth::NONCE_LEN;
use splitway_proto::header::{Reply, ReplyStatus};
use tokio::net::TcpStream;

use crate::error::ConnError;
use crate::leg_io::FrameError;

pub(crate) fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

pub(crate) fn peer_frame_error<E: std::fmt::Display>(
    peer: &str,
    what: &str,
    e: FrameError<E>,
) -> ConnError {
    match e {
        FrameError::Closed => ConnError::PeerProtocol {
            peer: peer.to_owned(),
            detail: format!("closed before its {what}"),
        },
        FrameError::Io(source) => ConnError::PeerIo {
            peer: peer.to_owned(),
            op: "read",
            source,
        },
        FrameError::Bad(e) => ConnError::PeerProtocol {
            peer: peer.to_owned(),
            detail: format!("bad {what}: {e}"),
        },
    }
}

/// An encoded Reply frame.
pub fn reply_bytes(status: ReplyStatus) -> Vec<u8> {
    let mut out = Vec::new();
    Reply { status }.encode(&mut out);
    out
}

/// Whether a Hello rode the SYN: the kernel knows whether SYN data was
/// acknowledged (taken by the listener), on both ends.
pub(crate) fn hello_kind(stream: &TcpStream) -> PeerHandshake {
    // A failed TCP_INFO read only loses the distinction, not the count.
    if splitway_sys::sock::syn_data_acked(stream).unwrap_or(false) {
        PeerHandshake::HelloSyn
    } else {
        PeerHandshake::Hello
    }
}
