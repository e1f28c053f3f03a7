//! A blocking client for the admin API, for `splitway ctl` and tests.
//!
//! One request per connection over `std::net::TcpStream`, mirroring the
//! server (`Connection: close`, `Content-Length` bodies): a CLI making one
//! call needs no async runtime.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde::de::DeserializeOwned;

/// The relay's default `admin` address.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:9090";
/// Largest response accepted (a `/metrics` page is tens of KiB).
const MAX_RESPONSE_BYTES: u64 = 16 << 20;

/// Why a request to the admin API did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not `HOST:PORT` or does not resolve.
    #[error("admin address {addr:?} is not usable: {reason}")]
    Address {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Nothing answered at the address: the relay is not running there.
    #[error(
        "cannot reach the relay's admin API at {addr}: {} — is `splitway relay` running, and is `admin` set to this address?",
        describe(.source)
    )]
    Unreachable {
        /// The address as given.
        addr: String,
        /// The connect error.
        #[source]
        source: io::Error,
    },
    /// The connection broke or stalled during the exchange.
    #[error("admin API at {addr}: connection failed during the request: {}", describe(.source))]
    Io {
        /// The address as given.
        addr: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The answer is not the HTTP the admin API speaks.
    #[error("admin API at {addr} sent an invalid response: {reason}")]
    BadResponse {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A short lower-case description of an I/O error (`connection refused`).
fn describe(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "timed out".to_owned(),
        io::ErrorKind::ConnectionReset => "connection reset".to_owned(),
        io::ErrorKind::HostUnreachable => "host unreachable".to_owned(),
        io::ErrorKind::NetworkUnreachable => "network unreachable".to_owned(),
        _ => error.to_string(),
    }
}

/// An answer of the admin API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// `Content-Type`, if sent.
    pub content_type: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body read as `T`: a `splitway_api` type, or `serde_json::Value`
    /// to print the document as it came.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// Talks to one relay's admin API.
#[derive(Clone, Debug)]
pub struct AdminClient {
    addr: String,
    timeout: Duration,
}

impl AdminClient {
    /// A client for `addr`: `HOST:PORT` (`http://` and a trailing `/` are
    /// tolerated; the port defaults to 9090) or `unix:/path/to/socket`.
    /// `timeout` bounds the connect and each read and write.
    pub fn new(addr: &str, timeout: Duration) -> Self {
        let trimmed = addr.trim();
        if trimmed.starts_with("unix:") {
            return Self {
                addr: trimmed.to_owned(),
                timeout,
            };
        }
        let trimmed = trimmed.strip_prefix("http://").unwrap_or(trimmed);
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        // A bare host or IPv4 address gets the default port; `[v6]` too.
        let has_port = match trimmed.rsplit_once(':') {
            Some((host, port)) => {
                port.bytes().all(|b| b.is_ascii_digit())
                    && !port.is_empty()
                    && (!host.contains(':') || host.ends_with(']'))
            }
            None => false,
        };
        let addr = if has_port || trimmed.is_empty() {
            trimmed.to_owned()
        } else {
            format!("{trimmed}:9090")
        };
        Self { addr, timeout }
    }

    /// The address requests go to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Result<Answer, ClientError> {
        self.request("GET", path, None)
    }

    /// Sends one request, with `body` (JSON text) if given, and reads the
    /// answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Answer, ClientError> {
        if let Some(socket) = self.addr.strip_prefix("unix:") {
            let stream =
                UnixStream::connect(socket).map_err(|source| ClientError::Unreachable {
                    addr: self.addr.clone(),
                    source,
                })?;
            stream
                .set_read_timeout(Some(self.timeout))
                .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
                .map_err(|source| self.io(source))?;
            return self.exchange(stream, "localhost", method, path, body);
        }
        let target = self.resolve()?;
        let stream = TcpStream::connect_timeout(&target, self.timeout).map_err(|source| {
            ClientError::Unreachable {
                addr: self.addr.clone(),
                source,
            }
        })?;
        stream
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
            .map_err(|source| self.io(source))?;
        // Host is the resolved address, not a name: the server must not
        // depend on DNS for who it is.
        self.exchange(stream, &target.to_string(), method, path, body)
    }

    fn io(&self, source: io::Error) -> ClientError {
        ClientError::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    fn exchange<S: Read + Write>(
        &self,
        mut stream: S,
        host: &str,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Answer, ClientError> {
        // `ctl metrics` prints the OpenMetrics text (it ends with `# EOF`,
        // so a truncated answer shows); everything else is JSON.
        let accept = if path == "/metrics" {
            "application/openmetrics-text; version=1.0.0, text/plain; q=0.5"
        } else {
            "application/json"
        };
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: splitway-ctl\r\nAccept: {accept}\r\nConnection: close\r\n"
        );
        if let Some(body) = &body {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        } else if method != "GET" && method != "HEAD" {
            request.push_str("Content-Length: 0\r\n");
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        stream.write_all(&bytes).map_err(|source| self.io(source))?;
        stream.flush().map_err(|source| self.io(source))?;

        let mut raw = Vec::new();
        stream
            .take(MAX_RESPONSE_BYTES + 1)
            .read_to_end(&mut raw)
            .map_err(|source| self.io(source))?;
        if raw.len() as u64 > MAX_RESPONSE_BYTES {
            return Err(self.bad(format!("larger than {MAX_RESPONSE_BYTES} bytes")));
        }
        self.parse(raw)
    }

    fn resolve(&self) -> Result<SocketAddr, ClientError> {
        let address_error = |reason: String| ClientError::Address {
            addr: self.addr.clone(),
            reason,
        };
        let mut addrs = self
            .addr
            .to_socket_addrs()
            .map_err(|error| address_error(error.to_string()))?;
        addrs
            .next()
            .ok_or_else(|| address_error("resolves to no address".to_owned()))
    }

    fn bad(&self, reason: impl Into<String>) -> ClientError {
        ClientError::BadResponse {
            addr: self.addr.clone(),
            reason: reason.into(),
        }
    }

    fn parse(&self, raw: Vec<u8>) -> Result<Answer, ClientError> {
        let head_end = raw
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .ok_or_else(|| self.bad("no end of headers"))?;
        let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| self.bad("head not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
            return Err(self.bad(format!("status line {status_line:?}")));
        };
        if !version.starts_with("HTTP/1.") {
            return Err(self.bad(format!("status line {status_line:?}")));
        }
        let status: u16 = code
            .parse()
            .map_err(|_| self.bad(format!("status line {status_line:?}")))?;
        let mut content_type = None;
        let mut content_length = None;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                return Err(self.bad(format!("header line {line:?}")));
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-type") {
                content_type = Some(value.to_owned());
            } else if name.eq_ignore_ascii_case("content-length") {
                content_length = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| self.bad(format!("Content-Length {value:?}")))?,
                );
            }
        }
        let mut body = raw[head_end + 4..].to_vec();
        if let Some(length) = content_length {
            if body.len() < length {
                return Err(self.bad(format!("body truncated: {} of {length} bytes", body.len())));
            }
            body.truncate(length);
        }
        Ok(Answer {
            status,
            content_type,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_gets_default_port_and_loses_scheme() {
        let timeout = Duration::from_secs(1);
        assert_eq!(
            AdminClient::new("127.0.0.1", timeout).addr(),
            "127.0.0.1:9090"
        );
        assert_eq!(
            AdminClient::new("http://127.0.0.1:9191/", timeout).addr(),
            "127.0.0.1:9191"
        );
        assert_eq!(AdminClient::new("[::1]", timeout).addr(), "[::1]:9090");
        assert_eq!(AdminClient::new("[::1]:80", timeout).addr(), "[::1]:80");
        assert_eq!(
            AdminClient::new("localhost:9090", timeout).addr(),
            "localhost:9090"
        );
    }

    #[test]
    fn closed_port_is_reported_as_unreachable() {
        // Bind then drop: the port was free a moment ago and nobody listens.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = AdminClient::new(&format!("127.0.0.1:{port}"), Duration::from_secs(2));
        let error = client.get("/status").unwrap_err();
        assert!(
            matches!(error, ClientError::Unreachable { .. }),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "cannot reach the relay's admin API at 127.0.0.1:{port}: connection refused — is `splitway relay` running, and is `admin` set to this address?"
            )
        );
    }
}
