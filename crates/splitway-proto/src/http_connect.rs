//! HTTP/1.x proxy requests: `CONNECT host:port` tunnels (RFC 9110
//! §9.3.6) and absolute-form `http://` requests (RFC 9112 §3.2.2), as
//! `http_proxy=` clients send them.
//!
//! Only the request head is parsed; headers are checked for well-formedness.
//! A CONNECT's headers are ignored; an absolute-form request's head is
//! rewritten for the origin server (origin-form target, hop-by-hop headers
//! dropped, `Connection: close`: one request per connection). Lines may end
//! in CRLF or bare LF (RFC 9112 §2.2).

use crate::addr::{AddrError, Destination};
use crate::header::ReplyStatus;

/// Largest accepted request head, blank line included.
pub const MAX_REQUEST_HEAD: usize = 8192;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub dst: Destination,
    /// `None` for a CONNECT tunnel. For an absolute-form request, the head
    /// to send the server in its place.
    pub forward: Option<Vec<u8>>,
    /// The first `Proxy-Authorization` header's value, if any (never
    /// passed on to the server).
    pub proxy_authorization: Option<Vec<u8>>,
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
    #[error(
        "HTTP client: not a proxy request (the target must be an http:// URI, or CONNECT host:port)"
    )]
    NotProxyRequest,
    #[error("HTTP client: only http:// URIs are proxied as requests (https goes through CONNECT)")]
    UnsupportedScheme,
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
            | HttpConnectError::BadHeader
            | HttpConnectError::NotProxyRequest
            | HttpConnectError::UnsupportedScheme => 400,
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
            HttpConnectError::NotProxyRequest => "not_proxy_request",
            HttpConnectError::UnsupportedScheme => "unsupported_scheme",
        }
    }
}

/// Parses a proxy request head. `consumed` runs through the blank line;
/// anything after it is the client's data (tunnel bytes, or the request's
/// body).
///
/// Fails as soon as a complete line is invalid, without waiting for the rest.
pub fn parse_request(buf: &[u8]) -> Result<Option<(ConnectRequest, usize)>, HttpConnectError> {
    // The head must end within the limit, so never look beyond it.
    let window = &buf[..buf.len().min(MAX_REQUEST_HEAD)];
    let mut pos = 0;
    let mut target = None;
    let mut has_host = false;
    let mut proxy_authorization = None;
    while let Some(newline) = window[pos..].iter().position(|&b| b == b'\n') {
        let raw = &window[pos..pos + newline];
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        pos += newline + 1;
        match &mut target {
            // RFC 9112 §2.2: ignore empty lines before the request line.
            None if line.is_empty() => {}
            None => target = Some(parse_request_line(line)?),
            Some(_) if line.is_empty() => {
                let request = match target.take().expect("request line parsed") {
                    Target::Connect(dst) => ConnectRequest {
                        dst,
                        forward: None,
                        proxy_authorization,
                    },
                    Target::Absolute { dst, mut head } => {
                        if !has_host {
                            head.extend_from_slice(format!("Host: {}\r\n", dst).as_bytes());
                        }
                        head.extend_from_slice(b"Connection: close\r\n\r\n");
                        ConnectRequest {
                            dst,
                            forward: Some(head),
                            proxy_authorization,
                        }
                    }
                };
                return Ok(Some((request, pos)));
            }
            Some(Target::Connect(_)) => {
                let name = check_header_line(line)?;
                keep_proxy_authorization(&mut proxy_authorization, name, line);
            }
            Some(Target::Absolute { head, .. }) => {
                let name = check_header_line(line)?;
                keep_proxy_authorization(&mut proxy_authorization, name, line);
                has_host |= name.eq_ignore_ascii_case(b"host");
                if !is_hop_by_hop(name) {
                    head.extend_from_slice(line);
                    head.extend_from_slice(b"\r\n");
                }
            }
        }
    }
    if buf.len() >= MAX_REQUEST_HEAD {
        return Err(HttpConnectError::TooLarge);
    }
    Ok(None)
}

/// Keeps the first `Proxy-Authorization` value (`line` is `name:value`).
fn keep_proxy_authorization(kept: &mut Option<Vec<u8>>, name: &[u8], line: &[u8]) {
    if kept.is_none() && name.eq_ignore_ascii_case(b"proxy-authorization") {
        *kept = Some(line[name.len() + 1..].trim_ascii().to_vec());
    }
}

/// What a request line asks for.
enum Target {
    /// `CONNECT host:port`.
    Connect(Destination),
    /// `GET http://host[:port]/path`: the server, and the head being
    /// rewritten for it (request line so far).
    Absolute { dst: Destination, head: Vec<u8> },
}

/// Headers about this hop only (RFC 9110 §7.6.1), and the proxy's own
/// credentials: not passed on. `Connection: close` is added instead.
fn is_hop_by_hop(name: &[u8]) -> bool {
    [
        &b"connection"[..],
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authorization",
        b"te",
        b"upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// An absolute `http://` URI's destination (port 80 unless given) and its
/// origin-form path (`/` when empty).
fn parse_absolute(target: &str) -> Result<(Destination, String), HttpConnectError> {
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(HttpConnectError::NotProxyRequest);
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HttpConnectError::UnsupportedScheme);
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    // Credentials in the URI are not passed to anyone.
    if authority.is_empty() || authority.contains('@') {
        return Err(HttpConnectError::BadHost);
    }
    // The fragment is the client's alone (RFC 9110 §4.2.4).
    let path = path.split('#').next().unwrap_or("");
    let path = match path.strip_prefix('?') {
        Some(_) => format!("/{path}"),
        None if path.is_empty() => "/".to_owned(),
        None => path.to_owned(),
    };
    let has_port = match authority.rfind(':') {
        Some(colon) => !authority[colon..].contains(']'),
        None => false,
    };
    let authority = if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Ok((parse_authority(&authority)?, path))
}

fn parse_authority(authority: &str) -> Result<Destination, HttpConnectError> {
    Destination::parse_authority(authority).map_err(|err| match err {
        AddrError::MissingPort => HttpConnectError::MissingPort,
        AddrError::BadPort => HttpConnectError::BadPort,
        AddrError::BadDomain | AddrError::BadAddressType(_) => HttpConnectError::BadHost,
    })
}

fn parse_request_line(line: &[u8]) -> Result<Target, HttpConnectError> {
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
    if method == "CONNECT" {
        return parse_authority(target).map(Target::Connect);
    }
    let (dst, path) = parse_absolute(target)?;
    let head = format!("{method} {path} {version}\r\n").into_bytes();
    Ok(Target::Absolute { dst, head })
}

/// `name: value` with a token name and no control bytes besides tab in the value;
/// the name. Obsolete line folding (a line starting with whitespace) is
/// refused, as RFC 9112 allows.
fn check_header_line(line: &[u8]) -> Result<&[u8], HttpConnectError> {
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
        Ok(name)
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

/// An error response whose body says why, in a line: what `curl -v` or a
/// browser shows the user.
pub fn error_response(status: u16, why: &str) -> Vec<u8> {
    error_response_with(status, "", why)
}

/// [`error_response`] with `headers` (whole lines, CRLF-terminated) after
/// the status line.
pub fn error_response_with(status: u16, headers: &str, why: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\n{headers}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{why}\n",
        reason_phrase(status),
        why.len() + 1
    )
    .into_bytes()
}

/// Why the relay chain could not reach the destination, for a client.
pub fn reason_for(status: ReplyStatus) -> &'static str {
    match status {
        ReplyStatus::Ok => "connected",
        ReplyStatus::Refused => "splitway: the destination refused the connection",
        ReplyStatus::Unreachable => "splitway: the destination is unreachable",
        ReplyStatus::Timeout => "splitway: timed out connecting to the destination",
        ReplyStatus::NoRoute => "splitway: no route to the destination",
        ReplyStatus::TtlExceeded => "splitway: relay loop (hop limit exceeded)",
        ReplyStatus::NotAllowed => "splitway: the destination is not allowed by the relay's policy",
        ReplyStatus::BadHeader => "splitway: bad request between relays",
        ReplyStatus::Internal => "splitway: relay failure",
    }
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
        let cases: [(&[u8], HttpConnectError, u16); 18] = [
            (
                b"GET / HTTP/1.1\r\n",
                HttpConnectError::NotProxyRequest,
                400,
            ),
            (
                b"connect h:1 HTTP/1.1\r\n",
                HttpConnectError::NotProxyRequest,
                400,
            ),
            (
                b"GET https://example.com/ HTTP/1.1\r\n",
                HttpConnectError::UnsupportedScheme,
                400,
            ),
            (
                b"GET http://user@example.com/ HTTP/1.1\r\n",
                HttpConnectError::BadHost,
                400,
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
    fn absolute_form_requests_are_rewritten_for_the_origin() {
        let head = b"GET http://example.com/a/b?q=1#frag HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\nUser-Agent: t\r\nProxy-Authorization: Basic eA==\r\nconnection: Keep-Alive\r\n\r\nBODY";
        let (req, n) = parse_request(head).unwrap().unwrap();
        assert_eq!(req.dst.to_string(), "example.com:80");
        assert_eq!(&head[n..], b"BODY");
        assert_eq!(
            String::from_utf8(req.forward.unwrap()).unwrap(),
            "GET /a/b?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(req.proxy_authorization.as_deref(), Some(&b"Basic eA=="[..]));
        // No Host header, a port, an IPv6 literal, a query without a path.
        let (req, _) = parse_request(b"HEAD http://[2001:db8::1]:8080?x HTTP/1.0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(req.dst.to_string(), "[2001:db8::1]:8080");
        assert_eq!(
            String::from_utf8(req.forward.unwrap()).unwrap(),
            "HEAD /?x HTTP/1.0\r\nHost: [2001:db8::1]:8080\r\nConnection: close\r\n\r\n"
        );
        let (req, _) = parse_request(b"POST HTTP://10.0.0.1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(req.dst.to_string(), "10.0.0.1:80");
        assert!(req.forward.unwrap().starts_with(b"POST / HTTP/1.1\r\n"));
        let (req, _) = parse_request(b"CONNECT h:1 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(req.forward, None, "a tunnel forwards nothing of its head");
        assert_eq!(req.proxy_authorization, None);
    }

    #[test]
    fn error_responses_say_why() {
        let text =
            String::from_utf8(error_response(403, reason_for(ReplyStatus::NotAllowed))).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert_eq!(
            body,
            "splitway: the destination is not allowed by the relay's policy\n"
        );
        for status in ReplyStatus::ALL {
            assert!(!reason_for(status).is_empty());
        }
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
