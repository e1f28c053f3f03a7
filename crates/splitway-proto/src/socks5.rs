//! SOCKS5 server side (RFC 1928): no-auth or username/password (RFC
//! 1929, in [`crate::proxy_auth`]) methods, CONNECT only.
//!
//! ```text
//! client → greeting {05, n, methods[n]}     server → method selection {05, method}
//! client → request {05, cmd, 00, atyp, addr, port}   server → reply {05, rep, 00, atyp, addr, port}
//! ```

use std::net::SocketAddr;

use crate::addr::{self, AddrError, Destination};
use crate::header::ReplyStatus;

pub const VERSION: u8 = 0x05;
pub const NO_AUTH: u8 = 0x00;
/// RFC 1929 username/password.
pub const USERPASS: u8 = 0x02;
pub const NO_ACCEPTABLE: u8 = 0xFF;
pub const CMD_CONNECT: u8 = 0x01;
pub const CMD_BIND: u8 = 0x02;
pub const CMD_UDP_ASSOCIATE: u8 = 0x03;

/// Largest greeting: version, count, 255 methods.
pub const MAX_GREETING_LEN: usize = 2 + 255;
/// Largest request: version, cmd, reserved, then a 255-byte domain destination.
pub const MAX_REQUEST_LEN: usize = 3 + addr::MAX_ENCODED_DESTINATION_LEN;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub methods: Vec<u8>,
}

impl Greeting {
    pub fn offers(&self, method: u8) -> bool {
        self.methods.contains(&method)
    }

    /// The method this server picks: [`NO_AUTH`] if offered, else [`NO_ACCEPTABLE`].
    pub fn select_method(&self) -> u8 {
        if self.offers(NO_AUTH) {
            NO_AUTH
        } else {
            NO_ACCEPTABLE
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Always [`CMD_CONNECT`] when parsed by [`parse_request`].
    pub command: u8,
    pub dst: Destination,
}

/// RFC 1928 reply codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplyCode {
    // RFC 1928's codes are 0 to 8 in this order: the discriminants.
    /// `X'00'` succeeded: the next leg is up.
    Succeeded,
    /// `X'01'` general SOCKS server failure.
    GeneralFailure,
    /// `X'02'` connection not allowed by ruleset (`[policy]`, limits).
    NotAllowed,
    /// `X'03'` Network unreachable.
    NetworkUnreachable,
    /// `X'04'` Host unreachable (also: the name did not resolve).
    HostUnreachable,
    /// `X'05'` Connection refused.
    ConnectionRefused,
    /// `X'06'` TTL expired (the hop limit ran out: a loop).
    TtlExpired,
    /// `X'07'` Command not supported (only CONNECT is).
    CommandNotSupported,
    /// `X'08'` Address type not supported.
    AddressTypeNotSupported,
}

/// A SOCKS5 client sent something this server cannot accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Socks5Error {
    #[error("SOCKS client: unsupported protocol version {0} (only SOCKS5)")]
    BadVersion(u8),
    #[error("SOCKS client: unsupported command {0:#04x} (only CONNECT)")]
    CommandNotSupported(u8),
    #[error("SOCKS client: unsupported address type {0:#04x}")]
    AddressTypeNotSupported(u8),
    #[error("SOCKS client: invalid destination domain name")]
    BadDomain,
}

impl Socks5Error {
    /// The reply to send before closing, if the client has reached the request
    /// stage and speaks SOCKS5 at all.
    pub fn reply_code(&self) -> Option<ReplyCode> {
        match self {
            Socks5Error::BadVersion(_) => None,
            Socks5Error::CommandNotSupported(_) => Some(ReplyCode::CommandNotSupported),
            Socks5Error::AddressTypeNotSupported(_) => Some(ReplyCode::AddressTypeNotSupported),
            Socks5Error::BadDomain => Some(ReplyCode::GeneralFailure),
        }
    }

    /// Bounded metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Socks5Error::BadVersion(_) => "bad_version",
            Socks5Error::CommandNotSupported(_) => "command_not_supported",
            Socks5Error::AddressTypeNotSupported(_) => "address_type_not_supported",
            Socks5Error::BadDomain => "bad_domain",
        }
    }
}

impl From<AddrError> for Socks5Error {
    fn from(err: AddrError) -> Socks5Error {
        match err {
            AddrError::BadAddressType(atyp) => Socks5Error::AddressTypeNotSupported(atyp),
            AddrError::BadDomain | AddrError::MissingPort | AddrError::BadPort => {
                Socks5Error::BadDomain
            }
        }
    }
}

/// Parses the method-negotiation greeting. An empty method list parses; the
/// caller then answers [`NO_ACCEPTABLE`].
pub fn parse_greeting(buf: &[u8]) -> Result<Option<(Greeting, usize)>, Socks5Error> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(Socks5Error::BadVersion(version));
    }
    let Some(&count) = buf.get(1) else {
        return Ok(None);
    };
    let total = 2 + usize::from(count);
    if buf.len() < total {
        return Ok(None);
    }
    let methods = buf[2..total].to_vec();
    Ok(Some((Greeting { methods }, total)))
}

pub fn method_selection(method: u8) -> [u8; 2] {
    [VERSION, method]
}

/// Parses a request. Anything but CONNECT fails as soon as the command byte
/// arrives. The reserved byte is ignored, as most servers do.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, Socks5Error> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(Socks5Error::BadVersion(version));
    }
    let Some(&command) = buf.get(1) else {
        return Ok(None);
    };
    if command != CMD_CONNECT {
        return Err(Socks5Error::CommandNotSupported(command));
    }
    if buf.len() < 3 {
        return Ok(None);
    }
    Ok(Destination::decode(&buf[3..])?.map(|(dst, used)| (Request { command, dst }, 3 + used)))
}

/// Encodes a reply. For failures the bound address is conventionally `0.0.0.0:0`.
pub fn encode_reply(code: ReplyCode, bound: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 + 19);
    out.extend_from_slice(&[VERSION, code as u8, 0x00]);
    addr::encode_socket_addr(&bound, &mut out);
    out
}

impl From<ReplyStatus> for ReplyCode {
    fn from(status: ReplyStatus) -> ReplyCode {
        match status {
            ReplyStatus::Ok => ReplyCode::Succeeded,
            ReplyStatus::Refused => ReplyCode::ConnectionRefused,
            ReplyStatus::Unreachable => ReplyCode::HostUnreachable,
            // RFC 1928 has no timeout code; host unreachable is what clients expect.
            ReplyStatus::Timeout => ReplyCode::HostUnreachable,
            ReplyStatus::NoRoute => ReplyCode::NetworkUnreachable,
            ReplyStatus::TtlExceeded => ReplyCode::TtlExpired,
            ReplyStatus::NotAllowed => ReplyCode::NotAllowed,
            ReplyStatus::BadHeader | ReplyStatus::Internal => ReplyCode::GeneralFailure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The discriminants are the wire codes of RFC 1928, section 6.
    #[test]
    fn reply_codes_are_rfc_1928s() {
        use ReplyCode::*;
        let codes = [
            Succeeded,
            GeneralFailure,
            NotAllowed,
            NetworkUnreachable,
            HostUnreachable,
            ConnectionRefused,
            TtlExpired,
            CommandNotSupported,
            AddressTypeNotSupported,
        ]
        .map(|c| c as u8);
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn greeting_round_trip_and_split() {
        let wire = [5, 2, 0x00, 0x02, 0xAA];
        for cut in 0..4 {
            assert_eq!(parse_greeting(&wire[..cut]), Ok(None));
        }
        let (greeting, used) = parse_greeting(&wire).unwrap().unwrap();
        assert_eq!(used, 4);
        assert_eq!(greeting.methods, [0x00, 0x02]);
        assert_eq!(greeting.select_method(), NO_AUTH);
        assert_eq!(method_selection(greeting.select_method()), [5, 0]);

        let (greeting, used) = parse_greeting(&[5, 1, 0x02]).unwrap().unwrap();
        assert_eq!(used, 3);
        assert_eq!(greeting.select_method(), NO_ACCEPTABLE);
        let (empty, used) = parse_greeting(&[5, 0]).unwrap().unwrap();
        assert_eq!((empty.methods.len(), used), (0, 2));
        assert_eq!(empty.select_method(), NO_ACCEPTABLE);

        let all: Vec<u8> = [5, 255].into_iter().chain(0..=254).collect();
        assert_eq!(all.len(), MAX_GREETING_LEN);
        assert_eq!(parse_greeting(&all).unwrap().unwrap().1, MAX_GREETING_LEN);
    }

    #[test]
    fn greeting_bad_version() {
        // SOCKS4 and HTTP clients on the SOCKS port fail on the first byte.
        assert_eq!(parse_greeting(&[4]), Err(Socks5Error::BadVersion(4)));
        let err = parse_greeting(b"CONNECT").unwrap_err();
        assert_eq!(err, Socks5Error::BadVersion(b'C'));
        assert_eq!(err.reply_code(), None);
    }

    #[test]
    fn request_every_address_type() {
        let cases: [(&[u8], Destination); 3] = [
            (
                &[5, 1, 0, 1, 192, 0, 2, 1, 0x01, 0xbb],
                Destination::Ip("192.0.2.1:443".parse().unwrap()),
            ),
            (
                &[
                    5, 1, 0, 4, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 80,
                ],
                Destination::Ip("[2001:db8::1]:80".parse().unwrap()),
            ),
            (
                b"\x05\x01\x00\x03\x0bexample.com\x00\x50",
                Destination::domain("example.com", 80).unwrap(),
            ),
        ];
        for (wire, dst) in cases {
            for cut in 0..wire.len() {
                assert_eq!(parse_request(&wire[..cut]), Ok(None), "cut {cut}");
            }
            let mut with_data = wire.to_vec();
            with_data.extend_from_slice(b"early client data");
            assert_eq!(
                parse_request(&with_data),
                Ok(Some((
                    Request {
                        command: CMD_CONNECT,
                        dst
                    },
                    wire.len()
                )))
            );
        }
    }

    #[test]
    fn request_errors_and_their_replies() {
        for cmd in [CMD_BIND, CMD_UDP_ASSOCIATE, 0, 9] {
            let err = parse_request(&[5, cmd]).unwrap_err();
            assert_eq!(err, Socks5Error::CommandNotSupported(cmd));
            assert_eq!(err.reply_code(), Some(ReplyCode::CommandNotSupported));
        }
        let err = parse_request(&[5, 1, 0, 2]).unwrap_err();
        assert_eq!(err, Socks5Error::AddressTypeNotSupported(2));
        assert_eq!(err.reply_code(), Some(ReplyCode::AddressTypeNotSupported));
        for bad in [
            &b"\x05\x01\x00\x03\x00\x00\x50"[..],
            b"\x05\x01\x00\x03\x03a@b\x00\x50",
            b"\x05\x01\x00\x03\x05a\0",
        ] {
            let err = parse_request(bad).unwrap_err();
            assert_eq!(err, Socks5Error::BadDomain);
            assert_eq!(err.reply_code(), Some(ReplyCode::GeneralFailure));
        }
        assert_eq!(parse_request(&[4, 1]), Err(Socks5Error::BadVersion(4)));
    }

    #[test]
    fn reply_encoding() {
        assert_eq!(
            encode_reply(ReplyCode::Succeeded, "10.1.2.3:4321".parse().unwrap()),
            [5, 0, 0, 1, 10, 1, 2, 3, 0x10, 0xe1]
        );
        let v6 = encode_reply(ReplyCode::HostUnreachable, "[::1]:1".parse().unwrap());
        assert_eq!(v6.len(), 3 + 1 + 16 + 2);
        assert_eq!(&v6[..4], [5, 4, 0, 4]);
        assert_eq!(v6[19], 1);
        assert_eq!(&v6[20..], [0, 1]);
    }

    #[test]
    fn status_mapping() {
        assert_eq!(ReplyCode::from(ReplyStatus::Ok), ReplyCode::Succeeded);
        assert_eq!(
            ReplyCode::from(ReplyStatus::Refused),
            ReplyCode::ConnectionRefused
        );
        assert_eq!(
            ReplyCode::from(ReplyStatus::NoRoute),
            ReplyCode::NetworkUnreachable
        );
        assert_eq!(
            ReplyCode::from(ReplyStatus::TtlExceeded),
            ReplyCode::TtlExpired
        );
        assert_eq!(
            ReplyCode::from(ReplyStatus::NotAllowed),
            ReplyCode::NotAllowed
        );
        for status in ReplyStatus::ALL {
            let code = ReplyCode::from(status);
            assert_eq!(code == ReplyCode::Succeeded, status == ReplyStatus::Ok);
        }
    }
}
