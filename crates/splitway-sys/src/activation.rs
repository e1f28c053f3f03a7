//! Socket activation (systemd's `LISTEN_FDS` protocol): listening sockets a
//! service manager opened for us arrive as fds 3, 4, … with `LISTEN_FDS`
//! saying how many and `LISTEN_PID` saying which process they are for.

use std::net::TcpListener;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::SysError;

/// First inherited fd (after stdin, stdout, stderr).
const LISTEN_FDS_START: RawFd = 3;
/// More than this many inherited fds is surely a mistake (a wrong variable).
const MAX_FDS: usize = 1024;

static TAKEN: AtomicBool = AtomicBool::new(false);

/// One inherited listening socket.
#[derive(Debug)]
pub struct Inherited {
    /// Its fd number, for messages.
    pub fd: RawFd,
    pub listener: TcpListener,
}

/// The listening TCP sockets passed by the service manager, in fd order.
/// Empty when `LISTEN_FDS` is unset or `LISTEN_PID` names another process
/// (the variables were inherited by mistake; the fds are not ours).
///
/// The fds are owned from here on: a second call returns nothing. Each gets
/// close-on-exec, so the commands the relay runs (`nft`, `ip`) do not hold
/// them. The variables are left set: removing them is not thread-safe, and
/// children ignore them anyway since `LISTEN_PID` is not theirs.
pub fn take_listen_fds() -> Result<Vec<Inherited>, SysError> {
    let Ok(count) = std::env::var("LISTEN_FDS") else {
        return Ok(Vec::new());
    };
    let count: usize = count
        .trim()
        .parse()
        .ok()
        .filter(|n| *n <= MAX_FDS)
        .ok_or_else(|| {
            SysError::Internal(format!("LISTEN_FDS={count:?} is not a number of fds"))
        })?;
    match std::env::var("LISTEN_PID") {
        Ok(pid) if pid.trim() == std::process::id().to_string() => {}
        Ok(pid) => {
            tracing::warn!(
                listen_pid = %pid,
                pid = std::process::id(),
                "LISTEN_FDS is set for another process; not adopting any socket"
            );
            return Ok(Vec::new());
        }
        Err(_) => {
            return Err(SysError::Internal(
                "LISTEN_FDS is set without LISTEN_PID".into(),
            ));
        }
    }
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(Vec::new());
    }
    let mut taken = Vec::with_capacity(count);
    for fd in LISTEN_FDS_START..LISTEN_FDS_START + count as RawFd {
        taken.push(adopt(fd)?);
    }
    Ok(taken)
}

fn adopt(fd: RawFd) -> Result<Inherited, SysError> {
    let fail =
        |what: &str, e: std::io::Error| SysError::io(format!("inherited fd {fd}: {what}"), e);
    // SAFETY: fcntl on an fd number has no memory effects; an fd that is not
    // open fails with EBADF, which is reported.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(fail("fcntl(FD_CLOEXEC)", std::io::Error::last_os_error()));
    }
    let int_opt = |level: libc::c_int, name: libc::c_int| -> std::io::Result<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` are valid for writes and `len` is the
        // size of `value`; the kernel writes at most `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc == 0 {
            Ok(value)
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let domain = int_opt(libc::SOL_SOCKET, libc::SO_DOMAIN).map_err(|e| fail("not a socket", e))?;
    let kind = int_opt(libc::SOL_SOCKET, libc::SO_TYPE).map_err(|e| fail("SO_TYPE", e))?;
    let listening =
        int_opt(libc::SOL_SOCKET, libc::SO_ACCEPTCONN).map_err(|e| fail("SO_ACCEPTCONN", e))?;
    if !matches!(domain, libc::AF_INET | libc::AF_INET6)
        || kind != libc::SOCK_STREAM
        || listening == 0
    {
        return Err(SysError::Internal(format!(
            "inherited fd {fd} is not a listening TCP/IP socket (ListenStream= in the .socket unit must be an IP:port)"
        )));
    }
    // SAFETY: the fd is open (fcntl succeeded) and was passed to this
    // process to own; `TAKEN` makes sure it is wrapped only once, so exactly
    // one owner closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(Inherited {
        fd,
        listener: TcpListener::from(owned),
    })
}
