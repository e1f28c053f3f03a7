//! Byte helpers every leg uses: the per-thread copy buffers, writing a
//! whole slice to a non-blocking socket, and reading what is already queued.

use std::cell::RefCell;
use std::io;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// recv/send buffer size. A read that fills it means bulk data is queued,
/// which is when `auto` switches the direction to splice.
pub(crate) const COPY_BUF: usize = 16 * 1024;
/// Buffers kept per thread for reuse.
const BUF_POOL_PER_THREAD: usize = 64;

thread_local! {
    static BUFS: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn take_buf() -> Box<[u8]> {
    BUFS.with(|b| b.borrow_mut().pop())
        .unwrap_or_else(|| vec![0u8; COPY_BUF].into_boxed_slice())
}

pub(crate) fn give_buf(buf: Box<[u8]>) {
    BUFS.with(|b| {
        let mut pool = b.borrow_mut();
        if pool.len() < BUF_POOL_PER_THREAD {
            pool.push(buf);
        }
    });
}

/// Waits until `dst` is writable. Through the socket's own writer slot
/// (`poll_write_ready`), so nothing is stored while waiting: `writable()`
/// keeps an intrusive waiter in the future.
async fn write_ready(dst: &TcpStream) -> io::Result<()> {
    std::future::poll_fn(|cx| dst.poll_write_ready(cx)).await
}

/// Whether the source already holds more bytes: then the write just made
/// is not the end of a burst, and a partial segment should wait for the
/// next one (MSG_MORE / SPLICE_F_MORE) instead of leaving short. An error
/// here is reported by the next read.
pub(crate) fn more_queued(src: &TcpStream) -> bool {
    splitway_sys::sock::queued_bytes(src).is_ok_and(|n| n > 0)
}

/// Writes all of `data`; with `more`, hints that more follows at once.
pub async fn write_all_more(dst: &TcpStream, mut data: &[u8], more: bool) -> io::Result<()> {
    while !data.is_empty() {
        write_ready(dst).await?;
        match dst.try_io(Interest::WRITABLE, || {
            splitway_sys::sock::send(dst, data, more)
        }) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `data`, waiting for writability as needed.
pub async fn write_all(dst: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        write_ready(dst).await?;
        match dst.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One non-blocking recv on `s`, like `TcpStream::try_read`, except that a
/// read shorter than `buf` also tells the runtime the socket is drained:
/// TCP hands over all it holds up to the length asked for, so the next
/// wait parks instead of making a recv that returns EAGAIN (one syscall
/// per message and direction; tokio's own poll_read does the same). Bytes
/// that arrive after the readiness was sampled raise a new event, which
/// this does not clear. `drains`: false where `splitway bypass` may have
/// paired `s` ([`short_read_drains`]).
pub(crate) fn try_read_draining(s: &TcpStream, buf: &mut [u8], drains: bool) -> io::Result<usize> {
    let mut got = 0;
    match s.try_io(Interest::READABLE, || {
        got = splitway_sys::sock::recv(s, buf)?;
        if drains && got > 0 && got < buf.len() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(got)
    }) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        other => other,
    }
}

/// Whether a short read proves a socket of this process drained: not
/// where `splitway bypass` may have paired it, since a tcp_bpf read returns
/// redirected bytes alone even with TCP bytes queued behind them
/// (docs/bypass.md, "The relay").
pub(crate) fn short_read_drains() -> bool {
    !splitway_sys::bpf::bypass::may_pair_this_process_recently()
}

/// Reads what is already queued on `s`, without waiting. An error (a reset)
/// is returned: the kernel reports it once, so it must not be swallowed.
pub(crate) fn take_ready_bytes(s: &TcpStream, into: &mut Vec<u8>) -> io::Result<()> {
    const MAX: usize = 16 * 1024;
    let mut buf = [0u8; MAX];
    match try_read_draining(s, &mut buf, short_read_drains()) {
        Ok(n) => {
            // n == 0 (EOF) is seen again by forwarding.
            into.extend_from_slice(&buf[..n]);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
    }
}
