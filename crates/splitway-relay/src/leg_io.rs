//! One side of a leg as forwarding and the handshakes see it (plain TCP,
//! or TLS over it), and reading length-delimited frames through it: every
//! plain connection passes through here, not through the TLS code.

use std::io;

use tokio::net::TcpStream;

use crate::bytes;
use crate::tls::TlsLeg;

/// Why reading a frame stopped.
#[derive(Debug)]
pub enum FrameError<E> {
    /// The other side closed before the frame was complete.
    Closed,
    Io(io::Error),
    Bad(E),
}

/// Reads from `s` into `buf` until `decode` yields a frame; the frame's bytes
/// are removed from `buf` and whatever followed stays there (it belongs to
/// the data stream).
pub async fn read_frame<'a, T, E>(
    s: impl Into<LegIo<'a>>,
    buf: &mut Vec<u8>,
    mut decode: impl FnMut(&[u8]) -> Result<Option<(T, usize)>, E>,
) -> Result<T, FrameError<E>> {
    let s = s.into();
    loop {
        if !buf.is_empty()
            && let Some((v, n)) = decode(buf).map_err(FrameError::Bad)?
        {
            buf.drain(..n);
            return Ok(v);
        }
        let mut chunk = [0u8; 2048];
        match s.read(&mut chunk).await {
            Ok(0) => return Err(FrameError::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A TLS leg closed without close_notify: between frames that is
            // a plain close (a pooled connection retired by its owner).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
}

/// One side of a leg as forwarding and the handshakes see it: plain TCP,
/// or TLS over it.
#[derive(Clone, Copy)]
pub struct LegIo<'a> {
    pub tcp: &'a TcpStream,
    pub tls: Option<&'a TlsLeg>,
}

impl<'a> From<&'a TcpStream> for LegIo<'a> {
    fn from(tcp: &'a TcpStream) -> Self {
        LegIo { tcp, tls: None }
    }
}

impl<'a> LegIo<'a> {
    pub fn new(tcp: &'a TcpStream, tls: Option<&'a TlsLeg>) -> Self {
        LegIo { tcp, tls }
    }

    /// Reads some bytes; `Ok(0)` is EOF.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(t) = self.tls {
            return t.read(self.tcp, buf).await;
        }
        loop {
            self.tcp.readable().await?;
            match self.tcp.try_read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    pub async fn write_all(&self, data: &[u8]) -> io::Result<()> {
        match self.tls {
            Some(t) => t.write_all(self.tcp, data).await,
            None => bytes::write_all(self.tcp, data).await,
        }
    }

    pub async fn shutdown_write(&self) -> io::Result<()> {
        match self.tls {
            Some(t) => t.shutdown_write(self.tcp).await,
            None => splitway_sys::sock::shutdown_write(self.tcp),
        }
    }
}
