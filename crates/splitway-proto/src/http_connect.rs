//! HTTP/1.x `CONNECT host:port` proxy requests (RFC 9110 §9.3.6, RFC 9112).
//!
//! Only the request head is parsed; headers are checked for well-formedness
//! and otherwise ignored. Lines may end in CRLF or bare LF (RFC 9112 §2.2).

use crate::addr::{AddrError, Destination};
use crate::header::ReplyStatus;

/// Largest accepted request head, blank line included.
pub const MAX_REQUEST_HEAD: usize = 8192;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub dst: Destination,
}

/// An HTTP client sent a request this proxy cannot accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HttpConnectError {
    #[error("HTTP client: request head exceeds {MAX_REQUEST_HEAD} bytes")]
    TooLarge,
    #[error("HTTP client: method is not CONNECT")]
    MethodNotAllowed,
    #[error("HTTP client: malformed request line")]
    BadRequestLine,
    #[error("HTTP client: unsupported HTTP version (only HTTP/1.0 and HTTP/1.1)")]
    UnsupportedVersion,
    #[error("HTTP client: CONNECT target has no port")]
    MissingPort,
    #[error("HTTP client: CONNECT target has an invalid port")]
    BadPort,
    #[error("HTTP client: CONNECT target has an invalid host")]
    BadHost,
    #[error("HTTP client: malformed header line")]
    BadHeader,
}

impl HttpConnectError {
    /// Status code of the response to send before closing.
    pub fn status(&self) -> u16 {
        match self {
            HttpConnectError::TooLarge => 431,
            HttpConnectError::MethodNotAllowed => 405,
            HttpConnectError::UnsupportedVersion => 505,
            HttpConnectError::BadRequestLine
            | HttpConnectError::MissingPort
            | HttpConnectError::BadPort
            | HttpConnectError::BadHost
            | HttpConnectError::BadHeader => 400,
        }
    }

    /// Bounded metric label.
    pub fn label(&self) -> &'static str {
        match self {
            HttpConnectError::TooLarge => "too_large",
            HttpConnectError::MethodNotAllowed => "method_not_allowed",
            HttpConnectError::BadRequestLine => "bad_request_line",
            HttpConnectError::UnsupportedVersion => "unsupported_version",
            HttpConnectError::MissingPort => "missing_port",
            HttpConnectError::BadPort => "bad_port",
            HttpConnectError::BadHost => "bad_host",
            HttpConnectError::BadHeader => "bad_header",
        }
    }
}

/// Parses a CONNECT request head. `consumed` runs through the blank line;
/// anything after it is tunnel data from the client.
///
/// Fails as soon as a complete line is invalid, without waiting for the rest.
pub fn parse_request(buf: &[u8]) -> Result<Option<(ConnectRequest, usize)>, HttpConnectError> {
    // The head must end within the limit, so never look beyond it.
    let window = &buf[..buf.len().min(MAX_REQUEST_HEAD)];
    let mut pos = 0;
    let mut dst = None;
    while let Some(newline) = window[pos..].iter().position(|&b| b == b'\n') {
        let raw = &window[pos..pos + newline];
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        pos += newline + 1;
        match &dst {
            // RFC 9112 §2.2: ignore empty lines before the request line.
            None if line.is_empty() => {}
            None => dst = Some(parse_request_line(line)?),
            Some(_) if line.is_empty() => {
                let dst = dst.expect("request line parsed");
                return Ok(Some((ConnectRequest { dst }, pos)));
            }
            Some(_) => check_header_line(line)?,
        }
    }
    if buf.len() >= MAX_REQUEST_HEAD {
        return Err(HttpConnectError::TooLarge);
    }
    Ok(None)
}

fn parse_request_line(line: &[u8]) -> Result<Destination, HttpConnectError> {
    if !line.iter().all(|&b| b == b' ' || b.is_ascii_graphic()) {
        return Err(HttpConnectError::BadRequestLine);
    }
    // Checked above: all ASCII.
    let line = std::str::from_utf8(line).map_err(|_| HttpConnectError::BadRequestLine)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpConnectError::BadRequestLine);
    };
    if method.is_empty() || !method.bytes().all(is_tchar) || target.is_empty() {
        return Err(HttpConnectError::BadRequestLine);
    }
    match version.as_bytes() {
        b"HTTP/1.1" | b"HTTP/1.0" => {}
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            return Err(HttpConnectError::UnsupportedVersion);
        }
        _ => return Err(HttpConnectError::BadRequestLine),
    }
    if method != "CONNECT" {
        return Err(HttpConnectError::MethodNotAllowed);
    }
    Destination::parse_authority(target).map_err(|err| match err {
        AddrError::MissingPort => HttpConnectError::MissingPort,
        AddrError::BadPort => HttpConnectError::BadPort,
        AddrError::BadDomain | AddrError::BadAddressType(_) => HttpConnectError::BadHost,
    })
}

/// `name: value` with a token name and no control bytes besides tab in the value.
/// Obsolete line folding (a line starting with whitespace) is refused, as RFC 9112 allows.
fn check_header_line(line: &[u8]) -> Result<(), HttpConnectError> {
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(HttpConnectError::BadHeader)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let name_ok = !name.is_empty() && name.iter().copied().all(is_tchar);
    let value_ok = value
        .iter()
        .all(|&b| b == b'\t' || b == b' ' || b.is_ascii_graphic() || b >= 0x80);
    if name_ok && value_ok {
        Ok(())
    } else {
        Err(HttpConnectError::BadHeader)
    }
}

/// RFC 9110 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A complete response head. 200 is the tunnel's "Connection established";
/// every other status carries `Content-Length: 0` and `Connection: close`.
pub fn response(status: u16) -> Vec<u8> {
    if status == 200 {
        return b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec();
    }
    let allow = if status == 405 {
        "Allow: CONNECT\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status} {}\r\n{allow}Content-Length: 0\r\nConnection: close\r\n\r\n",
        reason_phrase(status)
    )
    .into_bytes()
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "Connection established",
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// Status to answer the client with once the relay chain reports `status`.
pub fn status_for(status: ReplyStatus) -> u16 {
    match status {
        ReplyStatus::Ok => 200,
        ReplyStatus::Timeout => 504,
        ReplyStatus::NotAllowed => 403,
        ReplyStatus::Refused
        | ReplyStatus::Unreachable
        | ReplyStatus::NoRoute
        | ReplyStatus::TtlExceeded
        | ReplyStatus::BadHeader
        | ReplyStatus::Internal => 502,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dst_of(head: &[u8]) -> Destination {
        let (req, used) = parse_request(head).unwrap().unwrap();
        assert_eq!(used, head.len());
        req.dst
    }

    #[test]
    fn accepts_domains_ipv4_ipv6_and_both_versions() {
        assert_eq!(
            dst_of(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"),
            Destination::domain("example.com", 443).unwrap()
        );
        assert_eq!(
            dst_of(b"CONNECT 192.0.2.9:22 HTTP/1.0\r\n\r\n"),
            Destination::Ip("192.0.2.9:22".parse().unwrap())
        );
        assert_eq!(
            dst_of(b"CONNECT [::1]:443 HTTP/1.1\r\nUser-Agent: curl/8.5.0\r\nProxy-Connection: Keep-Alive\r\n\r\n"),
            Destination::Ip("[::1]:443".parse().unwrap())
        );
        // Bare LF line endings and leading empty lines.
        assert_eq!(
            dst_of(b"\r\n\nCONNECT h:1 HTTP/1.1\nX-A:\t v\xc3\xa9 \n\n"),
            Destination::domain("h", 1).unwrap()
        );
    }

    #[test]
    fn leaves_tunnel_data_to_the_caller() {
        let head = b"CONNECT example.com:443 HTTP/1.1\r\n\r\n";
        let mut buf = head.to_vec();
        buf.extend_from_slice(b"\x16\x03\x01 TLS client hello");
        let (_, used) = parse_request(&buf).unwrap().unwrap();
        assert_eq!(used, head.len());
    }

    #[test]
    fn every_split_needs_more() {
        let head = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n";
        for cut in 0..head.len() {
            assert_eq!(parse_request(&head[..cut]), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn size_limit() {
        let start = b"CONNECT example.com:443 HTTP/1.1\r\n";
        let end = b"\r\n";
        let filler = |len: usize| {
            let mut line = b"X-Pad: ".to_vec();
            line.resize(len - 2, b'a');
            line.extend_from_slice(b"\r\n");
            line
        };
        // Exactly at the limit: accepted.
        let mut head = start.to_vec();
        head.extend(filler(MAX_REQUEST_HEAD - start.len() - end.len()));
        head.extend_from_slice(end);
        assert_eq!(head.len(), MAX_REQUEST_HEAD);
        assert_eq!(parse_request(&head).unwrap().unwrap().1, MAX_REQUEST_HEAD);
        // One byte over: refused once the limit is reached, not before.
        let mut head = start.to_vec();
        head.extend(filler(MAX_REQUEST_HEAD + 1 - start.len() - end.len()));
        head.extend_from_slice(end);
        assert_eq!(parse_request(&head[..MAX_REQUEST_HEAD - 1]), Ok(None));
        let err = parse_request(&head).unwrap_err();
        assert_eq!(err, HttpConnectError::TooLarge);
        assert_eq!(err.status(), 431);
        // A client that never sends a newline.
        assert_eq!(
            parse_request(&vec![b'A'; MAX_REQUEST_HEAD]),
            Err(HttpConnectError::TooLarge)
        );
    }

    #[test]
    fn errors_and_statuses() {
        let cases: [(&[u8], HttpConnectError, u16); 16] = [
            (
                b"GET http://example.com/ HTTP/1.1\r\n",
                HttpConnectError::MethodNotAllowed,
                405,
            ),
            (
                b"connect h:1 HTTP/1.1\r\n",
                HttpConnectError::MethodNotAllowed,
                405,
            ),
            (
                b"CONNECT h:1 HTTP/2.0\r\n",
                HttpConnectError::UnsupportedVersion,
                505,
            ),
            (
                b"CONNECT h:1 HTTX/1.1\r\n",
                HttpConnectError::BadRequestLine,
                400,
            ),
            (b"CONNECT h:1\r\n", HttpConnectError::BadRequestLine, 400),
            (
                b"CONNECT  h:1 HTTP/1.1\r\n",
                HttpConnectError::BadRequestLine,
                400,
            ),
            (
                b"CONNECT h:1 HTTP/1.1 x\r\n",
                HttpConnectError::BadRequestLine,
                400,
            ),
            (
                b"CONNECT\th:1 HTTP/1.1\r\n",
                HttpConnectError::BadRequestLine,
                400,
            ),
            (
                b"CONNECT h:1 HTTP/1.1\r\r\n",
                HttpConnectError::BadRequestLine,
                400,
            ),
            (
                b"CONNECT example.com HTTP/1.1\r\n",
                HttpConnectError::MissingPort,
                400,
            ),
            (
                b"CONNECT example.com:99999 HTTP/1.1\r\n",
                HttpConnectError::BadPort,
                400,
            ),
            (
                b"CONNECT exa_mple.com:1 HTTP/1.1\r\n",
                HttpConnectError::BadHost,
                400,
            ),
            (
                b"CONNECT user@h:1 HTTP/1.1\r\n",
                HttpConnectError::BadHost,
                400,
            ),
            (
                b"CONNECT h:1 HTTP/1.1\r\nNoColon\r\n",
                HttpConnectError::BadHeader,
                400,
            ),
            (
                b"CONNECT h:1 HTTP/1.1\r\nA: b\r\n folded\r\n",
                HttpConnectError::BadHeader,
                400,
            ),
            (
                b"CONNECT h:1 HTTP/1.1\r\nBad Name: v\r\n",
                HttpConnectError::BadHeader,
                400,
            ),
        ];
        for (head, expected, status) in cases {
            let text = String::from_utf8_lossy(head);
            assert_eq!(parse_request(head), Err(expected), "{text}");
            assert_eq!(expected.status(), status, "{text}");
            // The request line / header alone decides: no blank line needed.
            let mut more = head.to_vec();
            more.extend_from_slice(b"\r\n");
            assert_eq!(parse_request(&more), Err(expected), "{text}");
        }
        assert_eq!(
            parse_request(b"CONNECT h:1 HTTP/1.1\r\nX: a\x01b\r\n\r\n"),
            Err(HttpConnectError::BadHeader)
        );
    }

    #[test]
    fn responses() {
        assert_eq!(
            response(200),
            b"HTTP/1.1 200 Connection established\r\n\r\n"
        );
        assert_eq!(
            response(502),
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let not_allowed = String::from_utf8(response(405)).unwrap();
        assert!(not_allowed.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(not_allowed.contains("\r\nAllow: CONNECT\r\n"));
        for status in [400, 403, 431, 504, 505, 599] {
            let text = String::from_utf8(response(status)).unwrap();
            assert!(text.starts_with(&format!("HTTP/1.1 {status} ")), "{text}");
            assert!(text.contains("\r\nContent-Length: 0\r\n"), "{text}");
            assert!(text.ends_with("\r\n\r\n"), "{text}");
        }
    }

    #[test]
    fn relay_status_mapping() {
        assert_eq!(status_for(ReplyStatus::Ok), 200);
        assert_eq!(status_for(ReplyStatus::Refused), 502);
        assert_eq!(status_for(ReplyStatus::Unreachable), 502);
        assert_eq!(status_for(ReplyStatus::NoRoute), 502);
        assert_eq!(status_for(ReplyStatus::Timeout), 504);
        assert_eq!(status_for(ReplyStatus::NotAllowed), 403);
        for status in ReplyStatus::ALL {
            let code = status_for(status);
            assert_eq!(code == 200, status == ReplyStatus::Ok);
            assert!(response(code).starts_with(format!("HTTP/1.1 {code} ").as_bytes()));
        }
    }
}
