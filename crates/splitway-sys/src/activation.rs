//! The service manager's two protocols. Socket activation (`LISTEN_FDS`):
//! listening sockets a service manager opened for us arrive as fds 3, 4, …
//! with `LISTEN_FDS` saying how many and `LISTEN_PID` saying which process
//! they are for. Readiness (`NOTIFY_SOCKET`, `Type=notify`): the relay says
//! `READY=1` once its listeners listen, so `systemctl start` returns when
//! connections are accepted rather than at exec.

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

/// Sends `state` (newline-separated `KEY=VALUE` lines, e.g. `READY=1`) to
/// the service manager's `NOTIFY_SOCKET`. Returns whether one was set; no
/// socket is not an error (the relay was not started by systemd).
pub fn notify(state: &str) -> Result<bool, SysError> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(path) => notify_to(&path, state).map(|()| true),
        None => Ok(false),
    }
}

/// [`notify`] to a given `NOTIFY_SOCKET` value.
pub fn notify_to(path: &std::ffi::OsStr, state: &str) -> Result<(), SysError> {
    use std::os::linux::net::SocketAddrExt as _;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path);
    let fail = |e: std::io::Error| SysError::io(format!("NOTIFY_SOCKET={path:?}: {state:?}"), e);
    // `@name` is a Linux abstract socket; anything else is a file path.
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(path),
    }
    .map_err(fail)?;
    let socket = UnixDatagram::unbound().map_err(fail)?;
    let sent = socket.send_to_addr(state.as_bytes(), &addr).map_err(fail)?;
    if sent != state.len() {
        return Err(SysError::Internal(format!(
            "NOTIFY_SOCKET: sent {sent} of {} bytes of {state:?}",
            state.len()
        )));
    }
    Ok(())
}

/// `MONOTONIC_USEC=…`, the clock systemd compares a reload's start with.
pub fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_reaches_an_abstract_and_a_path_socket() {
        use std::os::linux::net::SocketAddrExt as _;
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let name = format!("splitway-notify-test-{}", std::process::id());
        let abstract_rx =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let dir = std::env::temp_dir().join(format!("{name}.d"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let path_rx = UnixDatagram::bind(&path).unwrap();
        let mut buf = [0u8; 64];
        notify_to(format!("@{name}").as_ref(), "READY=1").unwrap();
        let n = abstract_rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        notify_to(path.as_os_str(), "STOPPING=1").unwrap();
        let n = path_rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        let err = notify_to(dir.join("absent").as_os_str(), "READY=1")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("NOTIFY_SOCKET") && err.contains("absent"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
