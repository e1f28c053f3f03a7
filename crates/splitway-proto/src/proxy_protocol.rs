//! HAProxy PROXY protocol, versions 1 (text) and 2 (binary): the header a
//! proxy puts before a connection's first byte to tell the server who the
//! client is (<https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>).
//!
//! ```text
//! v1: "PROXY TCP4 192.0.2.1 198.51.100.2 51234 443\r\n"   (≤ 107 bytes)
//!     "PROXY UNKNOWN ...\r\n"
//! v2: sig[12] = 0D 0A 0D 0A 00 0D 0A 51 55 49 54 0A
//!     ver_cmd (0x20 LOCAL, 0x21 PROXY), fam (0x11 TCP4, 0x21 TCP6, 0x00 UNSPEC),
//!     len (u16 BE), then src addr, dst addr, src port, dst port, TLVs
//! ```
//!
//! [`decode`] follows the crate's incremental contract and detects the version
//! from the first byte. TLVs are walked (a TLV that overruns the block is
//! refused) and dropped: nothing here needs their content.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The v2 signature: starts with CRLF so a v1 or HTTP parser refuses it at once.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The v1 line prefix.
pub const V1_PREFIX: &[u8; 6] = b"PROXY ";
/// Longest v1 line the specification allows, CRLF included.
pub const V1_MAX_LEN: usize = 107;
/// Fixed part of a v2 header: signature, version/command, family, length.
pub const V2_FIXED_LEN: usize = 16;
/// Largest v2 payload (addresses + TLVs) accepted. The format allows 65535;
/// real senders (HAProxy, cloud balancers) send a few hundred bytes, and a
/// relay must not buffer 64 KiB per unauthenticated connection.
pub const V2_MAX_PAYLOAD: usize = 4096;
/// Largest header [`decode`] ever waits for.
pub const MAX_HEADER_LEN: usize = V2_FIXED_LEN + V2_MAX_PAYLOAD;

const V2_VERSION: u8 = 0x2;
const CMD_LOCAL: u8 = 0x0;
const CMD_PROXY: u8 = 0x1;
const AF_UNSPEC: u8 = 0x0;
const AF_INET: u8 = 0x1;
const AF_INET6: u8 = 0x2;
const AF_UNIX: u8 = 0x3;
const PROTO_UNSPEC: u8 = 0x0;
const PROTO_STREAM: u8 = 0x1;
const INET_LEN: usize = 12;
const INET6_LEN: usize = 36;
const UNIX_LEN: usize = 216;
const TLV_HEADER_LEN: usize = 3;

/// Which encoding a header used (or should use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn label(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// What a header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    /// A TCP connection from `src` to `dst`, as the sender saw it.
    Tcp { src: SocketAddr, dst: SocketAddr },
    /// v1 `UNKNOWN` or v2 `PROXY` with an unspecified family: the sender does
    /// not know; the receiver uses the socket's own addresses.
    Unknown,
    /// v2 `LOCAL`: the sender's own connection (health check); the receiver
    /// uses the socket's own addresses.
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyHeader {
    pub version: Version,
    pub addresses: Addresses,
}

impl ProxyHeader {
    /// The client address this header carries, if any.
    pub fn source(&self) -> Option<SocketAddr> {
        match self.addresses {
            Addresses::Tcp { src, .. } => Some(src),
            Addresses::Unknown | Addresses::Local => None,
        }
    }
}

/// A PROXY protocol header this side cannot accept. Always final.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error(
        "PROXY sender: no PROXY protocol signature (first bytes are neither \"PROXY \" nor the v2 signature)"
    )]
    BadSignature,
    #[error("PROXY sender: connection closed after {0} bytes, inside the header")]
    Truncated(usize),
    #[error("PROXY sender: v1 line longer than {V1_MAX_LEN} bytes or not ended by CRLF")]
    V1TooLong,
    #[error("PROXY sender: malformed v1 line ({0})")]
    V1Malformed(&'static str),
    #[error("PROXY sender: unknown v2 version {0:#x}")]
    UnknownVersion(u8),
    #[error("PROXY sender: unknown v2 command {0:#x}")]
    UnknownCommand(u8),
    #[error("PROXY sender: unknown v2 address family/protocol byte {0:#04x}")]
    UnknownFamily(u8),
    #[error(
        "PROXY sender: v2 family/protocol {0:#04x} (UNIX or DGRAM) cannot describe a TCP client"
    )]
    UnsupportedFamily(u8),
    #[error(
        "PROXY sender: v2 length {declared} is shorter than the {needed} bytes its address family needs"
    )]
    LengthTooShort { declared: usize, needed: usize },
    #[error("PROXY sender: v2 length {0} is over this relay's limit of {V2_MAX_PAYLOAD}")]
    LengthTooLong(usize),
    #[error("PROXY sender: a v2 TLV runs past the end of the header")]
    BadTlv,
}

impl ProxyError {
    /// Bounded metric label.
    pub fn label(&self) -> &'static str {
        match self {
            ProxyError::BadSignature => "bad_signature",
            ProxyError::Truncated(_) => "truncated",
            ProxyError::V1TooLong => "line_too_long",
            ProxyError::V1Malformed(_) => "bad_line",
            ProxyError::UnknownVersion(_) => "unknown_version",
            ProxyError::UnknownCommand(_) => "unknown_command",
            ProxyError::UnknownFamily(_) => "unknown_family",
            ProxyError::UnsupportedFamily(_) => "unsupported_family",
            ProxyError::LengthTooShort { .. } => "length_too_short",
            ProxyError::LengthTooLong(_) => "length_too_long",
            ProxyError::BadTlv => "bad_tlv",
        }
    }
}

/// Every label [`ProxyError::label`] can return, for metric pre-registration.
pub const ERROR_LABELS: [&str; 11] = [
    "bad_signature",
    "truncated",
    "line_too_long",
    "bad_line",
    "unknown_version",
    "unknown_command",
    "unknown_family",
    "unsupported_family",
    "length_too_short",
    "length_too_long",
    "bad_tlv",
];

/// Decodes a v1 or v2 header at the start of `buf`. `Ok(None)`: more bytes
/// needed (never once `buf` holds [`MAX_HEADER_LEN`] bytes); at end of stream
/// the caller reports [`ProxyError::Truncated`].
pub fn decode(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    match buf.first() {
        None => Ok(None),
        Some(b'P') => decode_v1(buf),
        Some(b'\r') => decode_v2(buf),
        Some(_) => Err(ProxyError::BadSignature),
    }
}

/// True if `buf` could still be the start of a PROXY header. For a listener
/// that takes the header as optional, which this relay never does, and for
/// tests.
pub fn could_be_header(buf: &[u8]) -> bool {
    let v1 = buf.iter().zip(V1_PREFIX).all(|(a, b)| a == b);
    let v2 = buf.iter().zip(&V2_SIGNATURE).all(|(a, b)| a == b);
    v1 || v2
}

fn decode_v1(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    if buf.iter().zip(V1_PREFIX).any(|(a, b)| a != b) {
        return Err(ProxyError::BadSignature);
    }
    // Only the first 107 bytes may hold the CRLF, and every byte before it
    // must be printable ASCII: a prefix and the whole buffer then agree.
    let window = &buf[..buf.len().min(V1_MAX_LEN)];
    let mut end = None;
    for (at, &byte) in window.iter().enumerate() {
        if (0x20..0x7F).contains(&byte) {
            continue;
        }
        match (byte, window.get(at + 1)) {
            (b'\r', Some(b'\n')) => {
                end = Some(at);
                break;
            }
            // A CR as the 107th byte cannot end a line in time: TooLong below.
            (b'\r', None) => break,
            _ => return Err(ProxyError::V1Malformed("control or non-ASCII byte")),
        }
    }
    let Some(cr) = end else {
        return if buf.len() >= V1_MAX_LEN {
            Err(ProxyError::V1TooLong)
        } else {
            Ok(None)
        };
    };
    let line = &buf[V1_PREFIX.len()..cr];
    let addresses = parse_v1_fields(line)?;
    Ok(Some((
        ProxyHeader {
            version: Version::V1,
            addresses,
        },
        cr + 2,
    )))
}

fn parse_v1_fields(line: &[u8]) -> Result<Addresses, ProxyError> {
    // decode_v1 let only printable ASCII through.
    let text = std::str::from_utf8(line)
        .map_err(|_| ProxyError::V1Malformed("control or non-ASCII byte"))?;
    let mut fields = text.split(' ');
    let family = fields.next().unwrap_or("");
    if family == "UNKNOWN" {
        // The specification lets the sender put anything after UNKNOWN.
        return Ok(Addresses::Unknown);
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => {
            return Err(ProxyError::V1Malformed(
                "protocol is not TCP4, TCP6 or UNKNOWN",
            ));
        }
    };
    let mut next = |what: &'static str| fields.next().ok_or(ProxyError::V1Malformed(what));
    let src_ip = parse_v1_ip(next("missing source address")?, v6)?;
    let dst_ip = parse_v1_ip(next("missing destination address")?, v6)?;
    let src_port = parse_v1_port(next("missing source port")?)?;
    let dst_port = parse_v1_port(next("missing destination port")?)?;
    if fields.next().is_some() {
        return Err(ProxyError::V1Malformed("extra fields"));
    }
    Ok(Addresses::Tcp {
        src: SocketAddr::new(src_ip, src_port),
        dst: SocketAddr::new(dst_ip, dst_port),
    })
}

fn parse_v1_ip(text: &str, v6: bool) -> Result<IpAddr, ProxyError> {
    if v6 {
        text.parse::<Ipv6Addr>()
            .map(IpAddr::V6)
            .map_err(|_| ProxyError::V1Malformed("bad IPv6 address"))
    } else {
        text.parse::<Ipv4Addr>()
            .map(IpAddr::V4)
            .map_err(|_| ProxyError::V1Malformed("bad IPv4 address"))
    }
}

fn parse_v1_port(text: &str) -> Result<u16, ProxyError> {
    // Decimal digits only: `parse` alone would take a leading '+'.
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ProxyError::V1Malformed("bad port"));
    }
    text.parse()
        .map_err(|_| ProxyError::V1Malformed("port over 65535"))
}

fn decode_v2(buf: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    if buf.iter().zip(&V2_SIGNATURE).any(|(a, b)| a != b) {
        return Err(ProxyError::BadSignature);
    }
    let Some(&ver_cmd) = buf.get(12) else {
        return Ok(None);
    };
    if ver_cmd >> 4 != V2_VERSION {
        return Err(ProxyError::UnknownVersion(ver_cmd >> 4));
    }
    let command = ver_cmd & 0x0F;
    if command != CMD_LOCAL && command != CMD_PROXY {
        return Err(ProxyError::UnknownCommand(command));
    }
    let Some(&fam) = buf.get(13) else {
        return Ok(None);
    };
    // The specification lists these seven; any other must be rejected.
    if ![0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32].contains(&fam) {
        return Err(ProxyError::UnknownFamily(fam));
    }
    let family = fam >> 4;
    if buf.len() < V2_FIXED_LEN {
        return Ok(None);
    }
    let declared = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if declared > V2_MAX_PAYLOAD {
        return Err(ProxyError::LengthTooLong(declared));
    }
    let needed = match family {
        AF_INET => INET_LEN,
        AF_INET6 => INET6_LEN,
        AF_UNIX => UNIX_LEN,
        _ => 0,
    };
    // LOCAL ignores the family, but a length shorter than the addresses it
    // names is a lie either way.
    if declared < needed {
        return Err(ProxyError::LengthTooShort { declared, needed });
    }
    let total = V2_FIXED_LEN + declared;
    if buf.len() < total {
        return Ok(None);
    }
    let payload = &buf[V2_FIXED_LEN..total];
    walk_tlvs(&payload[needed..])?;
    let addresses = if command == CMD_LOCAL {
        Addresses::Local
    } else {
        match fam {
            0x00 => Addresses::Unknown,
            0x11 => {
                let ip = |at: usize| {
                    Ipv4Addr::new(
                        payload[at],
                        payload[at + 1],
                        payload[at + 2],
                        payload[at + 3],
                    )
                };
                let port = |at: usize| u16::from_be_bytes([payload[at], payload[at + 1]]);
                Addresses::Tcp {
                    src: SocketAddr::V4(SocketAddrV4::new(ip(0), port(8))),
                    dst: SocketAddr::V4(SocketAddrV4::new(ip(4), port(10))),
                }
            }
            0x21 => {
                let ip = |at: usize| {
                    let mut octets = [0u8; 16];
                    octets.copy_from_slice(&payload[at..at + 16]);
                    Ipv6Addr::from(octets)
                };
                let port = |at: usize| u16::from_be_bytes([payload[at], payload[at + 1]]);
                Addresses::Tcp {
                    src: SocketAddr::V6(SocketAddrV6::new(ip(0), port(32), 0, 0)),
                    dst: SocketAddr::V6(SocketAddrV6::new(ip(16), port(34), 0, 0)),
                }
            }
            _ => return Err(ProxyError::UnsupportedFamily(fam)),
        }
    };
    Ok(Some((
        ProxyHeader {
            version: Version::V2,
            addresses,
        },
        total,
    )))
}

/// Checks that the TLVs tile `tlvs` exactly; their content is not needed.
fn walk_tlvs(mut tlvs: &[u8]) -> Result<(), ProxyError> {
    while !tlvs.is_empty() {
        if tlvs.len() < TLV_HEADER_LEN {
            return Err(ProxyError::BadTlv);
        }
        let len = usize::from(u16::from_be_bytes([tlvs[1], tlvs[2]]));
        let end = TLV_HEADER_LEN + len;
        if tlvs.len() < end {
            return Err(ProxyError::BadTlv);
        }
        tlvs = &tlvs[end..];
    }
    Ok(())
}

/// Both addresses in one family: v1 and v2 carry a single family, so an IPv4
/// address beside an IPv6 one travels IPv4-mapped.
fn same_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    fn to_v6(addr: SocketAddr) -> SocketAddr {
        match addr {
            SocketAddr::V4(v4) => {
                SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
            }
            v6 => v6,
        }
    }
    if src.is_ipv4() == dst.is_ipv4() {
        (src, dst)
    } else {
        (to_v6(src), to_v6(dst))
    }
}

/// Appends a header saying the connection came from `src` to `dst`.
pub fn encode(version: Version, src: SocketAddr, dst: SocketAddr, out: &mut Vec<u8>) {
    let (src, dst) = same_family(src, dst);
    match version {
        Version::V1 => {
            let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
            // `ip()` prints without brackets or scope, as v1 wants.
            let line = format!(
                "PROXY {family} {} {} {} {}\r\n",
                src.ip(),
                dst.ip(),
                src.port(),
                dst.port()
            );
            debug_assert!(line.len() <= V1_MAX_LEN);
            out.extend_from_slice(line.as_bytes());
        }
        Version::V2 => {
            out.extend_from_slice(&V2_SIGNATURE);
            out.push(V2_VERSION << 4 | CMD_PROXY);
            match (src, dst) {
                (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                    out.push(AF_INET << 4 | PROTO_STREAM);
                    out.extend_from_slice(&(INET_LEN as u16).to_be_bytes());
                    out.extend_from_slice(&s.ip().octets());
                    out.extend_from_slice(&d.ip().octets());
                }
                (SocketAddr::V6(s), SocketAddr::V6(d)) => {
                    out.push(AF_INET6 << 4 | PROTO_STREAM);
                    out.extend_from_slice(&(INET6_LEN as u16).to_be_bytes());
                    out.extend_from_slice(&s.ip().octets());
                    out.extend_from_slice(&d.ip().octets());
                }
                _ => unreachable!("same_family returned mixed families"),
            }
            out.extend_from_slice(&src.port().to_be_bytes());
            out.extend_from_slice(&dst.port().to_be_bytes());
        }
    }
}

/// Appends a header that carries no address: v1 `UNKNOWN`, v2 `LOCAL`.
pub fn encode_unknown(version: Version, out: &mut Vec<u8>) {
    match version {
        Version::V1 => out.extend_from_slice(b"PROXY UNKNOWN\r\n"),
        Version::V2 => {
            out.extend_from_slice(&V2_SIGNATURE);
            out.push(V2_VERSION << 4 | CMD_LOCAL);
            out.push(AF_UNSPEC << 4 | PROTO_UNSPEC);
            out.extend_from_slice(&0u16.to_be_bytes());
        }
    }
}

/// Length of the header [`encode`] writes for these addresses.
pub fn encoded_len(version: Version, src: SocketAddr, dst: SocketAddr) -> usize {
    let mut out = Vec::with_capacity(V2_FIXED_LEN + INET6_LEN);
    encode(version, src, dst, &mut out);
    out.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn every_prefix_needs_more(wire: &[u8]) {
        for cut in 0..wire.len() {
            assert_eq!(decode(&wire[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn v1_spec_examples() {
        let wire = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nGET /";
        let (header, used) = decode(wire).unwrap().unwrap();
        assert_eq!(used, wire.len() - 5);
        assert_eq!(header.version, Version::V1);
        assert_eq!(
            header.addresses,
            Addresses::Tcp {
                src: v4("192.168.0.1:56324"),
                dst: v4("192.168.0.11:443")
            }
        );
        every_prefix_needs_more(&wire[..used]);

        let wire = b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n";
        let (header, _) = decode(wire).unwrap().unwrap();
        assert_eq!(header.source(), Some("[2001:db8::1]:1".parse().unwrap()));

        let (header, used) = decode(b"PROXY UNKNOWN ffff::1 ::2 1 2\r\nx")
            .unwrap()
            .unwrap();
        assert_eq!((header.addresses, used), (Addresses::Unknown, 31));
        assert_eq!(
            decode(b"PROXY UNKNOWN\r\n").unwrap().unwrap().0.addresses,
            Addresses::Unknown
        );
    }

    #[test]
    fn v1_worst_case_fits_and_108_bytes_do_not() {
        let src: SocketAddr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
            .parse()
            .unwrap();
        let mut wire = Vec::new();
        encode(Version::V1, src, src, &mut wire);
        assert_eq!(wire.len(), 104, "the spec's worst case");
        // UNKNOWN with filler up to exactly 107 bytes parses; 108 does not.
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LEN - 2, b'x');
        line.extend_from_slice(b"\r\n");
        assert_eq!(decode(&line).unwrap().unwrap().1, V1_MAX_LEN);
        line.insert(20, b'x');
        assert_eq!(decode(&line), Err(ProxyError::V1TooLong));
        assert_eq!(decode(&line[..V1_MAX_LEN]), Err(ProxyError::V1TooLong));
        assert_eq!(decode(&line[..V1_MAX_LEN - 1]), Ok(None));
    }

    #[test]
    fn v1_refusals() {
        let signature: &[&[u8]] = &[b"PROXX", b"GET / HTTP/1.1\r\n"];
        // Each malformed header with the reason it is refused for.
        let malformed: &[(&[u8], &'static str)] = &[
            (
                b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
                "protocol is not TCP4, TCP6 or UNKNOWN",
            ),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
                "missing destination port",
            ),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "extra fields"),
            (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "bad IPv4 address"),
            (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "bad IPv4 address"),
            (b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", "bad IPv6 address"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", "bad port"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "port over 65535"),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
                "control or non-ASCII byte",
            ),
            (b"PROXY TCP4 1.2.3.4\t", "control or non-ASCII byte"),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1 \xff",
                "control or non-ASCII byte",
            ),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rx",
                "control or non-ASCII byte",
            ),
        ];
        let cases = signature
            .iter()
            .map(|&wire| (wire, ProxyError::BadSignature))
            .chain(
                malformed
                    .iter()
                    .map(|&(wire, why)| (wire, ProxyError::V1Malformed(why))),
            );
        for (wire, expected) in cases {
            assert_eq!(
                decode(wire).as_ref(),
                Err(&expected),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    fn v2_tcp4() -> Vec<u8> {
        let mut wire = Vec::new();
        encode(
            Version::V2,
            v4("10.0.0.1:1234"),
            v4("10.0.0.2:80"),
            &mut wire,
        );
        wire
    }

    #[test]
    fn v2_exact_layout_and_round_trip() {
        let wire = v2_tcp4();
        assert_eq!(
            wire,
            [
                0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A, 0x21, 0x11,
                0x00, 0x0C, 10, 0, 0, 1, 10, 0, 0, 2, 0x04, 0xD2, 0x00, 0x50
            ]
        );
        every_prefix_needs_more(&wire);
        let (header, used) = decode(&wire).unwrap().unwrap();
        assert_eq!(used, 28);
        assert_eq!(header.source(), Some(v4("10.0.0.1:1234")));

        let (src, dst) = (
            "[2001:db8::7]:9".parse().unwrap(),
            "[::1]:443".parse().unwrap(),
        );
        let mut wire = Vec::new();
        encode(Version::V2, src, dst, &mut wire);
        assert_eq!(wire.len(), 16 + 36);
        assert_eq!(
            decode(&wire).unwrap().unwrap().0.addresses,
            Addresses::Tcp { src, dst }
        );
    }

    #[test]
    fn mixed_families_travel_v4_mapped() {
        let (src, dst) = (v4("192.0.2.1:5"), "[2001:db8::1]:80".parse().unwrap());
        for version in [Version::V1, Version::V2] {
            let mut wire = Vec::new();
            encode(version, src, dst, &mut wire);
            let header = decode(&wire).unwrap().unwrap().0;
            assert_eq!(
                header.source(),
                Some("[::ffff:192.0.2.1]:5".parse().unwrap()),
                "{version:?}"
            );
        }
    }

    #[test]
    fn v2_tlvs_skipped_and_checked() {
        let mut wire = v2_tcp4();
        // Two TLVs: ALPN "h2" and an empty NOOP.
        wire.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2', 0x04, 0x00, 0x00]);
        wire[15] = 12 + 8;
        let (header, used) = decode(&wire).unwrap().unwrap();
        assert_eq!((used, header.source()), (36, Some(v4("10.0.0.1:1234"))));
        // A TLV whose length runs past the block.
        wire[28 + 2] = 9;
        assert_eq!(decode(&wire), Err(ProxyError::BadTlv));
        // Two stray bytes after the addresses: not even a TLV header.
        let mut wire = v2_tcp4();
        wire.extend_from_slice(&[1, 0]);
        wire[15] = 14;
        assert_eq!(decode(&wire), Err(ProxyError::BadTlv));
    }

    #[test]
    fn v2_local_and_unspec() {
        let mut wire = Vec::new();
        encode_unknown(Version::V2, &mut wire);
        assert_eq!(
            decode(&wire).unwrap().unwrap(),
            (
                ProxyHeader {
                    version: Version::V2,
                    addresses: Addresses::Local
                },
                16
            )
        );
        // LOCAL with a TCP4 block: the block is skipped, the family ignored.
        let mut wire = v2_tcp4();
        wire[12] = 0x20;
        assert_eq!(
            decode(&wire).unwrap().unwrap().0.addresses,
            Addresses::Local
        );
        // PROXY UNSPEC.
        let mut wire = Vec::new();
        encode_unknown(Version::V2, &mut wire);
        wire[12] = 0x21;
        assert_eq!(
            decode(&wire).unwrap().unwrap().0.addresses,
            Addresses::Unknown
        );
    }

    #[test]
    fn v2_refusals() {
        let base = v2_tcp4();
        let with = |at: usize, byte: u8| {
            let mut wire = base.clone();
            wire[at] = byte;
            wire
        };
        use ProxyError::*;
        let short = |declared, needed| LengthTooShort { declared, needed };
        // Each header with one byte changed (and cut short where given) and its refusal.
        let cases = [
            (7, b'X', None, BadSignature),
            (7, b'X', Some(8), BadSignature),
            (12, 0x11, None, UnknownVersion(1)),
            (12, 0x22, Some(13), UnknownCommand(2)),
            (13, 0x41, None, UnknownFamily(0x41)),
            (13, 0x10, None, UnknownFamily(0x10)),
            (13, 0x31, None, short(12, 216)),
            (13, 0x13, None, UnknownFamily(0x13)),
            (13, 0x12, None, UnsupportedFamily(0x12)),
            (13, 0x21, None, short(12, 36)),
            (15, 11, Some(16), short(11, 12)),
        ];
        for (at, byte, cut, expected) in cases {
            let wire = with(at, byte);
            let wire = &wire[..cut.unwrap_or(wire.len())];
            assert_eq!(decode(wire), Err(expected), "byte {at} = {byte:#x}");
        }
        let mut long = base.clone();
        long[14] = 0xFF;
        assert_eq!(decode(&long[..16]), Err(ProxyError::LengthTooLong(0xFF0C)));
        // A length that promises more than arrives waits, up to the limit.
        let mut lying = base.clone();
        lying[14] = 0x01;
        assert_eq!(decode(&lying), Ok(None));
        assert_eq!(decode(b"\x16\x03\x01"), Err(ProxyError::BadSignature));
    }

    #[test]
    fn could_be_header_tracks_both_signatures() {
        assert!(could_be_header(b""));
        assert!(could_be_header(b"PRO"));
        assert!(could_be_header(&V2_SIGNATURE[..5]));
        assert!(!could_be_header(b"GET"));
        assert!(!could_be_header(b"\r\n\r\n\x01"));
    }

    #[test]
    fn labels_cover_every_variant() {
        let all = [
            ProxyError::BadSignature,
            ProxyError::Truncated(3),
            ProxyError::V1TooLong,
            ProxyError::V1Malformed("x"),
            ProxyError::UnknownVersion(1),
            ProxyError::UnknownCommand(2),
            ProxyError::UnknownFamily(3),
            ProxyError::UnsupportedFamily(4),
            ProxyError::LengthTooShort {
                declared: 1,
                needed: 2,
            },
            ProxyError::LengthTooLong(5),
            ProxyError::BadTlv,
        ];
        let labels: Vec<_> = all.iter().map(ProxyError::label).collect();
        assert_eq!(labels, ERROR_LABELS);
    }
}
