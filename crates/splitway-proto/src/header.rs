//! Relay↔relay header and reply (see `docs/protocol.md` for the byte layout).
//!
//! After the peer handshake succeeds, the upstream relay sends one [`Header`]
//! naming the final destination; the downstream relay answers with one
//! [`Reply`] once its own next leg is connected or has failed.

use std::net::SocketAddr;

use crate::addr::{self, AddrError, Destination};

pub const HEADER_VERSION: u8 = 1;
/// Upper bound of an encoded header, including extensions.
pub const MAX_HEADER_LEN: usize = 1024;
/// TTL the first relay of a chain puts in the header.
pub const DEFAULT_TTL: u8 = 16;

/// The connection's first relay forwards client data without waiting for
/// the chain's Reply (transparent capture). The last relay may then hold
/// its Reply back to share a segment with the server's first bytes.
pub const FLAG_OPTIMISTIC: u16 = 0x0001;

/// A path probe: the downstream relay dials nothing and answers with one
/// [`ProbeAnswer`] (its own estimate for `dst`), then closes. A relay that
/// does not know the flag refuses the header (`BadHeader`), so an old peer
/// is never made to dial the probe's destination.
pub const FLAG_PROBE: u16 = 0x0002;

/// A window probe: the downstream relay dials nothing; each end sends a
/// fixed amount of filler and closes, so that both ends' congestion
/// controls learn the leg's window before a user connection needs it
/// (`splitway_resume`, issue #29). The header's destination is ignored.
/// A relay that does not know the flag refuses the header.
pub const FLAG_WINDOW_PROBE: u16 = 0x0004;

/// Flag bits this version understands. Any other bit comes from a newer
/// peer and is refused rather than half-understood.
pub const KNOWN_FLAGS: u16 = FLAG_OPTIMISTIC | FLAG_PROBE | FLAG_WINDOW_PROBE;

/// Extension kinds with this bit set must be understood by the receiver.
pub const EXTENSION_CRITICAL: u16 = 0x8000;

/// Bytes before the destination: version, total length, flags, ttl, conn_id.
const FIXED_LEN: usize = 1 + 2 + 2 + 1 + 8;
/// Smallest legal header: fixed part, one-letter domain destination (5 bytes),
/// IPv4 source (7 bytes), no extensions.
pub const MIN_HEADER_LEN: usize = FIXED_LEN + 5 + 7;
/// Non-critical extension: the IP hop limit (one byte) left for the
/// connection's last leg. The first relay of a transparent capture sets it
/// from the client SYN's TTL minus one; each relay takes one more off, and
/// the last dials the server with what is left, so a routing loop through
/// relays dies out as it would through routers. Old relays ignore it.
pub const EXT_HOP_LIMIT: u16 = 0x0001;

/// Extension TLV prefix: kind u16 + length u16.
const EXTENSION_PREFIX_LEN: usize = 4;

/// Type byte of the reply frame.
pub const REPLY_FRAME_TYPE: u8 = 0x10;
/// Encoded length of a [`Reply`].
pub const REPLY_LEN: usize = 2;
/// Type byte of the probe answer frame.
pub const PROBE_ANSWER_FRAME_TYPE: u8 = 0x11;
/// Encoded length of a [`ProbeAnswer`].
pub const PROBE_ANSWER_LEN: usize = 6;

/// What the upstream relay asks the downstream relay to do with this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Chosen by the first relay; the same on every hop, so logs can be joined.
    pub conn_id: u64,
    /// Remaining relay hops; see [`Header::ttl_for_next_hop`].
    pub ttl: u8,
    /// Must be a subset of [`KNOWN_FLAGS`] to decode.
    pub flags: u16,
    /// Final destination.
    pub dst: Destination,
    /// The original client's address as seen by the first relay.
    pub src: SocketAddr,
    /// Preserved in order; unknown non-critical kinds are kept for forwarding.
    pub extensions: Vec<Extension>,
}

/// Type-length-value room for later features (early data, hop list, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extension {
    pub kind: u16,
    pub value: Vec<u8>,
}

impl Extension {
    pub fn is_critical(&self) -> bool {
        self.kind & EXTENSION_CRITICAL != 0
    }
}

/// A header or reply from the peer relay that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("peer relay header: unsupported version {0}")]
    BadVersion(u8),
    #[error("peer relay header: length exceeds {MAX_HEADER_LEN} bytes")]
    TooLong,
    #[error("peer relay header: declared length {0} is shorter than the minimum {MIN_HEADER_LEN}")]
    TooShort(u16),
    #[error("peer relay header: fields do not fill exactly the declared length")]
    LengthMismatch,
    #[error("peer relay header: unsupported address type {0:#04x}")]
    BadAddressType(u8),
    #[error("peer relay header: invalid destination domain name")]
    BadDomain,
    #[error("peer relay header: unknown flag bits {0:#06x} (newer peer?)")]
    UnknownFlags(u16),
    #[error("peer relay header: unknown critical extension {0:#06x} (newer peer?)")]
    CriticalExtension(u16),
    #[error("peer relay header: extension overruns the header")]
    BadExtension,
    #[error("peer relay reply: unexpected frame type {0:#04x}")]
    BadReplyType(u8),
    #[error("peer relay reply: unknown status {0}")]
    BadStatus(u8),
    /// Only from [`Header::try_encode`]: our own header would not fit.
    #[error("internal: header to encode exceeds {MAX_HEADER_LEN} bytes")]
    EncodeTooLong,
}

impl HeaderError {
    /// Bounded metric label.
    pub fn label(&self) -> &'static str {
        match self {
            HeaderError::BadVersion(_) => "bad_version",
            HeaderError::TooLong => "too_long",
            HeaderError::TooShort(_) | HeaderError::LengthMismatch => "bad_length",
            HeaderError::BadAddressType(_) => "bad_address_type",
            HeaderError::BadDomain => "bad_domain",
            HeaderError::UnknownFlags(_) => "unknown_flags",
            HeaderError::CriticalExtension(_) => "critical_extension",
            HeaderError::BadExtension => "bad_extension",
            HeaderError::BadReplyType(_) => "bad_reply_type",
            HeaderError::BadStatus(_) => "bad_status",
            HeaderError::EncodeTooLong => "encode_too_long",
        }
    }
}

impl From<AddrError> for HeaderError {
    fn from(err: AddrError) -> HeaderError {
        match err {
            AddrError::BadAddressType(atyp) => HeaderError::BadAddressType(atyp),
            // Ports and authorities are not parsed from text here; only the domain can be wrong.
            AddrError::BadDomain | AddrError::MissingPort | AddrError::BadPort => {
                HeaderError::BadDomain
            }
        }
    }
}

impl Header {
    /// A header with no flags and no extensions, ttl [`DEFAULT_TTL`].
    pub fn new(conn_id: u64, dst: Destination, src: SocketAddr) -> Header {
        Header {
            conn_id,
            ttl: DEFAULT_TTL,
            flags: 0,
            dst,
            src,
            extensions: Vec::new(),
        }
    }

    /// The IP hop limit carried by [`EXT_HOP_LIMIT`], if any (the first
    /// such extension; a malformed one counts as absent).
    pub fn hop_limit(&self) -> Option<u8> {
        self.extensions
            .iter()
            .find(|e| e.kind == EXT_HOP_LIMIT)
            .and_then(|e| match e.value.as_slice() {
                [h] => Some(*h),
                _ => None,
            })
    }

    /// Sets (or replaces) the [`EXT_HOP_LIMIT`] extension.
    pub fn set_hop_limit(&mut self, hops: u8) {
        self.extensions.retain(|e| e.kind != EXT_HOP_LIMIT);
        self.extensions.push(Extension {
            kind: EXT_HOP_LIMIT,
            value: vec![hops],
        });
    }

    /// TTL to put in the header sent to the next relay, or `None` when this
    /// relay must not forward to another relay (reply [`ReplyStatus::TtlExceeded`]).
    /// Connecting to the final destination itself needs no TTL.
    pub fn ttl_for_next_hop(&self) -> Option<u8> {
        self.ttl.checked_sub(1)
    }

    /// Exact number of bytes [`Header::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        FIXED_LEN
            + self.dst.encoded_len()
            + Destination::Ip(self.src).encoded_len()
            + self
                .extensions
                .iter()
                .map(|ext| EXTENSION_PREFIX_LEN + ext.value.len())
                .sum::<usize>()
    }

    /// Appends the encoded header.
    ///
    /// # Panics
    /// If [`Header::try_encode`] fails: extensions pushing the header past
    /// [`MAX_HEADER_LEN`], or a `Destination::Domain` built by hand with an
    /// invalid name. Headers built from decoded client requests cannot fail.
    pub fn encode(&self, out: &mut Vec<u8>) {
        if let Err(err) = self.try_encode(out) {
            panic!("cannot encode relay header: {err}");
        }
    }

    /// Appends the encoded header, or fails without writing anything.
    pub fn try_encode(&self, out: &mut Vec<u8>) -> Result<(), HeaderError> {
        let total = self.encoded_len();
        if total > MAX_HEADER_LEN {
            return Err(HeaderError::EncodeTooLong);
        }
        let start = out.len();
        out.reserve(total);
        out.push(HEADER_VERSION);
        // Cannot truncate: total <= MAX_HEADER_LEN.
        out.extend_from_slice(&(total as u16).to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.push(self.ttl);
        out.extend_from_slice(&self.conn_id.to_be_bytes());
        if let Err(err) = self.dst.encode(out) {
            out.truncate(start);
            return Err(err.into());
        }
        addr::encode_socket_addr(&self.src, out);
        for ext in &self.extensions {
            out.extend_from_slice(&ext.kind.to_be_bytes());
            // Cannot truncate: each value is shorter than total.
            out.extend_from_slice(&(ext.value.len() as u16).to_be_bytes());
            out.extend_from_slice(&ext.value);
        }
        debug_assert_eq!(out.len() - start, total);
        Ok(())
    }

    /// Decodes one header from the start of `buf`.
    ///
    /// `Ok(None)`: need more bytes. Bytes after the consumed count are stream data.
    /// Fails as soon as the version or declared length is wrong, without
    /// waiting for the rest, and never reads past [`MAX_HEADER_LEN`] bytes.
    pub fn decode(buf: &[u8]) -> Result<Option<(Header, usize)>, HeaderError> {
        let Some(&version) = buf.first() else {
            return Ok(None);
        };
        if version != HEADER_VERSION {
            return Err(HeaderError::BadVersion(version));
        }
        if buf.len() < 3 {
            return Ok(None);
        }
        let declared = u16::from_be_bytes([buf[1], buf[2]]);
        let total = usize::from(declared);
        if total > MAX_HEADER_LEN {
            return Err(HeaderError::TooLong);
        }
        if total < MIN_HEADER_LEN {
            return Err(HeaderError::TooShort(declared));
        }
        if buf.len() >= 5 {
            let flags = u16::from_be_bytes([buf[3], buf[4]]);
            if flags & !KNOWN_FLAGS != 0 {
                return Err(HeaderError::UnknownFlags(flags & !KNOWN_FLAGS));
            }
        }
        if buf.len() < total {
            return Ok(None);
        }
        Self::decode_complete(&buf[..total]).map(|header| Some((header, total)))
    }

    /// Decodes a header that is exactly `frame` (length already checked).
    fn decode_complete(frame: &[u8]) -> Result<Header, HeaderError> {
        let flags = u16::from_be_bytes([frame[3], frame[4]]);
        let ttl = frame[5];
        let conn_id = u64::from_be_bytes(frame[6..14].try_into().expect("fixed part checked"));
        let mut pos = FIXED_LEN;
        // Inside a complete frame, "need more bytes" means a field overruns the declared length.
        let (dst, used) = Destination::decode(&frame[pos..])?.ok_or(HeaderError::LengthMismatch)?;
        pos += used;
        let (src, used) =
            addr::decode_socket_addr(&frame[pos..])?.ok_or(HeaderError::LengthMismatch)?;
        pos += used;
        let mut extensions = Vec::new();
        while pos < frame.len() {
            let rest = &frame[pos..];
            if rest.len() < EXTENSION_PREFIX_LEN {
                return Err(HeaderError::BadExtension);
            }
            let kind = u16::from_be_bytes([rest[0], rest[1]]);
            let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
            let value = rest
                .get(EXTENSION_PREFIX_LEN..EXTENSION_PREFIX_LEN + len)
                .ok_or(HeaderError::BadExtension)?;
            // No kind is known yet, so every critical one is refused.
            if kind & EXTENSION_CRITICAL != 0 {
                return Err(HeaderError::CriticalExtension(kind));
            }
            extensions.push(Extension {
                kind,
                value: value.to_vec(),
            });
            pos += EXTENSION_PREFIX_LEN + len;
        }
        Ok(Header {
            conn_id,
            ttl,
            flags,
            dst,
            src,
            extensions,
        })
    }
}

/// Outcome of the downstream relay's next leg, sent back upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplyStatus {
    Ok = 0,
    Refused = 1,
    Unreachable = 2,
    Timeout = 3,
    NoRoute = 4,
    TtlExceeded = 5,
    NotAllowed = 6,
    BadHeader = 7,
    Internal = 8,
}

impl ReplyStatus {
    /// In words, for logs and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyStatus::Ok => "ok",
            ReplyStatus::Refused => "connection refused",
            ReplyStatus::Unreachable => "unreachable",
            ReplyStatus::Timeout => "timed out",
            ReplyStatus::NoRoute => "no route",
            ReplyStatus::TtlExceeded => "TTL exceeded",
            ReplyStatus::NotAllowed => "not allowed",
            ReplyStatus::BadHeader => "bad header",
            ReplyStatus::Internal => "internal error",
        }
    }

    pub const ALL: [ReplyStatus; 9] = [
        ReplyStatus::Ok,
        ReplyStatus::Refused,
        ReplyStatus::Unreachable,
        ReplyStatus::Timeout,
        ReplyStatus::NoRoute,
        ReplyStatus::TtlExceeded,
        ReplyStatus::NotAllowed,
        ReplyStatus::BadHeader,
        ReplyStatus::Internal,
    ];

    pub fn from_code(code: u8) -> Option<ReplyStatus> {
        ReplyStatus::ALL.get(usize::from(code)).copied()
    }

    pub fn code(self) -> u8 {
        self as u8
    }

    /// Bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            ReplyStatus::Ok => "ok",
            ReplyStatus::Refused => "refused",
            ReplyStatus::Unreachable => "unreachable",
            ReplyStatus::Timeout => "timeout",
            ReplyStatus::NoRoute => "no_route",
            ReplyStatus::TtlExceeded => "ttl_exceeded",
            ReplyStatus::NotAllowed => "not_allowed",
            ReplyStatus::BadHeader => "bad_header",
            ReplyStatus::Internal => "internal",
        }
    }
}

impl TryFrom<u8> for ReplyStatus {
    type Error = HeaderError;

    fn try_from(code: u8) -> Result<ReplyStatus, HeaderError> {
        ReplyStatus::from_code(code).ok_or(HeaderError::BadStatus(code))
    }
}

/// Downstream → upstream, once per connection, after the downstream relay's
/// next leg connected (`Ok`) or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: ReplyStatus,
}

impl Reply {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(REPLY_FRAME_TYPE);
        out.push(self.status.code());
    }

    pub fn decode(buf: &[u8]) -> Result<Option<(Reply, usize)>, HeaderError> {
        let Some(&frame_type) = buf.first() else {
            return Ok(None);
        };
        if frame_type != REPLY_FRAME_TYPE {
            return Err(HeaderError::BadReplyType(frame_type));
        }
        let Some(&code) = buf.get(1) else {
            return Ok(None);
        };
        let status = ReplyStatus::try_from(code)?;
        Ok(Some((Reply { status }, REPLY_LEN)))
    }
}

/// Downstream → upstream, the whole answer to a [`FLAG_PROBE`] header: how
/// the downstream relay would reach the probe's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// `Ok`: it has a usable next hop; otherwise why not (`NoRoute`,
    /// `Unreachable` when every candidate is down).
    pub status: ReplyStatus,
    /// Its estimated time from itself to the destination in microseconds
    /// (its chosen next leg plus what that hop reported); `None` when it has
    /// not measured it (encoded `0xffff_ffff`).
    pub onward_us: Option<u32>,
}

impl ProbeAnswer {
    const UNKNOWN: u32 = u32::MAX;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(PROBE_ANSWER_FRAME_TYPE);
        out.push(self.status.code());
        // MAX is the "unknown" marker: a real figure is clamped below it.
        let us = self
            .onward_us
            .map_or(Self::UNKNOWN, |v| v.min(Self::UNKNOWN - 1));
        out.extend_from_slice(&us.to_be_bytes());
    }

    /// Decodes the answer from the start of `buf`; `Ok(None)`: need more
    /// bytes. A version-1 peer that refused the probe sends a [`Reply`]
    /// instead: that is `BadReplyType(0x10)` here (see [`Self::decode_either`]).
    pub fn decode(buf: &[u8]) -> Result<Option<(ProbeAnswer, usize)>, HeaderError> {
        let Some(&frame_type) = buf.first() else {
            return Ok(None);
        };
        if frame_type != PROBE_ANSWER_FRAME_TYPE {
            return Err(HeaderError::BadReplyType(frame_type));
        }
        let Some(&code) = buf.get(1) else {
            return Ok(None);
        };
        let status = ReplyStatus::try_from(code)?;
        let Some(us) = buf.get(2..PROBE_ANSWER_LEN) else {
            return Ok(None);
        };
        let us = u32::from_be_bytes(us.try_into().expect("4 bytes"));
        let onward_us = (us != Self::UNKNOWN).then_some(us);
        Ok(Some((ProbeAnswer { status, onward_us }, PROBE_ANSWER_LEN)))
    }

    /// A probe answer, or the plain [`Reply`] of a peer that does not answer
    /// probes (taken as that status with no estimate).
    pub fn decode_either(buf: &[u8]) -> Result<Option<(ProbeAnswer, usize)>, HeaderError> {
        match buf.first() {
            Some(&REPLY_FRAME_TYPE) => Ok(Reply::decode(buf)?.map(|(r, n)| {
                (
                    ProbeAnswer {
                        status: r.status,
                        onward_us: None,
                    },
                    n,
                )
            })),
            _ => Self::decode(buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_answer_round_trips_and_waits_for_all_bytes() {
        for answer in [
            ProbeAnswer {
                status: ReplyStatus::Ok,
                onward_us: Some(12_345),
            },
            ProbeAnswer {
                status: ReplyStatus::Unreachable,
                onward_us: None,
            },
            ProbeAnswer {
                status: ReplyStatus::Ok,
                onward_us: Some(0),
            },
        ] {
            let mut out = Vec::new();
            answer.encode(&mut out);
            assert_eq!(out.len(), PROBE_ANSWER_LEN);
            assert_eq!(out[0], PROBE_ANSWER_FRAME_TYPE);
            for cut in 0..out.len() {
                assert_eq!(ProbeAnswer::decode(&out[..cut]), Ok(None), "cut {cut}");
            }
            out.push(0xaa);
            assert_eq!(
                ProbeAnswer::decode(&out),
                Ok(Some((answer, PROBE_ANSWER_LEN)))
            );
        }
        // The marker value is never produced by a real figure.
        let mut out = Vec::new();
        ProbeAnswer {
            status: ReplyStatus::Ok,
            onward_us: Some(u32::MAX),
        }
        .encode(&mut out);
        assert_eq!(
            ProbeAnswer::decode(&out).unwrap().unwrap().0.onward_us,
            Some(u32::MAX - 1)
        );
    }

    #[test]
    fn probe_answer_refuses_bad_type_and_status_and_takes_a_plain_reply() {
        assert_eq!(
            ProbeAnswer::decode(&[0x10, 0]),
            Err(HeaderError::BadReplyType(0x10))
        );
        assert_eq!(
            ProbeAnswer::decode(&[0x11, 9, 0, 0, 0, 0]),
            Err(HeaderError::BadStatus(9))
        );
        assert_eq!(
            ProbeAnswer::decode_either(&[0x10, 7]),
            Ok(Some((
                ProbeAnswer {
                    status: ReplyStatus::BadHeader,
                    onward_us: None
                },
                REPLY_LEN
            )))
        );
    }

    #[test]
    fn probe_flag_is_known_and_round_trips() {
        let mut h = Header::new(
            1,
            Destination::Ip("192.0.2.0:0".parse().unwrap()),
            "198.51.100.2:1".parse().unwrap(),
        );
        h.flags = FLAG_PROBE;
        let mut out = Vec::new();
        h.encode(&mut out);
        assert_eq!(Header::decode(&out), Ok(Some((h, out.len()))));
    }

    fn sample() -> Header {
        Header {
            conn_id: 0x0102_0304_0506_0708,
            ttl: 7,
            flags: 0,
            dst: Destination::domain("example.com", 443).unwrap(),
            src: "[2001:db8::5]:50000".parse().unwrap(),
            extensions: vec![
                Extension {
                    kind: 0x0001,
                    value: vec![1, 2, 3],
                },
                Extension {
                    kind: 0x7fff,
                    value: vec![],
                },
            ],
        }
    }

    fn encoded(header: &Header) -> Vec<u8> {
        let mut out = Vec::new();
        header.encode(&mut out);
        out
    }

    #[test]
    fn exact_layout_of_minimal_header() {
        let header = Header::new(
            42,
            Destination::Ip("192.0.2.1:80".parse().unwrap()),
            "198.51.100.2:1234".parse().unwrap(),
        );
        let wire = encoded(&header);
        #[rustfmt::skip]
        let expected = [
            1, 0, 28, 0, 0, 16,
            0, 0, 0, 0, 0, 0, 0, 42,
            1, 192, 0, 2, 1, 0, 80,
            1, 198, 51, 100, 2, 0x04, 0xd2,
        ];
        assert_eq!(wire, expected);
        assert_eq!(Header::decode(&wire), Ok(Some((header, 28))));

        let shortest = Header::new(
            0,
            Destination::domain("a", 1).unwrap(),
            "0.0.0.0:0".parse().unwrap(),
        );
        let wire = encoded(&shortest);
        assert_eq!(wire.len(), MIN_HEADER_LEN);
        assert_eq!(Header::decode(&wire), Ok(Some((shortest, MIN_HEADER_LEN))));
    }

    #[test]
    fn round_trip_with_trailing_data() {
        let header = sample();
        let mut wire = encoded(&header);
        let len = wire.len();
        assert_eq!(len, header.encoded_len());
        wire.extend_from_slice(b"client bytes");
        assert_eq!(Header::decode(&wire), Ok(Some((header, len))));
    }

    #[test]
    fn every_split_needs_more() {
        for header in [
            sample(),
            Header::new(
                1,
                Destination::domain(&"a".repeat(255), 1).unwrap(),
                "127.0.0.1:9".parse().unwrap(),
            ),
        ] {
            let wire = encoded(&header);
            for cut in 0..wire.len() {
                assert_eq!(Header::decode(&wire[..cut]), Ok(None), "cut {cut}");
            }
        }
    }

    #[test]
    fn hop_limit_extension_round_trips_and_is_not_critical() {
        let mut header = Header::new(
            9,
            Destination::Ip("192.0.2.1:80".parse().unwrap()),
            "198.51.100.7:40000".parse().unwrap(),
        );
        assert_eq!(header.hop_limit(), None);
        header.set_hop_limit(63);
        header.set_hop_limit(62);
        assert_eq!(header.extensions.len(), 1);
        let mut wire = Vec::new();
        header.encode(&mut wire);
        let (decoded, used) = Header::decode(&wire).unwrap().unwrap();
        assert_eq!(used, wire.len());
        assert_eq!(decoded.hop_limit(), Some(62));
        assert!(!decoded.extensions[0].is_critical());
        // A value of the wrong length is ignored, not trusted.
        let mut odd = decoded.clone();
        odd.extensions[0].value = vec![1, 2];
        assert_eq!(odd.hop_limit(), None);
    }

    #[test]
    fn ttl_zero_decodes_and_cannot_be_forwarded() {
        let mut header = sample();
        header.ttl = 0;
        let wire = encoded(&header);
        let (decoded, _) = Header::decode(&wire).unwrap().unwrap();
        assert_eq!(decoded.ttl, 0);
        assert_eq!(decoded.ttl_for_next_hop(), None);
        header.ttl = DEFAULT_TTL;
        assert_eq!(header.ttl_for_next_hop(), Some(DEFAULT_TTL - 1));
    }

    #[test]
    fn bad_version_fails_on_first_byte() {
        assert_eq!(Header::decode(&[2]), Err(HeaderError::BadVersion(2)));
        assert_eq!(
            Header::decode(&[0x10, 0]),
            Err(HeaderError::BadVersion(0x10))
        );
    }

    #[test]
    fn declared_length_bounds() {
        let too_long = (MAX_HEADER_LEN as u16 + 1).to_be_bytes();
        assert_eq!(
            Header::decode(&[1, too_long[0], too_long[1]]),
            Err(HeaderError::TooLong)
        );
        assert_eq!(Header::decode(&[1, 0xff, 0xff]), Err(HeaderError::TooLong));
        assert_eq!(Header::decode(&[1, 0, 25]), Err(HeaderError::TooShort(25)));
        assert_eq!(Header::decode(&[1, 0, 0]), Err(HeaderError::TooShort(0)));
    }

    #[test]
    fn optimistic_flag_round_trips() {
        let mut header = sample();
        header.flags = FLAG_OPTIMISTIC;
        let bytes = encoded(&header);
        assert_eq!(Header::decode(&bytes), Ok(Some((header, bytes.len()))));
    }

    #[test]
    fn unknown_flags_fail_early() {
        assert_eq!(
            Header::decode(&[1, 0, 28, 0x80, 0x01]),
            Err(HeaderError::UnknownFlags(0x8000))
        );
        let mut header = sample();
        header.flags = 8;
        assert_eq!(
            Header::decode(&encoded(&header)),
            Err(HeaderError::UnknownFlags(8))
        );
    }

    #[test]
    fn window_probe_flag_round_trips() {
        let mut header = sample();
        header.flags = FLAG_WINDOW_PROBE;
        let bytes = encoded(&header);
        assert_eq!(Header::decode(&bytes), Ok(Some((header, bytes.len()))));
    }

    #[test]
    fn critical_extension_refused_others_preserved() {
        let mut header = sample();
        header.extensions.push(Extension {
            kind: 0x8003,
            value: vec![9],
        });
        assert!(header.extensions[2].is_critical());
        assert_eq!(
            Header::decode(&encoded(&header)),
            Err(HeaderError::CriticalExtension(0x8003))
        );
        header.extensions.pop();
        let (decoded, _) = Header::decode(&encoded(&header)).unwrap().unwrap();
        assert_eq!(decoded.extensions, sample().extensions);
    }

    #[test]
    fn bad_addresses() {
        let mut wire = encoded(&Header::new(
            1,
            Destination::Ip("192.0.2.1:80".parse().unwrap()),
            "198.51.100.2:1234".parse().unwrap(),
        ));
        let pristine = wire.clone();
        wire[14] = 2;
        assert_eq!(Header::decode(&wire), Err(HeaderError::BadAddressType(2)));
        // The source must be an IP address, never a domain.
        wire = pristine.clone();
        wire[21] = 3;
        assert!(matches!(
            Header::decode(&wire),
            Err(HeaderError::BadAddressType(3))
        ));

        let mut header = sample();
        header.dst = Destination::domain("abc", 1).unwrap();
        let mut wire = encoded(&header);
        wire[16] = b' ';
        assert_eq!(Header::decode(&wire), Err(HeaderError::BadDomain));
        wire[16] = 0;
        assert_eq!(Header::decode(&wire), Err(HeaderError::BadDomain));
    }

    #[test]
    fn length_mismatch_and_bad_extension() {
        let header = Header::new(
            1,
            Destination::Ip("192.0.2.1:80".parse().unwrap()),
            "[::1]:1".parse().unwrap(),
        );
        let mut wire = encoded(&header);
        // Declared length one byte shorter than the fields: the source overruns.
        let short = (wire.len() as u16 - 1).to_be_bytes();
        wire[1..3].copy_from_slice(&short);
        assert_eq!(Header::decode(&wire), Err(HeaderError::LengthMismatch));

        // Declared longer than the fields: the slack is a truncated extension.
        let mut wire = encoded(&header);
        wire.extend_from_slice(&[0, 1, 0]);
        let long = (wire.len() as u16).to_be_bytes();
        wire[1..3].copy_from_slice(&long);
        assert_eq!(Header::decode(&wire), Err(HeaderError::BadExtension));

        // Extension claiming more value bytes than remain.
        let mut wire = encoded(&header);
        wire.extend_from_slice(&[0, 1, 0, 5, 1, 2]);
        let long = (wire.len() as u16).to_be_bytes();
        wire[1..3].copy_from_slice(&long);
        assert_eq!(Header::decode(&wire), Err(HeaderError::BadExtension));
    }

    #[test]
    fn encode_limits() {
        let mut header = sample();
        header.extensions.push(Extension {
            kind: 1,
            value: vec![0; MAX_HEADER_LEN],
        });
        let mut out = vec![0xEE];
        assert_eq!(header.try_encode(&mut out), Err(HeaderError::EncodeTooLong));
        assert_eq!(out, [0xEE]);

        // Largest value that still fits decodes fine.
        let mut header = sample();
        let room = MAX_HEADER_LEN - header.encoded_len() - 4;
        header.extensions.push(Extension {
            kind: 2,
            value: vec![7; room],
        });
        let wire = encoded(&header);
        assert_eq!(wire.len(), MAX_HEADER_LEN);
        assert_eq!(Header::decode(&wire), Ok(Some((header, MAX_HEADER_LEN))));

        let mut header = sample();
        header.dst = Destination::Domain {
            host: "not valid".into(),
            port: 1,
        };
        let mut out = Vec::new();
        assert_eq!(header.try_encode(&mut out), Err(HeaderError::BadDomain));
        assert!(out.is_empty());
    }

    #[test]
    #[should_panic(expected = "cannot encode relay header")]
    fn encode_panics_on_oversized_header() {
        let mut header = sample();
        header.extensions.push(Extension {
            kind: 1,
            value: vec![0; MAX_HEADER_LEN],
        });
        header.encode(&mut Vec::new());
    }

    #[test]
    fn reply_round_trip_every_status() {
        for status in ReplyStatus::ALL {
            let mut wire = Vec::new();
            Reply { status }.encode(&mut wire);
            assert_eq!(wire, [REPLY_FRAME_TYPE, status as u8]);
            assert_eq!(Reply::decode(&wire[..0]), Ok(None));
            assert_eq!(Reply::decode(&wire[..1]), Ok(None));
            wire.push(0x55);
            assert_eq!(
                Reply::decode(&wire),
                Ok(Some((Reply { status }, REPLY_LEN)))
            );
            assert_eq!(ReplyStatus::try_from(status.code()), Ok(status));
        }
    }

    #[test]
    fn reply_errors() {
        assert_eq!(Reply::decode(&[1, 0]), Err(HeaderError::BadReplyType(1)));
        assert_eq!(
            Reply::decode(&[REPLY_FRAME_TYPE, 9]),
            Err(HeaderError::BadStatus(9))
        );
        assert_eq!(
            Reply::decode(&[REPLY_FRAME_TYPE, 0xff]),
            Err(HeaderError::BadStatus(0xff))
        );
    }
}
