//! Just enough HTTP/1.x for the admin API: one request per connection,
//! bounded head and body, `Content-Length` bodies only, `Connection: close`.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Size limits applied while reading a request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Request line plus headers plus the blank line.
    pub(crate) max_head_bytes: usize,
    /// `Content-Length` ceiling.
    pub(crate) max_body_bytes: usize,
}

/// A parsed request. The body is read so that later `PUT` routes can use it.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// Origin-form target without the query string.
    pub(crate) path: String,
    /// Query string (after `?`), if any.
    pub(crate) query: Option<String>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    /// First value of header `name` (case-insensitive).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// Why a client's request could not be read. All of these are the client's
/// doing; the server answers (where it still can) and closes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("admin client closed the connection without sending a request")]
    ClosedBeforeRequest,
    #[error("admin client closed the connection in the middle of its request")]
    Truncated,
    #[error("admin client sent a request head larger than {limit} bytes")]
    HeadTooLarge { limit: usize },
    #[error("admin client sent a body larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("admin client sent a malformed request: {0}")]
    Malformed(&'static str),
    #[error("admin client used Transfer-Encoding, which is not supported")]
    TransferEncoding,
    #[error("reading from the admin client failed")]
    Io(#[from] io::Error),
}

impl RequestError {
    /// The status to answer with, or `None` when nobody is left to answer.
    pub(crate) fn status(&self) -> Option<Status> {
        match self {
            RequestError::ClosedBeforeRequest | RequestError::Io(_) => None,
            RequestError::Truncated | RequestError::Malformed(_) => Some(Status::BadRequest),
            RequestError::HeadTooLarge { .. } => Some(Status::HeaderFieldsTooLarge),
            RequestError::BodyTooLarge { .. } => Some(Status::ContentTooLarge),
            RequestError::TransferEncoding => Some(Status::NotImplemented),
        }
    }
}

/// Response statuses the admin API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    BadRequest,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    Conflict,
    ContentTooLarge,
    UnprocessableContent,
    HeaderFieldsTooLarge,
    InternalServerError,
    NotImplemented,
}

impl Status {
    pub(crate) fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::BadRequest => 400,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::RequestTimeout => 408,
            Status::Conflict => 409,
            Status::UnprocessableContent => 422,
            Status::ContentTooLarge => 413,
            Status::HeaderFieldsTooLarge => 431,
            Status::InternalServerError => 500,
            Status::NotImplemented => 501,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BadRequest => "Bad Request",
            Status::Forbidden => "Forbidden",
            Status::NotFound => "Not Found",
            Status::MethodNotAllowed => "Method Not Allowed",
            Status::RequestTimeout => "Request Timeout",
            Status::Conflict => "Conflict",
            Status::UnprocessableContent => "Unprocessable Content",
            Status::ContentTooLarge => "Content Too Large",
            Status::HeaderFieldsTooLarge => "Request Header Fields Too Large",
            Status::InternalServerError => "Internal Server Error",
            Status::NotImplemented => "Not Implemented",
        }
    }
}

pub(crate) const JSON_CONTENT_TYPE: &str = "application/json";

/// A complete response; always sent with `Connection: close`.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: Status,
    pub(crate) content_type: &'static str,
    pub(crate) extra_headers: Vec<(&'static str, &'static str)>,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn new(status: Status, content_type: &'static str, body: Vec<u8>) -> Self {
        Self {
            status,
            content_type,
            extra_headers: Vec::new(),
            body,
        }
    }

    pub(crate) fn json(status: Status, value: &impl serde::Serialize) -> Self {
        match serde_json::to_vec(value) {
            Ok(mut body) => {
                body.push(b'\n');
                Self::new(status, JSON_CONTENT_TYPE, body)
            }
            // Only a map with non-string keys fails: a bug in the answer's type.
            Err(error) => {
                tracing::error!(%error, "admin API: answer does not serialise to JSON");
                let body = format!("answer does not serialise to JSON: {error}\n");
                Self::new(Status::InternalServerError, "text/plain", body.into_bytes())
            }
        }
    }

    /// `{"error": message, "status": code}`.
    pub(crate) fn error(status: Status, message: &str) -> Self {
        Self::errors(status, message.to_owned(), None)
    }

    /// An error answer, with one entry per problem when there are several.
    pub(crate) fn errors(
        status: Status,
        error: String,
        errors: Option<Vec<splitway_api::ErrorDetail>>,
    ) -> Self {
        Self::json(
            status,
            &splitway_api::ErrorBody {
                error,
                status: status.code(),
                errors,
            },
        )
    }

    pub(crate) fn with_header(mut self, name: &'static str, value: &'static str) -> Self {
        self.extra_headers.push((name, value));
        self
    }

    /// Serialises the response; `head_only` (for `HEAD`) keeps the
    /// `Content-Length` of the full body but omits the body.
    pub(crate) fn to_bytes(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n",
            self.status.code(),
            self.status.reason(),
            self.content_type,
            self.body.len(),
        )
        .into_bytes();
        for (name, value) in &self.extra_headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

/// Writes `response` in full.
pub(crate) async fn write_response<W: AsyncWrite + Unpin>(
    writer: &mut W,
    response: &Response,
    head_only: bool,
) -> io::Result<()> {
    writer.write_all(&response.to_bytes(head_only)).await?;
    writer.flush().await
}

/// Reads one request: head up to `limits.max_head_bytes`, then a
/// `Content-Length` body up to `limits.max_body_bytes`. The caller bounds the
/// total time.
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    limits: Limits,
) -> Result<Request, RequestError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let mut scanned = 0;
    let head_len = loop {
        if let Some(end) = find_head_end(&buf, scanned) {
            break end;
        }
        // The terminator may straddle reads; rescan its possible start.
        scanned = buf.len().saturating_sub(3);
        let room = limits.max_head_bytes.saturating_sub(buf.len());
        if room == 0 {
            return Err(RequestError::HeadTooLarge {
                limit: limits.max_head_bytes,
            });
        }
        let want = room.min(chunk.len());
        let n = reader.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(if buf.is_empty() {
                RequestError::ClosedBeforeRequest
            } else {
                RequestError::Truncated
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    };

    let mut request = parse_head(&buf[..head_len])?;
    let content_length = content_length(&request.headers)?;
    if content_length > limits.max_body_bytes {
        return Err(RequestError::BodyTooLarge {
            limit: limits.max_body_bytes,
        });
    }
    // Bytes after the head that arrived with it belong to the body; anything
    // past Content-Length is ignored (one request per connection).
    let mut body = buf.split_off(head_len);
    body.truncate(content_length);
    let already = body.len();
    body.resize(content_length, 0);
    match reader.read_exact(&mut body[already..]).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(RequestError::Truncated);
        }
        Err(error) => return Err(RequestError::Io(error)),
    }
    request.body = body;
    Ok(request)
}

/// End (exclusive) of the head: after the first empty line. Bare `\n` line
/// endings are accepted as RFC 9112 allows.
fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    (from..buf.len()).find_map(|i| {
        if buf[i] != b'\n' {
            return None;
        }
        match buf.get(i + 1..) {
            Some([b'\n', ..]) => Some(i + 2),
            Some([b'\r', b'\n', ..]) => Some(i + 3),
            _ => None,
        }
    })
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn parse_head(head: &[u8]) -> Result<Request, RequestError> {
    let head = std::str::from_utf8(head)
        .map_err(|_| RequestError::Malformed("request head is not UTF-8"))?;
    let mut lines = head
        .split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line));

    let request_line = lines
        .next()
        .ok_or(RequestError::Malformed("missing request line"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::Malformed(
            "request line is not `METHOD TARGET VERSION`",
        ));
    };
    if !is_token(method) {
        return Err(RequestError::Malformed("invalid method"));
    }
    if !target.starts_with('/') || target.bytes().any(|b| b.is_ascii_control()) {
        return Err(RequestError::Malformed("target must be an absolute path"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(RequestError::Malformed("unsupported HTTP version"));
    }

    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            continue; // the terminating blank line
        }
        let (name, value) = line
            .split_once(':')
            .ok_or(RequestError::Malformed("header line without a colon"))?;
        // Rejects obsolete line folding and `Name : value` (both smuggling risks).
        if !is_token(name) {
            return Err(RequestError::Malformed("invalid header name"));
        }
        let value = value.trim_matches([' ', '\t']);
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(RequestError::Malformed("control character in header value"));
        }
        headers.push((name.to_owned(), value.to_owned()));
    }

    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (target, None),
    };
    Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query,
        headers,
        body: Vec::new(),
    })
}

fn content_length(headers: &[(String, String)]) -> Result<usize, RequestError> {
    if headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("transfer-encoding"))
    {
        return Err(RequestError::TransferEncoding);
    }
    let mut length = None;
    for (_, value) in headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("content-length"))
    {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(RequestError::Malformed("invalid Content-Length"));
        }
        let parsed: usize = value
            .parse()
            .map_err(|_| RequestError::Malformed("Content-Length out of range"))?;
        if length.is_some_and(|previous| previous != parsed) {
            return Err(RequestError::Malformed(
                "conflicting Content-Length headers",
            ));
        }
        length = Some(parsed);
    }
    Ok(length.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_head_bytes: 256,
        max_body_bytes: 16,
    };

    async fn read(bytes: &[u8]) -> Result<Request, RequestError> {
        let mut reader = bytes;
        read_request(&mut reader, LIMITS).await
    }

    #[tokio::test]
    async fn parses_request_line_headers_query_and_body() {
        let request =
            read(b"PUT /params?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length:  5 \r\n\r\nhello+junk")
                .await
                .unwrap();
        assert_eq!(request.method, "PUT");
        assert_eq!(request.path, "/params");
        assert_eq!(request.query.as_deref(), Some("x=1"));
        assert_eq!(request.header("content-length"), Some("5"));
        assert_eq!(request.header("HOST"), Some("a"));
        assert_eq!(request.body, b"hello");
    }

    #[tokio::test]
    async fn accepts_bare_lf_line_endings() {
        let request = read(b"GET /status HTTP/1.0\nHost: a\n\n").await.unwrap();
        assert_eq!(request.path, "/status");
        assert_eq!(request.headers.len(), 1);
    }

    #[tokio::test]
    async fn finds_terminator_split_across_reads() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move { read_request(&mut server, LIMITS).await });
        for piece in [&b"GET /metrics HTTP/1.1\r"[..], b"\n", b"\r", b"\n"] {
            client.write_all(piece).await.unwrap();
            client.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
        let request = reader.await.unwrap().unwrap();
        assert_eq!(request.path, "/metrics");
    }

    #[tokio::test]
    async fn classifies_bad_requests() {
        let cases: [(&[u8], Option<u16>); 12] = [
            (b"", None),
            (b"GET /x HTTP/1.1\r\n", Some(400)),
            (b"GET /x\r\n\r\n", Some(400)),
            (b"GET  /x HTTP/1.1\r\n\r\n", Some(400)),
            (b"GET x HTTP/1.1\r\n\r\n", Some(400)),
            (b"GET /x HTTP/2.0\r\n\r\n", Some(400)),
            (b"G(T /x HTTP/1.1\r\n\r\n", Some(400)),
            (b"GET /x HTTP/1.1\r\nNo colon\r\n\r\n", Some(400)),
            (b"GET /x HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", Some(400)),
            (
                b"GET /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                Some(400),
            ),
            (b"GET /x HTTP/1.1\r\nContent-Length: 17\r\n\r\n", Some(413)),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                Some(501),
            ),
        ];
        for (bytes, expected) in cases {
            let error = read(bytes)
                .await
                .expect_err(&String::from_utf8_lossy(bytes));
            assert_eq!(
                error.status().map(Status::code),
                expected,
                "{:?} -> {error}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[tokio::test]
    async fn rejects_oversized_head_without_reading_past_the_limit() {
        let mut bytes = b"GET /".to_vec();
        bytes.resize(1000, b'a');
        let mut reader = &bytes[..];
        let error = read_request(&mut reader, LIMITS).await.unwrap_err();
        assert!(matches!(error, RequestError::HeadTooLarge { limit: 256 }));
        assert_eq!(reader.len(), 1000 - 256, "read past the head limit");
    }

    #[tokio::test]
    async fn head_response_keeps_length_but_omits_body() {
        let response = Response::error(Status::NotFound, "nope");
        let full = String::from_utf8(response.to_bytes(false)).unwrap();
        let head = String::from_utf8(response.to_bytes(true)).unwrap();
        assert!(full.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(full.starts_with(&head));
        assert!(head.ends_with("\r\n\r\n"));
        assert!(head.contains(&format!("Content-Length: {}\r\n", response.body.len())));
    }
}
