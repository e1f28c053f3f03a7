//! Mutual challenge–response authentication between relays with a pre-shared key.
//!
//! ```text
//! D (downstream, accepts)                         U (upstream, dials)
//!   Challenge {magic, version, nonce_s}  ──────►
//!                                        ◄──────  Response {magic, version, nonce_c, mac_c}
//!                                        ◄──────  Header (may be pipelined)
//!   ServerProof {mac_s} or Reject{reason} ─────►
//! mac_c = HMAC-SHA256(psk, "splitway-v1 client" || nonce_s || nonce_c)
//! mac_s = HMAC-SHA256(psk, "splitway-v1 server" || nonce_c || nonce_s)
//! ```
//!
//! On a TLS leg the Challenge is not sent: both ends take `nonce_s` from the
//! TLS session's keying-material exporter ([`Dialer::on_bound_nonce`]), and
//! the dialer's Response goes out right after the TLS handshake.
//!
//! The key never crosses the wire. A recorded Response is useless against a
//! new connection because the acceptor's nonce is fresh every time. Callers
//! supply both nonces from a CSPRNG; this module has no randomness of its own.
//!
//! Handshake version 3 adds a 0-RTT Hello the dialer sends first, so it can
//! ride a TCP Fast Open SYN ([`Dialer::hello`]; acceptor side in
//! [`crate::zero_rtt`]), with the client bytes of that flight covered by its
//! MAC, and a Confirm that proves the dialer is live on this connection
//! before the acceptor forwards anything else. (Version 2, the Hello
//! without either, is no longer spoken: a replay of it could carry any
//! bytes.)

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

pub const NONCE_LEN: usize = 32;
pub const MAC_LEN: usize = 32;
pub const MAGIC: [u8; 4] = *b"SPWY";
pub const AUTH_VERSION: u8 = 1;

/// Key length bounds, in bytes.
pub const MIN_KEY_LEN: usize = 32;
pub const MAX_KEY_LEN: usize = 1024;

/// Frame type bytes (first byte of every handshake frame).
pub const FRAME_CHALLENGE: u8 = 0x01;
pub const FRAME_RESPONSE: u8 = 0x02;
pub const FRAME_SERVER_PROOF: u8 = 0x03;
pub const FRAME_REJECT: u8 = 0x04;
/// The 0-RTT Hello (dialer speaks first).
pub const FRAME_HELLO: u8 = 0x05;
/// The acceptor's answer to a Hello: its fresh nonce and proof.
pub const FRAME_HELLO_PROOF: u8 = 0x06;
/// The dialer's answer to the HelloProof: live on this connection.
pub const FRAME_CONFIRM: u8 = 0x07;
/// The version byte of a Hello.
pub const HELLO_VERSION: u8 = 3;
/// A Hello's fixed part: type, magic, version, timestamp, nonce_c, mac_c,
/// data_len. The Header and `data_len` client bytes follow it, covered by
/// mac_c.
pub const HELLO_LEN: usize = 1 + 4 + 1 + 8 + NONCE_LEN + MAC_LEN + 2;
/// Client bytes a Hello covers at most; more go after the Confirm. A SYN
/// carries about one MSS anyway.
pub const MAX_HELLO_DATA: usize = 4096;
/// type + nonce_s + mac_s
pub const HELLO_PROOF_LEN: usize = 1 + NONCE_LEN + MAC_LEN;
/// type + mac_u
pub const CONFIRM_LEN: usize = 1 + MAC_LEN;

/// type + magic + version + nonce_s
pub const CHALLENGE_LEN: usize = 1 + 4 + 1 + NONCE_LEN;
/// type + magic + version + nonce_c + mac_c
pub const RESPONSE_LEN: usize = 1 + 4 + 1 + NONCE_LEN + MAC_LEN;
/// type + mac_s
pub const SERVER_PROOF_LEN: usize = 1 + MAC_LEN;
/// type + reason
pub const REJECT_LEN: usize = 2;

const CLIENT_LABEL: &[u8] = b"splitway-v1 client";
const SERVER_LABEL: &[u8] = b"splitway-v1 server";
const FINGERPRINT_LABEL: &[u8] = b"splitway-psk-id";
const HELLO_CLIENT_LABEL: &[u8] = b"splitway-v3 hello";
const HELLO_SERVER_LABEL: &[u8] = b"splitway-v3 server";
const HELLO_CONFIRM_LABEL: &[u8] = b"splitway-v3 confirm";

/// A pre-shared key. `Debug` shows only the fingerprint.
#[derive(Clone)]
pub struct Psk(Vec<u8>);

impl Psk {
    /// Parses hex (surrounding whitespace ignored, either case). Error
    /// messages never contain key material.
    pub fn from_hex(text: &str) -> Result<Psk, AuthError> {
        let text = text.trim();
        if !text.len().is_multiple_of(2) {
            return Err(AuthError::BadKey(format!(
                "hex key has an odd number of digits ({})",
                text.len()
            )));
        }
        let bytes = text
            .as_bytes()
            .chunks_exact(2)
            .map(|pair| Some(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| AuthError::BadKey("key is not hexadecimal".into()))?;
        Psk::from_bytes(&bytes)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Psk, AuthError> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(AuthError::BadKey(format!(
                "key is {} bytes, at least {MIN_KEY_LEN} needed ({} hex digits)",
                bytes.len(),
                MIN_KEY_LEN * 2
            )));
        }
        if bytes.len() > MAX_KEY_LEN {
            return Err(AuthError::BadKey(format!(
                "key is {} bytes, at most {MAX_KEY_LEN} allowed",
                bytes.len()
            )));
        }
        Ok(Psk(bytes.to_vec()))
    }

    /// Short non-secret identifier for logs and config checks: the first 8 hex
    /// digits of SHA-256("splitway-psk-id" || key).
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::new()
            .chain_update(FINGERPRINT_LABEL)
            .chain_update(&self.0)
            .finalize();
        to_hex(&digest[..4])
    }

    /// The key itself as lowercase hex — secret; for `splitway keygen` only.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    fn keyed(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length")
    }

    fn mac(&self, label: &[u8], first: &[u8; NONCE_LEN], second: &[u8; NONCE_LEN]) -> HmacSha256 {
        let mut mac = self.keyed();
        mac.update(label);
        mac.update(first);
        mac.update(second);
        mac
    }

    fn client_mac(&self, nonce_s: &[u8; NONCE_LEN], nonce_c: &[u8; NONCE_LEN]) -> HmacSha256 {
        self.mac(CLIENT_LABEL, nonce_s, nonce_c)
    }

    fn server_mac(&self, nonce_c: &[u8; NONCE_LEN], nonce_s: &[u8; NONCE_LEN]) -> HmacSha256 {
        self.mac(SERVER_LABEL, nonce_c, nonce_s)
    }

    /// Version 3: `HMAC(psk, "splitway-v3 hello" ‖ timestamp ‖ nonce_c ‖
    /// data_len ‖ header ‖ data)`.
    pub(crate) fn hello_mac(
        &self,
        timestamp_ms: u64,
        nonce_c: &[u8; NONCE_LEN],
        header: &[u8],
        data: &[u8],
    ) -> HmacSha256 {
        let mut mac = self.keyed();
        mac.update(HELLO_CLIENT_LABEL);
        mac.update(&timestamp_ms.to_be_bytes());
        mac.update(nonce_c);
        mac.update(&(data.len() as u16).to_be_bytes());
        mac.update(header);
        mac.update(data);
        mac
    }

    /// Version 3: `HMAC(psk, "splitway-v3 server" ‖ nonce_c ‖ mac_c ‖
    /// nonce_s)`, bound to exactly the Hello it answers and to the
    /// acceptor's fresh nonce.
    pub(crate) fn hello_server_mac(
        &self,
        nonce_c: &[u8; NONCE_LEN],
        mac_c: &[u8],
        nonce_s: &[u8; NONCE_LEN],
    ) -> HmacSha256 {
        let mut mac = self.keyed();
        mac.update(HELLO_SERVER_LABEL);
        mac.update(nonce_c);
        mac.update(mac_c);
        mac.update(nonce_s);
        mac
    }

    /// Version 3: `HMAC(psk, "splitway-v3 confirm" ‖ nonce_s ‖ mac_c)`: only
    /// the dialer that holds the key and sees this connection's `nonce_s`
    /// can send it, so a replayed Hello is never confirmed.
    pub(crate) fn hello_confirm_mac(&self, nonce_s: &[u8; NONCE_LEN], mac_c: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed();
        mac.update(HELLO_CONFIRM_LABEL);
        mac.update(nonce_s);
        mac.update(mac_c);
        mac
    }
}

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psk(fingerprint {})", self.fingerprint())
    }
}

impl PartialEq for Psk {
    /// Constant time in the key contents.
    fn eq(&self, other: &Psk) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl Eq for Psk {}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(char::from(DIGITS[usize::from(b >> 4)]));
        text.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    text
}

/// Why a relay refuses a peer; carried in the Reject frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    Unspecified,
    /// The Response's MAC matched none of the acceptor's keys.
    AuthFailed,
    UnsupportedVersion,
    /// A frame could not be parsed.
    Malformed,
    /// The acceptor is shedding load.
    Overloaded,
    /// The peer's address is not allowed to use this relay.
    NotAllowed,
    /// The handshake did not finish in time.
    Timeout,
    /// A 0-RTT Hello outside the acceptor's time window (clock skew, or
    /// stamped before the acceptor started): retry with the challenge.
    Stale,
    /// A code this version does not know (sent by a newer peer).
    Unknown(u8),
}

impl RejectReason {
    pub fn code(self) -> u8 {
        match self {
            RejectReason::Unspecified => 0,
            RejectReason::AuthFailed => 1,
            RejectReason::UnsupportedVersion => 2,
            RejectReason::Malformed => 3,
            RejectReason::Overloaded => 4,
            RejectReason::NotAllowed => 5,
            RejectReason::Timeout => 6,
            RejectReason::Stale => 7,
            RejectReason::Unknown(code) => code,
        }
    }

    /// Total: unknown codes become [`RejectReason::Unknown`], so a newer peer's
    /// reason still reads as a rejection.
    pub fn from_code(code: u8) -> RejectReason {
        match code {
            0 => RejectReason::Unspecified,
            1 => RejectReason::AuthFailed,
            2 => RejectReason::UnsupportedVersion,
            3 => RejectReason::Malformed,
            4 => RejectReason::Overloaded,
            5 => RejectReason::NotAllowed,
            6 => RejectReason::Timeout,
            7 => RejectReason::Stale,
            other => RejectReason::Unknown(other),
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::Unspecified => f.write_str("unspecified"),
            RejectReason::AuthFailed => f.write_str("authentication failed"),
            RejectReason::UnsupportedVersion => f.write_str("unsupported version"),
            RejectReason::Malformed => f.write_str("malformed handshake"),
            RejectReason::Overloaded => f.write_str("overloaded"),
            RejectReason::NotAllowed => f.write_str("not allowed"),
            RejectReason::Timeout => f.write_str("handshake timeout"),
            RejectReason::Stale => f.write_str("0-RTT hello outside the time window"),
            RejectReason::Unknown(code) => write!(f, "unknown reason {code}"),
        }
    }
}

/// Handshake failure. "Peer" is the relay on the other end of this connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("peer relay handshake: bad magic (not a splitway peer?)")]
    BadMagic,
    #[error("peer relay handshake: unsupported version {0}")]
    BadVersion(u8),
    #[error(
        "peer relay handshake: MAC verification failed (peer does not hold our pre-shared key)"
    )]
    BadMac,
    #[error("peer relay rejected the handshake: {0}")]
    Rejected(RejectReason),
    #[error("peer relay handshake: unexpected frame type {0:#04x}")]
    UnexpectedFrame(u8),
    #[error("invalid pre-shared key: {0}")]
    BadKey(String),
    #[error("peer relay handshake: bad header in its hello: {0}")]
    BadHeader(crate::header::HeaderError),
    #[error("peer relay handshake: its hello covers {0} bytes of data, more than {MAX_HELLO_DATA}")]
    HelloDataTooLong(usize),
    /// A method was called in the wrong handshake state (a bug in the caller).
    #[error("internal: handshake step called out of order")]
    OutOfOrder,
}

impl AuthError {
    /// Bounded metric label.
    pub fn reason_label(&self) -> &'static str {
        match self {
            AuthError::BadMagic => "bad_magic",
            AuthError::BadVersion(_) => "bad_version",
            AuthError::BadMac => "bad_mac",
            AuthError::Rejected(_) => "rejected",
            AuthError::UnexpectedFrame(_) => "malformed",
            AuthError::BadKey(_) => "bad_key",
            AuthError::BadHeader(_) | AuthError::HelloDataTooLong(_) => "malformed",
            AuthError::OutOfOrder => "out_of_order",
        }
    }

    /// What the acceptor should put in its Reject frame before closing, if anything.
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            AuthError::BadMagic
            | AuthError::UnexpectedFrame(_)
            | AuthError::BadHeader(_)
            | AuthError::HelloDataTooLong(_) => Some(RejectReason::Malformed),
            AuthError::BadVersion(_) => Some(RejectReason::UnsupportedVersion),
            AuthError::BadMac => Some(RejectReason::AuthFailed),
            AuthError::Rejected(_) | AuthError::BadKey(_) | AuthError::OutOfOrder => None,
        }
    }
}

/// Checks the type byte of a frame that is expected next. `Rejected` if the
/// peer sent a Reject instead. `Ok(None)`: need more bytes.
pub(crate) fn expect_frame(buf: &[u8], expected: u8) -> Result<Option<()>, AuthError> {
    match buf.first() {
        None => Ok(None),
        Some(&t) if t == expected => Ok(Some(())),
        Some(&FRAME_REJECT) => match buf.get(1) {
            None => Ok(None),
            Some(&code) => Err(AuthError::Rejected(RejectReason::from_code(code))),
        },
        Some(&other) => Err(AuthError::UnexpectedFrame(other)),
    }
}

/// Checks magic and version as soon as their bytes arrive (at `buf[1..6]`).
fn check_magic_and_version(buf: &[u8]) -> Result<(), AuthError> {
    check_magic_and(buf, AUTH_VERSION)
}

pub(crate) fn check_magic_and(buf: &[u8], expected_version: u8) -> Result<(), AuthError> {
    let magic_available = &buf[1..buf.len().min(5)];
    if magic_available != &MAGIC[..magic_available.len()] {
        return Err(AuthError::BadMagic);
    }
    match buf.get(5) {
        Some(&version) if version != expected_version => Err(AuthError::BadVersion(version)),
        _ => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptorState {
    AwaitingResponse,
    Authenticated { key_index: usize },
}

/// Downstream side: sends the challenge, verifies the response.
#[derive(Debug)]
pub struct Acceptor {
    keys: Vec<Psk>,
    nonce_s: [u8; NONCE_LEN],
    state: AcceptorState,
}

impl Acceptor {
    /// `keys`: every key currently accepted (more than one during rotation).
    /// `nonce_s` must be fresh from a CSPRNG for every connection: it is what
    /// makes a recorded Response useless.
    pub fn new(keys: Vec<Psk>, nonce_s: [u8; NONCE_LEN]) -> Self {
        Acceptor {
            keys,
            nonce_s,
            state: AcceptorState::AwaitingResponse,
        }
    }

    /// Bytes to send as soon as the connection is accepted.
    pub fn challenge(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CHALLENGE_LEN);
        out.push(FRAME_CHALLENGE);
        out.extend_from_slice(&MAGIC);
        out.push(AUTH_VERSION);
        out.extend_from_slice(&self.nonce_s);
        out
    }

    /// Verifies the Response at the start of `buf`. On success returns the
    /// ServerProof to send and the bytes consumed; whatever follows (a
    /// pipelined Header) belongs to the caller. On `Err` send
    /// [`Acceptor::reject`] with [`AuthError::reject_reason`] and close.
    pub fn on_response(&mut self, buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, AuthError> {
        if self.state != AcceptorState::AwaitingResponse {
            return Err(AuthError::OutOfOrder);
        }
        if expect_frame(buf, FRAME_RESPONSE)?.is_none() {
            return Ok(None);
        }
        check_magic_and_version(buf)?;
        if buf.len() < RESPONSE_LEN {
            return Ok(None);
        }
        let nonce_c: [u8; NONCE_LEN] = buf[6..6 + NONCE_LEN].try_into().expect("length checked");
        let mac_c = &buf[6 + NONCE_LEN..RESPONSE_LEN];
        // Try every key without stopping early so timing does not reveal which matched.
        let mut matched = None;
        for (index, key) in self.keys.iter().enumerate() {
            let ok = key
                .client_mac(&self.nonce_s, &nonce_c)
                .verify_slice(mac_c)
                .is_ok();
            if ok && matched.is_none() {
                matched = Some(index);
            }
        }
        let key_index = matched.ok_or(AuthError::BadMac)?;
        self.state = AcceptorState::Authenticated { key_index };
        let mac_s = self.keys[key_index]
            .server_mac(&nonce_c, &self.nonce_s)
            .finalize()
            .into_bytes();
        let mut proof = Vec::with_capacity(SERVER_PROOF_LEN);
        proof.push(FRAME_SERVER_PROOF);
        proof.extend_from_slice(&mac_s);
        Ok(Some((proof, RESPONSE_LEN)))
    }

    /// Frame to send before closing when refusing a peer.
    pub fn reject(reason: RejectReason) -> Vec<u8> {
        vec![FRAME_REJECT, reason.code()]
    }

    pub fn is_authenticated(&self) -> bool {
        matches!(self.state, AcceptorState::Authenticated { .. })
    }

    /// Which of the keys given to [`Acceptor::new`] the peer used (for
    /// watching a key rotation progress).
    pub fn matched_key_index(&self) -> Option<usize> {
        match self.state {
            AcceptorState::Authenticated { key_index } => Some(key_index),
            AcceptorState::AwaitingResponse => None,
        }
    }

    /// Fingerprint of the key the peer used.
    pub fn matched_key_fingerprint(&self) -> Option<String> {
        self.matched_key_index().map(|i| self.keys[i].fingerprint())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DialerState {
    AwaitingChallenge,
    AwaitingProof {
        nonce_s: [u8; NONCE_LEN],
    },
    /// A Hello went out; the acceptor may still send the Challenge it sends
    /// every connection whose first bytes had not arrived at accept.
    AwaitingHelloProof {
        mac_c: [u8; MAC_LEN],
    },
    Authenticated,
}

/// Upstream side: answers the challenge, verifies the acceptor's proof.
#[derive(Debug)]
pub struct Dialer {
    psk: Psk,
    nonce_c: [u8; NONCE_LEN],
    state: DialerState,
    /// After a HelloProof: the Confirm to send before anything else.
    /// Boxed: a dialer lives in every relay leg's state, the Confirm only
    /// between a HelloProof and the next write.
    confirm: Option<Box<[u8; CONFIRM_LEN]>>,
}

impl Dialer {
    /// `nonce_c` should come from a CSPRNG; it makes the acceptor's proof fresh.
    pub fn new(psk: Psk, nonce_c: [u8; NONCE_LEN]) -> Self {
        Dialer {
            psk,
            nonce_c,
            state: DialerState::AwaitingChallenge,
            confirm: None,
        }
    }

    /// Parses the Challenge; returns the Response to send and the bytes
    /// consumed. The Header may be sent right after the Response.
    pub fn on_challenge(&mut self, buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, AuthError> {
        if self.state != DialerState::AwaitingChallenge {
            return Err(AuthError::OutOfOrder);
        }
        if expect_frame(buf, FRAME_CHALLENGE)?.is_none() {
            return Ok(None);
        }
        check_magic_and_version(buf)?;
        if buf.len() < CHALLENGE_LEN {
            return Ok(None);
        }
        let nonce_s: [u8; NONCE_LEN] = buf[6..CHALLENGE_LEN].try_into().expect("length checked");
        Ok(Some((self.respond(nonce_s), CHALLENGE_LEN)))
    }

    /// For a leg inside TLS: the acceptor's nonce is not sent but derived by
    /// both ends from the TLS session (a keying-material exporter), which
    /// binds the PSK proof to that session and saves the Challenge's round
    /// trip. Returns the Response to send.
    pub fn on_bound_nonce(&mut self, nonce_s: [u8; NONCE_LEN]) -> Result<Vec<u8>, AuthError> {
        if self.state != DialerState::AwaitingChallenge {
            return Err(AuthError::OutOfOrder);
        }
        Ok(self.respond(nonce_s))
    }

    fn respond(&mut self, nonce_s: [u8; NONCE_LEN]) -> Vec<u8> {
        let mac_c = self
            .psk
            .client_mac(&nonce_s, &self.nonce_c)
            .finalize()
            .into_bytes();
        let mut response = Vec::with_capacity(RESPONSE_LEN);
        response.push(FRAME_RESPONSE);
        response.extend_from_slice(&MAGIC);
        response.push(AUTH_VERSION);
        response.extend_from_slice(&self.nonce_c);
        response.extend_from_slice(&mac_c);
        self.state = DialerState::AwaitingProof { nonce_s };
        response
    }

    /// 0-RTT: the Hello (with `header`, an encoded Header, and the first
    /// [`MAX_HELLO_DATA`] bytes of `data` after it, all covered by its MAC)
    /// to send as the very first bytes, so that with TCP Fast Open they
    /// ride the SYN. Returns the bytes and how many of `data` they carry;
    /// the rest goes after [`Dialer::take_confirm`]'s Confirm.
    /// `timestamp_ms` is Unix time: the acceptor refuses a Hello outside
    /// its window (`RejectReason::Stale`), which the caller answers by
    /// retrying with the challenge handshake.
    pub fn hello(
        &mut self,
        timestamp_ms: u64,
        header: &[u8],
        data: &[u8],
    ) -> Result<(Vec<u8>, usize), AuthError> {
        if self.state != DialerState::AwaitingChallenge {
            return Err(AuthError::OutOfOrder);
        }
        let covered = &data[..data.len().min(MAX_HELLO_DATA)];
        let mac_c: [u8; MAC_LEN] = self
            .psk
            .hello_mac(timestamp_ms, &self.nonce_c, header, covered)
            .finalize()
            .into_bytes()
            .into();
        let mut out = Vec::with_capacity(HELLO_LEN + header.len() + covered.len());
        out.push(FRAME_HELLO);
        out.extend_from_slice(&MAGIC);
        out.push(HELLO_VERSION);
        out.extend_from_slice(&timestamp_ms.to_be_bytes());
        out.extend_from_slice(&self.nonce_c);
        out.extend_from_slice(&mac_c);
        out.extend_from_slice(&(covered.len() as u16).to_be_bytes());
        out.extend_from_slice(header);
        out.extend_from_slice(covered);
        self.state = DialerState::AwaitingHelloProof { mac_c };
        Ok((out, covered.len()))
    }

    /// The Confirm to send right after a verified HelloProof, before any
    /// other byte (once; None after a challenge handshake).
    pub fn take_confirm(&mut self) -> Option<[u8; CONFIRM_LEN]> {
        self.confirm.take().map(|c| *c)
    }

    /// Verifies the ServerProof (after a Hello: the HelloProof); returns the
    /// bytes consumed. After `Ok(Some)` the next bytes from the acceptor are
    /// the Reply, and after a HelloProof [`Dialer::take_confirm`] has the
    /// Confirm to send. After a Hello, a Challenge before the proof is
    /// skipped (the acceptor sent it because the Hello had not arrived with
    /// the SYN).
    pub fn on_server_proof(&mut self, buf: &[u8]) -> Result<Option<usize>, AuthError> {
        let nonce_s = match self.state {
            DialerState::AwaitingProof { nonce_s } => nonce_s,
            DialerState::AwaitingHelloProof { mac_c } => return self.on_hello_proof(buf, mac_c),
            _ => return Err(AuthError::OutOfOrder),
        };
        if expect_frame(buf, FRAME_SERVER_PROOF)?.is_none() || buf.len() < SERVER_PROOF_LEN {
            return Ok(None);
        }
        self.psk
            .server_mac(&self.nonce_c, &nonce_s)
            .verify_slice(&buf[1..SERVER_PROOF_LEN])
            .map_err(|_| AuthError::BadMac)?;
        self.state = DialerState::Authenticated;
        Ok(Some(SERVER_PROOF_LEN))
    }

    /// After a Hello: skips a Challenge sent before the Hello arrived, then
    /// verifies the HelloProof and prepares the Confirm.
    fn on_hello_proof(
        &mut self,
        buf: &[u8],
        mac_c: [u8; MAC_LEN],
    ) -> Result<Option<usize>, AuthError> {
        let skip = if buf.first() == Some(&FRAME_CHALLENGE) {
            check_magic_and_version(buf)?;
            CHALLENGE_LEN
        } else {
            0
        };
        let Some(proof) = buf.get(skip..) else {
            return Ok(None);
        };
        if expect_frame(proof, FRAME_HELLO_PROOF)?.is_none() || proof.len() < HELLO_PROOF_LEN {
            return Ok(None);
        }
        let nonce_s: [u8; NONCE_LEN] = proof[1..1 + NONCE_LEN].try_into().expect("length checked");
        self.psk
            .hello_server_mac(&self.nonce_c, &mac_c, &nonce_s)
            .verify_slice(&proof[1 + NONCE_LEN..HELLO_PROOF_LEN])
            .map_err(|_| AuthError::BadMac)?;
        let mac_u = self
            .psk
            .hello_confirm_mac(&nonce_s, &mac_c)
            .finalize()
            .into_bytes();
        let mut confirm = [0u8; CONFIRM_LEN];
        confirm[0] = FRAME_CONFIRM;
        confirm[1..].copy_from_slice(&mac_u);
        self.confirm = Some(Box::new(confirm));
        self.state = DialerState::Authenticated;
        Ok(Some(skip + HELLO_PROOF_LEN))
    }

    pub fn is_authenticated(&self) -> bool {
        self.state == DialerState::Authenticated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(fill: u8) -> Psk {
        Psk::from_bytes(&[fill; 32]).unwrap()
    }

    const NONCE_S: [u8; NONCE_LEN] = [0x5a; NONCE_LEN];
    const NONCE_C: [u8; NONCE_LEN] = [0xc3; NONCE_LEN];

    /// Runs a full handshake; returns the acceptor's and dialer's outcomes.
    fn handshake(
        server_keys: Vec<Psk>,
        client_key: Psk,
    ) -> (Result<Vec<u8>, AuthError>, Acceptor, Dialer) {
        let mut acceptor = Acceptor::new(server_keys, NONCE_S);
        let mut dialer = Dialer::new(client_key, NONCE_C);
        let challenge = acceptor.challenge();
        let (response, used) = dialer.on_challenge(&challenge).unwrap().unwrap();
        assert_eq!(used, CHALLENGE_LEN);
        let outcome = acceptor
            .on_response(&response)
            .map(|res| res.expect("complete response").0);
        (outcome, acceptor, dialer)
    }

    #[test]
    fn psk_parsing() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
        let psk = Psk::from_hex(&format!("  {hex}\n")).unwrap();
        assert_eq!(psk.to_hex(), hex.to_lowercase());
        assert_eq!(psk, Psk::from_hex(&hex.to_lowercase()).unwrap());
        assert!(matches!(
            Psk::from_hex(&hex[..62]),
            Err(AuthError::BadKey(_))
        ));
        assert!(matches!(
            Psk::from_hex(&hex[..63]),
            Err(AuthError::BadKey(_))
        ));
        assert!(matches!(
            Psk::from_hex(&format!("{}zz", &hex[..62])),
            Err(AuthError::BadKey(_))
        ));
        assert!(Psk::from_bytes(&[1; MAX_KEY_LEN]).is_ok());
        assert!(matches!(
            Psk::from_bytes(&[1; MAX_KEY_LEN + 1]),
            Err(AuthError::BadKey(_))
        ));
        assert!(matches!(
            Psk::from_bytes(&[1; 31]),
            Err(AuthError::BadKey(_))
        ));
    }

    #[test]
    fn psk_debug_and_errors_hide_the_key() {
        let secret_hex = "deadbeef".repeat(8);
        let psk = Psk::from_hex(&secret_hex).unwrap();
        let debug = format!("{psk:?}");
        assert!(!debug.contains("deadbeef"), "{debug}");
        assert!(debug.contains(&psk.fingerprint()));
        let err = Psk::from_hex(&format!("{secret_hex}g"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("deadbeef"), "{err}");
    }

    #[test]
    fn fingerprint_is_short_stable_and_key_specific() {
        let fp = key(1).fingerprint();
        assert_eq!(fp.len(), 8);
        assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(fp, key(1).fingerprint());
        assert_ne!(fp, key(2).fingerprint());
        // Domain-separated: not simply the first bytes of sha256(key).
        let plain = Sha256::digest([1u8; 32]);
        assert_ne!(fp, to_hex(&plain[..4]));
    }

    #[test]
    fn right_key_authenticates_both_sides() {
        let (proof, acceptor, mut dialer) = handshake(vec![key(1)], key(1));
        let proof = proof.unwrap();
        assert_eq!(proof.len(), SERVER_PROOF_LEN);
        assert!(acceptor.is_authenticated());
        assert_eq!(acceptor.matched_key_index(), Some(0));
        assert_eq!(
            acceptor.matched_key_fingerprint(),
            Some(key(1).fingerprint())
        );
        assert!(!dialer.is_authenticated());
        assert_eq!(dialer.on_server_proof(&proof), Ok(Some(SERVER_PROOF_LEN)));
        assert!(dialer.is_authenticated());
    }

    #[test]
    fn wrong_key_is_refused() {
        let (outcome, acceptor, _) = handshake(vec![key(1)], key(2));
        let err = outcome.unwrap_err();
        assert_eq!(err, AuthError::BadMac);
        assert_eq!(err.reason_label(), "bad_mac");
        assert_eq!(err.reject_reason(), Some(RejectReason::AuthFailed));
        assert!(!acceptor.is_authenticated());
        assert_eq!(acceptor.matched_key_index(), None);
    }

    #[test]
    fn no_keys_refuses_everyone() {
        let (outcome, _, _) = handshake(vec![], key(1));
        assert_eq!(outcome.unwrap_err(), AuthError::BadMac);
    }

    #[test]
    fn rotation_accepts_either_key_and_proves_with_the_matching_one() {
        for (client, expected_index) in [(key(1), 0), (key(2), 1)] {
            let (proof, acceptor, mut dialer) = handshake(vec![key(1), key(2)], client);
            assert_eq!(acceptor.matched_key_index(), Some(expected_index));
            assert_eq!(
                dialer.on_server_proof(&proof.unwrap()),
                Ok(Some(SERVER_PROOF_LEN))
            );
        }
        let (outcome, _, _) = handshake(vec![key(1), key(2)], key(3));
        assert_eq!(outcome.unwrap_err(), AuthError::BadMac);
    }

    #[test]
    fn replayed_response_fails_against_a_new_nonce() {
        let mut first = Acceptor::new(vec![key(1)], NONCE_S);
        let mut dialer = Dialer::new(key(1), NONCE_C);
        let (recorded, _) = dialer.on_challenge(&first.challenge()).unwrap().unwrap();
        assert!(first.on_response(&recorded).unwrap().is_some());

        let mut fresh_nonce = NONCE_S;
        fresh_nonce[31] ^= 1;
        let mut second = Acceptor::new(vec![key(1)], fresh_nonce);
        assert_eq!(second.on_response(&recorded), Err(AuthError::BadMac));
    }

    #[test]
    fn reflected_challenge_cannot_forge_a_proof() {
        // An attacker cannot turn the acceptor's server MAC into a client MAC:
        // the direction labels differ even with swapped nonces.
        let psk = key(1);
        let server = psk.server_mac(&NONCE_S, &NONCE_C).finalize().into_bytes();
        let client = psk.client_mac(&NONCE_S, &NONCE_C).finalize().into_bytes();
        assert_ne!(server, client);
    }

    #[test]
    fn tampered_client_mac_and_nonce_fail() {
        let mut dialer = Dialer::new(key(1), NONCE_C);
        let challenge = Acceptor::new(vec![key(1)], NONCE_S).challenge();
        let (response, _) = dialer.on_challenge(&challenge).unwrap().unwrap();
        for index in [6, 6 + NONCE_LEN - 1, 6 + NONCE_LEN, RESPONSE_LEN - 1] {
            let mut tampered = response.clone();
            tampered[index] ^= 0x01;
            let mut acceptor = Acceptor::new(vec![key(1)], NONCE_S);
            assert_eq!(
                acceptor.on_response(&tampered),
                Err(AuthError::BadMac),
                "byte {index}"
            );
        }
    }

    #[test]
    fn tampered_server_proof_fails() {
        let (proof, _, mut dialer) = handshake(vec![key(1)], key(1));
        let mut proof = proof.unwrap();
        proof[SERVER_PROOF_LEN - 1] ^= 0x80;
        assert_eq!(dialer.on_server_proof(&proof), Err(AuthError::BadMac));
        assert!(!dialer.is_authenticated());
    }

    #[test]
    fn server_without_the_key_cannot_prove_itself() {
        // A fake acceptor holding another key: its proof must be refused.
        let mut dialer = Dialer::new(key(1), NONCE_C);
        dialer
            .on_challenge(&Acceptor::new(vec![], NONCE_S).challenge())
            .unwrap()
            .unwrap();
        let forged = key(2)
            .server_mac(&NONCE_C, &NONCE_S)
            .finalize()
            .into_bytes();
        let mut proof = vec![FRAME_SERVER_PROOF];
        proof.extend_from_slice(&forged);
        assert_eq!(dialer.on_server_proof(&proof), Err(AuthError::BadMac));
    }

    #[test]
    fn reject_frames() {
        for reason in [
            RejectReason::Unspecified,
            RejectReason::AuthFailed,
            RejectReason::UnsupportedVersion,
            RejectReason::Malformed,
            RejectReason::Overloaded,
            RejectReason::NotAllowed,
            RejectReason::Timeout,
            RejectReason::Unknown(200),
        ] {
            assert_eq!(RejectReason::from_code(reason.code()), reason);
            let frame = Acceptor::reject(reason);
            assert_eq!(frame.len(), REJECT_LEN);
            // Instead of the proof...
            let (_, _, mut dialer) = handshake(vec![key(1)], key(1));
            assert_eq!(dialer.on_server_proof(&frame[..1]), Ok(None));
            let err = dialer.on_server_proof(&frame).unwrap_err();
            assert_eq!(err, AuthError::Rejected(reason));
            assert_eq!(err.reason_label(), "rejected");
            // ...or instead of the challenge.
            let mut dialer = Dialer::new(key(1), NONCE_C);
            assert_eq!(
                dialer.on_challenge(&frame),
                Err(AuthError::Rejected(reason))
            );
        }
    }

    #[test]
    fn challenge_errors() {
        let good = Acceptor::new(vec![key(1)], NONCE_S).challenge();
        let mut dialer = Dialer::new(key(1), NONCE_C);
        assert_eq!(
            dialer.on_challenge(b"SSH-2.0"),
            Err(AuthError::UnexpectedFrame(b'S'))
        );
        let mut bad_magic = good.clone();
        bad_magic[2] = b'X';
        // Detected as soon as the wrong byte arrives.
        assert_eq!(
            dialer.on_challenge(&bad_magic[..3]),
            Err(AuthError::BadMagic)
        );
        let mut bad_version = good.clone();
        bad_version[5] = 2;
        let err = dialer.on_challenge(&bad_version[..6]).unwrap_err();
        assert_eq!(err, AuthError::BadVersion(2));
        assert_eq!(err.reason_label(), "bad_version");
        assert_eq!(err.reject_reason(), Some(RejectReason::UnsupportedVersion));
    }

    #[test]
    fn response_errors() {
        let mut dialer = Dialer::new(key(1), NONCE_C);
        let challenge = Acceptor::new(vec![key(1)], NONCE_S).challenge();
        let (good, _) = dialer.on_challenge(&challenge).unwrap().unwrap();
        let mut acceptor = Acceptor::new(vec![key(1)], NONCE_S);
        let err = acceptor.on_response(b"GET / HTTP/1.1\r\n").unwrap_err();
        assert_eq!(err, AuthError::UnexpectedFrame(b'G'));
        assert_eq!(err.reason_label(), "malformed");
        assert_eq!(err.reject_reason(), Some(RejectReason::Malformed));
        // A challenge sent the wrong way is also unexpected.
        assert_eq!(
            acceptor.on_response(&challenge),
            Err(AuthError::UnexpectedFrame(FRAME_CHALLENGE))
        );
        let mut bad_magic = good.clone();
        bad_magic[4] = 0;
        assert_eq!(acceptor.on_response(&bad_magic), Err(AuthError::BadMagic));
        let mut bad_version = good.clone();
        bad_version[5] = 0;
        assert_eq!(
            acceptor.on_response(&bad_version),
            Err(AuthError::BadVersion(0))
        );
        // Unexpected proof frame on the dialer side.
        let mut dialer = Dialer::new(key(1), NONCE_C);
        dialer.on_challenge(&challenge).unwrap().unwrap();
        assert_eq!(
            dialer.on_server_proof(&good),
            Err(AuthError::UnexpectedFrame(FRAME_RESPONSE))
        );
    }

    #[test]
    fn every_split_needs_more_and_pipelined_bytes_are_left() {
        let mut acceptor = Acceptor::new(vec![key(1)], NONCE_S);
        let mut dialer = Dialer::new(key(1), NONCE_C);
        let challenge = acceptor.challenge();
        assert_eq!(challenge.len(), CHALLENGE_LEN);
        for cut in 0..CHALLENGE_LEN {
            assert_eq!(
                dialer.on_challenge(&challenge[..cut]),
                Ok(None),
                "cut {cut}"
            );
        }
        let (mut response, _) = dialer.on_challenge(&challenge).unwrap().unwrap();
        assert_eq!(response.len(), RESPONSE_LEN);
        for cut in 0..RESPONSE_LEN {
            assert_eq!(
                acceptor.on_response(&response[..cut]),
                Ok(None),
                "cut {cut}"
            );
        }
        response.extend_from_slice(b"pipelined header");
        let (proof, used) = acceptor.on_response(&response).unwrap().unwrap();
        assert_eq!(used, RESPONSE_LEN);
        for cut in 0..SERVER_PROOF_LEN {
            assert_eq!(dialer.on_server_proof(&proof[..cut]), Ok(None), "cut {cut}");
        }
        assert_eq!(dialer.on_server_proof(&proof), Ok(Some(SERVER_PROOF_LEN)));
    }

    #[test]
    fn bound_nonce_equals_a_sent_challenge() {
        // A TLS-bound handshake is the plain one with nonce_s not on the wire.
        let (proof, _, mut sent) = handshake(vec![key(1)], key(1));
        let mut bound = Dialer::new(key(1), NONCE_C);
        let response = bound.on_bound_nonce(NONCE_S).unwrap();
        let mut acceptor = Acceptor::new(vec![key(1)], NONCE_S);
        let (bound_proof, used) = acceptor.on_response(&response).unwrap().unwrap();
        assert_eq!(used, RESPONSE_LEN);
        let proof = proof.unwrap();
        assert_eq!(bound_proof, proof);
        assert_eq!(bound.on_server_proof(&proof), Ok(Some(SERVER_PROOF_LEN)));
        assert_eq!(sent.on_server_proof(&proof), Ok(Some(SERVER_PROOF_LEN)));
        // Another TLS session derives another nonce: the Response is refused.
        let mut other = Acceptor::new(vec![key(1)], [0x11; NONCE_LEN]);
        assert_eq!(other.on_response(&response), Err(AuthError::BadMac));
        assert_eq!(bound.on_bound_nonce(NONCE_S), Err(AuthError::OutOfOrder));
    }

    #[test]
    fn steps_out_of_order() {
        let mut dialer = Dialer::new(key(1), NONCE_C);
        assert_eq!(
            dialer.on_server_proof(&[FRAME_SERVER_PROOF]),
            Err(AuthError::OutOfOrder)
        );
        let (proof, mut acceptor, mut dialer) = handshake(vec![key(1)], key(1));
        let proof = proof.unwrap();
        assert_eq!(acceptor.on_response(&[]), Err(AuthError::OutOfOrder));
        assert_eq!(dialer.on_challenge(&[]), Err(AuthError::OutOfOrder));
        dialer.on_server_proof(&proof).unwrap();
        assert_eq!(dialer.on_server_proof(&proof), Err(AuthError::OutOfOrder));
    }
}
