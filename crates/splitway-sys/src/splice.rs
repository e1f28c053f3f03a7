//! splice(2) between sockets through a pipe, and a per-thread pipe pool.
//!
//! A pipe is only held while bytes sit in it: the forwarder takes one when a
//! socket turns readable and gives it back once it is drained, so an idle
//! split connection holds no pipe (HAProxy does the same with its pipe pool).

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Pipes kept per thread for reuse; beyond that, drained pipes are closed.
pub const POOL_PER_THREAD: usize = 64;

/// Requested pipe capacity. 64 KiB is the kernel default; asking for more
/// lets one splice move a bigger batch on fast paths.
pub const PIPE_CAPACITY: usize = 256 * 1024;

/// A non-blocking pipe used as the in-kernel staging buffer for splice.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds points to two writable ints, as pipe2 requires.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody
        // else; OwnedFd takes sole ownership.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_SETPIPE_SZ takes an int argument; failure (e.g. above
        // pipe-max-size) leaves the default size, which F_GETPIPE_SZ reports.
        let capacity = unsafe {
            libc::fcntl(
                write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                PIPE_CAPACITY as libc::c_int,
            );
            libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        let capacity = if capacity > 0 {
            capacity as usize
        } else {
            65536
        };
        Ok(Pipe {
            read,
            write,
            capacity,
        })
    }

    /// The read end, for splice operations submitted elsewhere (io_uring).
    pub fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// The write end, for splice operations submitted elsewhere (io_uring).
    pub fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Moves up to `len` bytes from socket `from` into the pipe.
    /// Ok(0) means end of stream on the socket.
    pub fn fill_from(&self, from: RawFd, len: usize) -> io::Result<usize> {
        splice(from, self.write.as_raw_fd(), len, false)
    }

    /// Moves up to `len` bytes from the pipe into socket `to`. With `more`,
    /// more data follows at once (SPLICE_F_MORE: no short segment at the end).
    pub fn drain_to(&self, to: RawFd, len: usize, more: bool) -> io::Result<usize> {
        splice(self.read.as_raw_fd(), to, len, more)
    }

    /// Takes a pipe from this thread's pool, or creates one.
    pub fn take() -> io::Result<Pipe> {
        match POOL.with(|p| p.borrow_mut().pop()) {
            Some(pipe) => Ok(pipe),
            None => Pipe::new(),
        }
    }

    /// Returns an empty pipe to this thread's pool. The caller guarantees it
    /// holds no bytes: a pipe with data would leak them into another stream.
    pub fn give_back(self) {
        POOL.with(|p| {
            let mut pool = p.borrow_mut();
            if pool.len() < POOL_PER_THREAD {
                pool.push(self);
            }
        });
    }
}

thread_local! {
    static POOL: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

fn splice(from: RawFd, to: RawFd, len: usize, more: bool) -> io::Result<usize> {
    let more = if more { libc::SPLICE_F_MORE } else { 0 };
    // SAFETY: both fds are open for the duration of the call (borrowed from
    // live owners); null offsets are required for pipes and sockets.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | more,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn splices_socket_to_socket_through_pipe() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l2.local_addr().unwrap()).unwrap();
        let (mut d, _) = l2.accept().unwrap();

        let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        a.write_all(&payload).unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();

        let pipe = Pipe::take().unwrap();
        assert!(pipe.capacity() >= 65536);
        let mut moved = 0;
        loop {
            // b is blocking: splice waits for data or EOF.
            let n = pipe.fill_from(b.as_raw_fd(), pipe.capacity()).unwrap();
            if n == 0 {
                break;
            }
            let mut left = n;
            while left > 0 {
                left -= pipe.drain_to(c.as_raw_fd(), left, false).unwrap();
            }
            moved += n;
        }
        pipe.give_back();
        drop(c);
        let mut got = Vec::new();
        d.read_to_end(&mut got).unwrap();
        assert_eq!(moved, payload.len());
        assert_eq!(got, payload);
    }
}
