//! The dialing end of a 0-RTT relay leg: the Hello as the first write, the
//! peer's proof, then our Confirm; a refused Hello sends the caller back to
//! the challenge. The leg's plumbing (connect, send, read the proof) is
//! `peer/`'s, handed in as a [`HelloLeg`]: `peer/` takes Hellos through this
//! room's window, so the room importing `peer` would close a circle.

use splitway_proto::auth::{AuthError, Dialer, NONCE_LEN, Psk, RejectReason};
use splitway_proto::header::Header;
use tokio::net::TcpStream;

use crate::config::{Peer, Timeouts};
use crate::error::ConnError;
use crate::leg_io::{FrameError, LegIo};

use super::unix_ms;

/// What a Hello dial needs of the relay leg it opens: `peer/upstream.rs`'s
/// functions of the same names, and its leg built from a proven dial.
pub(crate) trait HelloLeg {
    /// Opens a tuned connection; with `fast_open` the first write may
    /// leave in the SYN.
    async fn connect(
        peer: &Peer,
        timeouts: &Timeouts,
        leg_buffer: Option<usize>,
        fast_open: bool,
    ) -> Result<TcpStream, ConnError>;

    /// A fresh nonce for our side of the handshake.
    fn nonce() -> [u8; NONCE_LEN];

    /// Writes `data` to the leg; a failure is the peer's (`op` says what).
    async fn send(
        io: LegIo<'_>,
        peer: &str,
        op: &'static str,
        data: &[u8],
    ) -> Result<(), ConnError>;

    /// Reads the peer's proof within the handshake timeout: the read's
    /// outcome, and the bytes that came after the proof.
    async fn read_proof(
        io: LegIo<'_>,
        dialer: &mut Dialer,
        peer: &str,
        timeouts: &Timeouts,
    ) -> Result<(Result<(), FrameError<AuthError>>, Vec<u8>), ConnError>;

    /// A failed read of the peer's proof: its Reject, or what went wrong.
    fn proof_error(peer: &str, e: FrameError<AuthError>) -> ConnError;

    /// The leg of a proven Hello (plain TCP: no TLS leg takes Hellos).
    fn proven(stream: TcpStream, peer: String, dialer: Dialer, buf: Vec<u8>) -> Self;
}

/// How a Hello dial ended without a leg.
pub(crate) enum HelloDial {
    /// The peer answered with a Reject worth a retry with the challenge:
    /// stale (clock skew, restart), overloaded (replay window full), or it
    /// does not take 0-RTT Hellos at all.
    Refused(RejectReason),
    Failed(ConnError),
}

impl From<ConnError> for HelloDial {
    fn from(e: ConnError) -> Self {
        HelloDial::Failed(e)
    }
}

/// The 0-RTT dial: Hello ‖ Header ‖ first bytes (covered by the Hello's
/// MAC) as the first write (of a TFO socket with `fast_open`), then the
/// peer's proof, then our Confirm and any first bytes the Hello could not
/// cover. Waiting for the proof costs nothing in the SYN: the acceptor
/// sends it at the SYN, so it
/// comes back with the SYN-ACK, before which no further byte could leave
/// anyway. Without TFO it holds back only client bytes beyond the first
/// write, which the Reply (a round trip later still) would not release
/// sooner. Until the proof is in, the client bytes we were given are still
/// ours to resend on a fallback.
pub(crate) async fn dial_hello<L: HelloLeg>(
    peer: &Peer,
    psk: &Psk,
    header: &Header,
    early_data: &[u8],
    timeouts: &Timeouts,
    leg_buffer: Option<usize>,
    fast_open: bool,
) -> Result<L, HelloDial> {
    let stream = L::connect(peer, timeouts, leg_buffer, fast_open).await?;
    let mut dialer = Dialer::new(psk.clone(), L::nonce());
    let mut encoded = Vec::with_capacity(header.encoded_len());
    header.encode(&mut encoded);
    let (out, covered) = dialer
        .hello(unix_ms(), &encoded, early_data)
        .map_err(|e| ConnError::Internal(format!("hello for {}: {e}", peer.name)))?;
    let io = LegIo::new(&stream, None);
    L::send(io, &peer.name, "send hello", &out).await?;
    let (proof, buf) = L::read_proof(io, &mut dialer, &peer.name, timeouts).await?;
    match proof {
        Ok(()) => {
            // The peer forwards nothing the Hello's MAC does not cover
            // until this arrives: it proves we see this connection.
            let mut confirm = dialer
                .take_confirm()
                .ok_or_else(|| ConnError::Internal(format!("no confirm for {}", peer.name)))?
                .to_vec();
            confirm.extend_from_slice(&early_data[covered..]);
            L::send(io, &peer.name, "send confirm", &confirm).await?;
            Ok(L::proven(stream, peer.name.clone(), dialer, buf))
        }
        Err(FrameError::Bad(AuthError::Rejected(
            r @ (RejectReason::Stale
            | RejectReason::Overloaded
            | RejectReason::Malformed
            | RejectReason::UnsupportedVersion),
        ))) => Err(HelloDial::Refused(r)),
        Err(e) => Err(HelloDial::Failed(L::proof_error(&peer.name, e))),
    }
}
