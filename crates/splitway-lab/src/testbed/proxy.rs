//! Client handshakes of the relay's explicit entry points, over any byte
//! stream: the tests check each answer byte by byte, the bench and soak
//! only need the tunnel.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

/// Who failed a handshake: the stream, or the proxy's answer.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("proxy connection: {0}")]
    Io(#[from] io::Error),
    #[error("proxy: SOCKS method reply {0:?}, expected [5, 0] (no authentication)")]
    Method([u8; 2]),
    #[error("proxy: SOCKS reply of version {0}")]
    Version(u8),
    #[error("proxy: SOCKS reply with address type {0}")]
    AddressType(u8),
    #[error("proxy: CONNECT reply head longer than {0} bytes")]
    HeadTooLong(usize),
    #[error("proxy closed during CONNECT")]
    Closed,
    #[error("proxy: no status line in the CONNECT reply {0:?}")]
    NoStatus(String),
}

/// What a SOCKS5 CONNECT asks for.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Ip(SocketAddr),
    Name(&'a str, u16),
}

/// The SOCKS5 greeting offering no authentication.
pub const SOCKS5_GREETING: [u8; 3] = [5, 1, 0];

/// A SOCKS5 CONNECT request for `target`.
pub fn socks5_request(target: Target<'_>) -> Vec<u8> {
    let mut req = vec![5, 1, 0];
    let port = match target {
        Target::Ip(SocketAddr::V4(a)) => {
            req.push(1);
            req.extend_from_slice(&a.ip().octets());
            a.port()
        }
        Target::Ip(SocketAddr::V6(a)) => {
            req.push(4);
            req.extend_from_slice(&a.ip().octets());
            a.port()
        }
        Target::Name(host, port) => {
            req.push(3);
            req.push(host.len() as u8);
            req.extend_from_slice(host.as_bytes());
            port
        }
    };
    req.extend_from_slice(&port.to_be_bytes());
    req
}

/// SOCKS5 CONNECT without authentication; returns the reply code (0: the
/// stream now carries the tunnel). The reply's bound address is consumed.
pub fn socks5(s: &mut (impl Read + Write), target: Target<'_>) -> Result<u8, ProxyError> {
    s.write_all(&SOCKS5_GREETING)?;
    let mut method = [0u8; 2];
    s.read_exact(&mut method)?;
    if method != [5, 0] {
        return Err(ProxyError::Method(method));
    }
    s.write_all(&socks5_request(target))?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head)?;
    if head[0] != 5 {
        return Err(ProxyError::Version(head[0]));
    }
    let rest = match head[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        other => return Err(ProxyError::AddressType(other)),
    };
    let mut bound = vec![0u8; rest];
    s.read_exact(&mut bound)?;
    Ok(head[1])
}

/// The CONNECT request for `target` (`host:port`).
pub fn connect_request(target: &str) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
}

/// Longest CONNECT reply head accepted.
const MAX_HEAD: usize = 4096;

/// HTTP CONNECT; returns the reply's status (200: the stream now carries
/// the tunnel). Reads `chunk` bytes at a time: 1 leaves every byte after
/// the head unread; more saves system calls where the proxy sends nothing
/// after its head before the client speaks.
pub fn http_connect(
    s: &mut (impl Read + Write),
    target: &str,
    chunk: usize,
) -> Result<u16, ProxyError> {
    s.write_all(connect_request(target).as_bytes())?;
    let mut head = Vec::with_capacity(128);
    let mut buf = vec![0u8; chunk.max(1)];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(ProxyError::Closed);
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return Err(ProxyError::HeadTooLong(MAX_HEAD));
        }
    }
    let text = String::from_utf8_lossy(&head);
    text.lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| ProxyError::NoStatus(text.into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted peer: reads go to `input`, writes are kept.
    struct Script {
        input: io::Cursor<Vec<u8>>,
        written: Vec<u8>,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Script {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn script(input: &[u8]) -> Script {
        Script {
            input: io::Cursor::new(input.to_vec()),
            written: Vec::new(),
        }
    }

    #[test]
    fn socks5_sends_the_request_and_reads_the_whole_reply() {
        let mut s = script(&[5, 0, 5, 2, 0, 1, 10, 0, 0, 1, 0, 80, 0xAA]);
        let target = Target::Ip("10.0.3.2:5001".parse().unwrap());
        assert_eq!(socks5(&mut s, target).unwrap(), 2);
        assert_eq!(
            s.written,
            [5, 1, 0, 5, 1, 0, 1, 10, 0, 3, 2, 0x13, 0x89],
            "greeting, then CONNECT 10.0.3.2:5001"
        );
        assert_eq!(s.input.position(), 12, "the byte after the reply is unread");
        let mut refused = script(&[5, 0xFF]);
        assert!(matches!(
            socks5(&mut refused, Target::Name("a.example", 80)),
            Err(ProxyError::Method([5, 0xFF]))
        ));
    }

    #[test]
    fn http_connect_reads_the_head_only() {
        let mut s = script(b"HTTP/1.1 403 Forbidden\r\nX: y\r\n\r\nrest");
        assert_eq!(http_connect(&mut s, "10.0.3.2:80", 1).unwrap(), 403);
        assert_eq!(s.written, connect_request("10.0.3.2:80").as_bytes());
        assert_eq!(s.input.position(), 32, "`rest` is unread");
        let mut short = script(b"HTTP/1.1 200");
        assert!(matches!(
            http_connect(&mut short, "h:1", 256),
            Err(ProxyError::Closed)
        ));
        let mut garbage = script(b"nonsense\r\n\r\n");
        assert!(matches!(
            http_connect(&mut garbage, "h:1", 256),
            Err(ProxyError::NoStatus(_))
        ));
    }
}
