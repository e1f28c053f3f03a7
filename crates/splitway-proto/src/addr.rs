//! Destinations (IP socket address or domain name + port) and their SOCKS-style
//! wire encoding, shared by the relay header and SOCKS5.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::str::FromStr;

/// Address type byte for IPv4 (same value as SOCKS5 ATYP).
pub const ATYP_IPV4: u8 = 0x01;
/// Address type byte for a domain name (same value as SOCKS5 ATYP).
pub const ATYP_DOMAIN: u8 = 0x03;
/// Address type byte for IPv6 (same value as SOCKS5 ATYP).
pub const ATYP_IPV6: u8 = 0x04;

/// Longest accepted domain name, in bytes (the wire length prefix is one byte).
pub const MAX_DOMAIN_LEN: usize = 255;

/// Longest wire encoding of a [`Destination`]: type + length + 255-byte name + port.
pub const MAX_ENCODED_DESTINATION_LEN: usize = 1 + 1 + MAX_DOMAIN_LEN + 2;

/// Where a client wants to go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    Ip(SocketAddr),
    /// `host` always satisfies [`is_valid_domain`] when produced by a decoder in this crate.
    Domain {
        host: String,
        port: u16,
    },
}

/// Why a destination could not be parsed or encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("unsupported address type {0:#04x}")]
    BadAddressType(u8),
    #[error("invalid domain name (1..=255 bytes of ASCII letters, digits, '-' and '.')")]
    BadDomain,
    #[error("missing port (expected host:port)")]
    MissingPort,
    #[error("invalid port (expected 1..=65535)")]
    BadPort,
}

/// True if `name` is 1..=255 bytes of ASCII letters, digits, `-` and `.`.
///
/// Deliberately stricter than DNS: it keeps control bytes, spaces, `@`, `/`, `:`
/// and NUL out of log lines, metrics and resolver calls.
pub fn is_valid_domain(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_DOMAIN_LEN
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

impl Destination {
    /// A domain destination, validated.
    pub fn domain(host: &str, port: u16) -> Result<Destination, AddrError> {
        if !is_valid_domain(host.as_bytes()) {
            return Err(AddrError::BadDomain);
        }
        Ok(Destination::Domain {
            host: host.to_owned(),
            port,
        })
    }

    pub fn port(&self) -> u16 {
        match self {
            Destination::Ip(addr) => addr.port(),
            Destination::Domain { port, .. } => *port,
        }
    }

    /// Parses an authority `host:port`, `a.b.c.d:port` or `[v6]:port`.
    ///
    /// A host that parses as an IPv4 literal becomes [`Destination::Ip`]. Port 0
    /// is rejected: nobody can connect to it.
    pub fn parse_authority(text: &str) -> Result<Destination, AddrError> {
        let (host, port_text) = if let Some(rest) = text.strip_prefix('[') {
            let (v6, after) = rest.split_once(']').ok_or(AddrError::BadDomain)?;
            let port_text = after.strip_prefix(':').ok_or(AddrError::MissingPort)?;
            let ip: Ipv6Addr = v6.parse().map_err(|_| AddrError::BadDomain)?;
            let port = parse_port(port_text)?;
            return Ok(Destination::Ip(SocketAddr::new(IpAddr::V6(ip), port)));
        } else {
            text.rsplit_once(':').ok_or(AddrError::MissingPort)?
        };
        let port = parse_port(port_text)?;
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return Ok(Destination::Ip(SocketAddr::new(IpAddr::V4(ip), port)));
        }
        Destination::domain(host, port)
    }

    /// Exact number of bytes [`Destination::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        match self {
            Destination::Ip(SocketAddr::V4(_)) => 1 + 4 + 2,
            Destination::Ip(SocketAddr::V6(_)) => 1 + 16 + 2,
            Destination::Domain { host, .. } => 1 + 1 + host.len() + 2,
        }
    }

    /// Appends the SOCKS-style encoding: ATYP, address, port (big endian).
    ///
    /// Flow info and scope id of an IPv6 address are not carried. Fails (and
    /// writes nothing) for an invalid domain, which could not be decoded again.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), AddrError> {
        match self {
            Destination::Ip(addr) => encode_socket_addr(addr, out),
            Destination::Domain { host, port } => {
                if !is_valid_domain(host.as_bytes()) {
                    return Err(AddrError::BadDomain);
                }
                out.push(ATYP_DOMAIN);
                // Cannot truncate: is_valid_domain bounds the length to 255.
                out.push(host.len() as u8);
                out.extend_from_slice(host.as_bytes());
                out.extend_from_slice(&port.to_be_bytes());
            }
        }
        Ok(())
    }

    /// Decodes the SOCKS-style encoding. `Ok(None)` means more bytes are needed.
    pub fn decode(buf: &[u8]) -> Result<Option<(Destination, usize)>, AddrError> {
        let Some(&atyp) = buf.first() else {
            return Ok(None);
        };
        match atyp {
            ATYP_IPV4 | ATYP_IPV6 => {
                Ok(decode_socket_addr(buf)?
                    .map(|(addr, consumed)| (Destination::Ip(addr), consumed)))
            }
            ATYP_DOMAIN => {
                let Some(&len) = buf.get(1) else {
                    return Ok(None);
                };
                let len = usize::from(len);
                if len == 0 {
                    return Err(AddrError::BadDomain);
                }
                // Validate what has arrived so far, so garbage fails early.
                let name_available = &buf[2..buf.len().min(2 + len)];
                if !name_available
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                {
                    return Err(AddrError::BadDomain);
                }
                let total = 2 + len + 2;
                if buf.len() < total {
                    return Ok(None);
                }
                let host = std::str::from_utf8(&buf[2..2 + len])
                    .map_err(|_| AddrError::BadDomain)?
                    .to_owned();
                let port = u16::from_be_bytes([buf[2 + len], buf[3 + len]]);
                Ok(Some((Destination::Domain { host, port }, total)))
            }
            other => Err(AddrError::BadAddressType(other)),
        }
    }
}

/// Appends ATYP (IPv4 or IPv6), address and big-endian port.
pub fn encode_socket_addr(addr: &SocketAddr, out: &mut Vec<u8>) {
    match addr {
        SocketAddr::V4(v4) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&v6.ip().octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
}

/// Decodes an IPv4 or IPv6 socket address (ATYP, address, port); a domain type is an error.
pub fn decode_socket_addr(buf: &[u8]) -> Result<Option<(SocketAddr, usize)>, AddrError> {
    let Some(&atyp) = buf.first() else {
        return Ok(None);
    };
    let addr_len = match atyp {
        ATYP_IPV4 => 4,
        ATYP_IPV6 => 16,
        other => return Err(AddrError::BadAddressType(other)),
    };
    let total = 1 + addr_len + 2;
    if buf.len() < total {
        return Ok(None);
    }
    let port = u16::from_be_bytes([buf[1 + addr_len], buf[2 + addr_len]]);
    let addr = if atyp == ATYP_IPV4 {
        let octets: [u8; 4] = buf[1..5].try_into().expect("length checked above");
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(octets), port))
    } else {
        let octets: [u8; 16] = buf[1..17].try_into().expect("length checked above");
        SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(octets), port, 0, 0))
    };
    Ok(Some((addr, total)))
}

fn parse_port(text: &str) -> Result<u16, AddrError> {
    if text.is_empty() {
        return Err(AddrError::MissingPort);
    }
    // u16::from_str accepts a leading '+'; a port is digits only.
    if text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AddrError::BadPort);
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(AddrError::BadPort),
        Ok(port) => Ok(port),
    }
}

impl fmt::Display for Destination {
    /// `host:port`, `a.b.c.d:port` or `[v6]:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Ip(addr) => write!(f, "{addr}"),
            Destination::Domain { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl FromStr for Destination {
    type Err = AddrError;

    fn from_str(text: &str) -> Result<Destination, AddrError> {
        Destination::parse_authority(text)
    }
}

impl From<SocketAddr> for Destination {
    fn from(addr: SocketAddr) -> Destination {
        Destination::Ip(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_validation() {
        assert!(is_valid_domain(b"example.com"));
        assert!(is_valid_domain(b"a-b.c0.d."));
        assert!(is_valid_domain(&[b'a'; 255]));
        assert!(!is_valid_domain(&[b'a'; 256]));
        assert!(!is_valid_domain(b""));
        for bad in [
            &b"a b"[..],
            b"a\0b",
            b"user@host",
            b"a/b",
            b"a:b",
            b"\xc3\xa9",
            b"a_b",
        ] {
            assert!(!is_valid_domain(bad), "{bad:?}");
        }
    }

    #[test]
    fn display() {
        assert_eq!(
            Destination::Ip("1.2.3.4:80".parse().unwrap()).to_string(),
            "1.2.3.4:80"
        );
        assert_eq!(
            Destination::Ip("[::1]:443".parse().unwrap()).to_string(),
            "[::1]:443"
        );
        assert_eq!(
            Destination::domain("example.com", 8080)
                .unwrap()
                .to_string(),
            "example.com:8080"
        );
    }

    #[test]
    fn parse_authority() {
        assert_eq!(
            "example.com:443".parse::<Destination>().unwrap(),
            Destination::domain("example.com", 443).unwrap()
        );
        assert_eq!(
            Destination::parse_authority("10.0.0.1:22").unwrap(),
            Destination::Ip("10.0.0.1:22".parse().unwrap())
        );
        assert_eq!(
            Destination::parse_authority("[2001:db8::1]:443").unwrap(),
            Destination::Ip("[2001:db8::1]:443".parse().unwrap())
        );
        assert_eq!(
            Destination::parse_authority("example.com"),
            Err(AddrError::MissingPort)
        );
        assert_eq!(
            Destination::parse_authority("example.com:"),
            Err(AddrError::MissingPort)
        );
        assert_eq!(
            Destination::parse_authority("[::1]"),
            Err(AddrError::MissingPort)
        );
        for bad_port in ["h:0", "h:65536", "h:+80", "h:8o", "h:000080"] {
            assert_eq!(
                Destination::parse_authority(bad_port),
                Err(AddrError::BadPort),
                "{bad_port}"
            );
        }
        for bad_host in [":80", "a b:80", "[::1:80", "[zz]:80", "::1:80", "a@b:80"] {
            assert_eq!(
                Destination::parse_authority(bad_host),
                Err(AddrError::BadDomain),
                "{bad_host}"
            );
        }
    }

    #[test]
    fn wire_round_trip_and_split() {
        let cases = [
            Destination::Ip("192.0.2.7:1".parse().unwrap()),
            Destination::Ip("[2001:db8::7]:65535".parse().unwrap()),
            Destination::domain("example.org", 443).unwrap(),
            Destination::domain(&"x".repeat(255), 80).unwrap(),
        ];
        for dst in cases {
            let mut wire = Vec::new();
            dst.encode(&mut wire).unwrap();
            assert_eq!(wire.len(), dst.encoded_len());
            for cut in 0..wire.len() {
                assert_eq!(
                    Destination::decode(&wire[..cut]),
                    Ok(None),
                    "{dst} cut {cut}"
                );
            }
            wire.push(0xAA); // trailing byte belongs to the caller
            assert_eq!(
                Destination::decode(&wire),
                Ok(Some((dst.clone(), wire.len() - 1)))
            );
        }
    }

    #[test]
    fn wire_errors() {
        assert_eq!(
            Destination::decode(&[0x02, 0, 0]),
            Err(AddrError::BadAddressType(2))
        );
        assert_eq!(
            Destination::decode(&[ATYP_DOMAIN, 0, 0, 80]),
            Err(AddrError::BadDomain)
        );
        // Fails as soon as the bad byte arrives, before the name is complete.
        assert_eq!(
            Destination::decode(&[ATYP_DOMAIN, 10, b'a', b' ']),
            Err(AddrError::BadDomain)
        );
        assert_eq!(
            decode_socket_addr(&[ATYP_DOMAIN, 1, b'a', 0, 80]),
            Err(AddrError::BadAddressType(ATYP_DOMAIN))
        );
        let invalid = Destination::Domain {
            host: "a b".into(),
            port: 1,
        };
        let mut out = Vec::new();
        assert_eq!(invalid.encode(&mut out), Err(AddrError::BadDomain));
        assert!(out.is_empty());
    }
}
