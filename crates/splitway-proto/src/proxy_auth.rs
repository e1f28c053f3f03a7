//! Proxy clients' credentials: SOCKS5 username/password (RFC 1929) and
//! HTTP `Proxy-Authorization: Basic` (RFC 7617). Parsing and answers only;
//! checking them against a user list is the relay's.
//!
//! ```text
//! SOCKS5, after method 02 was selected:
//! client → {01, ulen, user[ulen], plen, password[plen]}   server → {01, status}
//! HTTP:
//! Proxy-Authorization: Basic base64(user ":" password)
//! ```

use std::fmt;

use base64::Engine;

/// RFC 1929's subnegotiation version.
pub const USERPASS_VERSION: u8 = 0x01;
/// The longest user name or password either protocol carries here: RFC
/// 1929's one-byte lengths.
pub const MAX_FIELD: usize = 255;
/// Largest subnegotiation: version, two lengths, two 255-byte fields.
pub const MAX_USERPASS_LEN: usize = 3 + 2 * MAX_FIELD;

/// A user name and password as a client sent them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: Vec<u8>,
    pub password: Vec<u8>,
}

impl Credentials {
    /// The user name for logs: lossy UTF-8, control bytes escaped, cut at
    /// 64 characters (a client chose it).
    pub fn user_for_log(&self) -> String {
        let user = String::from_utf8_lossy(&self.user);
        let mut shown: String = user.chars().take(64).flat_map(char::escape_debug).collect();
        if user.chars().count() > 64 {
            shown.push('…');
        }
        shown
    }
}

/// Never prints the password.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &format_args!("\"{}\"", self.user_for_log()))
            .field("password", &"(hidden)")
            .finish()
    }
}

/// A proxy client's credentials could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyAuthError {
    #[error("SOCKS client: username/password subnegotiation version {0} (only 1)")]
    BadVersion(u8),
    #[error("HTTP client: Proxy-Authorization is not Basic")]
    NotBasic,
    #[error("HTTP client: Proxy-Authorization Basic is not base64 of user:password")]
    BadBasic,
}

/// Parses RFC 1929's username/password request. Zero-length fields parse
/// (they then fail the check, not the protocol).
pub fn parse_userpass(buf: &[u8]) -> Result<Option<(Credentials, usize)>, ProxyAuthError> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != USERPASS_VERSION {
        return Err(ProxyAuthError::BadVersion(version));
    }
    let Some(&ulen) = buf.get(1) else {
        return Ok(None);
    };
    let user_end = 2 + usize::from(ulen);
    let Some(&plen) = buf.get(user_end) else {
        return Ok(None);
    };
    let end = user_end + 1 + usize::from(plen);
    if buf.len() < end {
        return Ok(None);
    }
    let credentials = Credentials {
        user: buf[2..user_end].to_vec(),
        password: buf[user_end + 1..end].to_vec(),
    };
    Ok(Some((credentials, end)))
}

/// RFC 1929's answer: status 0 accepts; anything else refuses, and the
/// client must then close.
pub fn userpass_status(accepted: bool) -> [u8; 2] {
    [USERPASS_VERSION, if accepted { 0x00 } else { 0x01 }]
}

/// A `Proxy-Authorization` value: `Basic` (any case), then base64 of
/// `user:password`, split at the first colon (RFC 7617 §2).
pub fn parse_basic(value: &[u8]) -> Result<Credentials, ProxyAuthError> {
    let value = value.trim_ascii();
    let (scheme, token) = match value.iter().position(|&b| b == b' ') {
        Some(space) => (&value[..space], value[space..].trim_ascii()),
        None => (value, &b""[..]),
    };
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Err(ProxyAuthError::NotBasic);
    }
    // 4/3 of the two fields and their colon: anything longer is not ours.
    if token.len() > 4 * (2 * MAX_FIELD + 1).div_ceil(3) {
        return Err(ProxyAuthError::BadBasic);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| ProxyAuthError::BadBasic)?;
    let colon = decoded
        .iter()
        .position(|&b| b == b':')
        .ok_or(ProxyAuthError::BadBasic)?;
    let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
    if user.len() > MAX_FIELD || password.len() > MAX_FIELD {
        return Err(ProxyAuthError::BadBasic);
    }
    Ok(Credentials {
        user: user.to_vec(),
        password: password.to_vec(),
    })
}

/// The 407 that asks an HTTP proxy client for credentials (RFC 9110
/// §15.5.8), its body saying why in a line.
pub fn proxy_auth_required(realm: &str, why: &str) -> Vec<u8> {
    let challenge = format!("Proxy-Authenticate: Basic realm=\"{realm}\", charset=\"UTF-8\"\r\n");
    crate::http_connect::error_response_with(407, &challenge, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(user: &str, password: &str) -> Credentials {
        Credentials {
            user: user.into(),
            password: password.into(),
        }
    }

    #[test]
    fn userpass_round_trip_and_split() {
        let wire = b"\x01\x05alice\x06s3cret";
        for cut in 0..wire.len() {
            assert_eq!(parse_userpass(&wire[..cut]), Ok(None), "cut {cut}");
        }
        let mut with_more = wire.to_vec();
        with_more.extend_from_slice(b"\x05\x01");
        assert_eq!(
            parse_userpass(&with_more),
            Ok(Some((creds("alice", "s3cret"), wire.len())))
        );
        assert_eq!(
            parse_userpass(b"\x01\x00\x00"),
            Ok(Some((creds("", ""), 3)))
        );
        let longest: Vec<u8> = [1, 255]
            .into_iter()
            .chain([b'u'; 255])
            .chain([255])
            .chain([b'p'; 255])
            .collect();
        assert_eq!(longest.len(), MAX_USERPASS_LEN);
        assert_eq!(
            parse_userpass(&longest).unwrap().unwrap().1,
            MAX_USERPASS_LEN
        );
    }

    #[test]
    fn userpass_bad_version_fails_at_once() {
        // A client that skipped the subnegotiation sends its request (05).
        assert_eq!(parse_userpass(&[5]), Err(ProxyAuthError::BadVersion(5)));
        assert_eq!(userpass_status(true), [1, 0]);
        assert_eq!(userpass_status(false), [1, 1]);
    }

    #[test]
    fn basic_as_curl_sends_it() {
        // curl --proxy-user alice:s3cret:x
        let parsed = parse_basic(b"Basic YWxpY2U6czNjcmV0Ong=").unwrap();
        assert_eq!(parsed, creds("alice", "s3cret:x"));
        assert_eq!(
            parse_basic(b"  bAsIc   YWxpY2U6  ").unwrap(),
            creds("alice", "")
        );
    }

    #[test]
    fn basic_refusals() {
        assert_eq!(parse_basic(b"Bearer abc"), Err(ProxyAuthError::NotBasic));
        assert_eq!(parse_basic(b""), Err(ProxyAuthError::NotBasic));
        assert_eq!(parse_basic(b"Basic"), Err(ProxyAuthError::BadBasic));
        assert_eq!(parse_basic(b"Basic !!!!"), Err(ProxyAuthError::BadBasic));
        // base64 of "nocolon".
        assert_eq!(
            parse_basic(b"Basic bm9jb2xvbg=="),
            Err(ProxyAuthError::BadBasic)
        );
        let long = base64::engine::general_purpose::STANDARD.encode([b'a'; 300]);
        assert_eq!(
            parse_basic(format!("Basic {long}").as_bytes()),
            Err(ProxyAuthError::BadBasic)
        );
    }

    #[test]
    fn debug_hides_the_password() {
        let shown = format!("{:?}", creds("al\nice", "s3cret"));
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("al\\nice"), "{shown}");
    }

    #[test]
    fn the_407_asks_for_basic() {
        let r = String::from_utf8(proxy_auth_required("splitway", "no credentials")).unwrap();
        assert!(r.starts_with("HTTP/1.1 407 "));
        assert!(r.contains("\r\nProxy-Authenticate: Basic realm=\"splitway\""));
        assert!(r.ends_with("\r\n\r\nno credentials\n"));
        assert!(r.contains("Content-Length: 15\r\n"));
    }

    #[test]
    fn the_first_proxy_authorization_is_kept() {
        let head = b"CONNECT h:1 HTTP/1.1\r\nproxy-authorization:  Basic YTpi \r\nProxy-Authorization: Basic other\r\n\r\n";
        let (req, _) = crate::http_connect::parse_request(head).unwrap().unwrap();
        assert_eq!(req.proxy_authorization.as_deref(), Some(&b"Basic YTpi"[..]));
        let basic = parse_basic(&req.proxy_authorization.unwrap()).unwrap();
        assert_eq!(
            (&basic.user[..], &basic.password[..]),
            (&b"a"[..], &b"b"[..])
        );
    }
}
