//! Real-time helpers for the lab's link emulator: a monotonic nanosecond
//! clock, waiting on fds until an absolute deadline with hrtimer precision,
//! 1 ns timer slack and SCHED_FIFO priority for the calling thread; and
//! SIGPIPE's default action for the commands that only print.

use std::io;
use std::os::fd::RawFd;

use crate::SysError;

/// CLOCK_MONOTONIC in nanoseconds (same clock as `std::time::Instant`).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec; CLOCK_MONOTONIC
    // always exists on Linux, so the call cannot fail.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time the calling thread has used, in nanoseconds (a syscall, about
/// 0.2 µs: sample it, don't call it per packet).
pub fn thread_cpu_time_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec; the calling
    // thread's CPU clock always exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sets the calling thread's timer slack to 1 ns so timed waits are not
/// coalesced (the default slack is 50 µs).
pub fn set_min_timer_slack() -> Result<(), SysError> {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and touches no
    // memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(SysError::io(
            "prctl(PR_SET_TIMERSLACK)",
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Switches the calling thread to SCHED_FIFO at `priority` (1..=99).
/// Fails with EPERM when the process lacks CAP_SYS_NICE / RLIMIT_RTPRIO.
pub fn set_fifo_priority(priority: i32) -> Result<(), SysError> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 means the calling thread; `param` is a valid
    // sched_param that outlives the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(SysError::io(
            format!("sched_setscheduler(SCHED_FIFO, {priority})"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Sleeps until the absolute CLOCK_MONOTONIC time `deadline_ns`.
pub fn sleep_until_ns(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be
        // null for TIMER_ABSTIME sleeps.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        // clock_nanosleep returns the error number instead of setting errno.
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Waits until one of `fds` is readable or until the absolute
/// CLOCK_MONOTONIC time `deadline_ns` (None: no deadline). Returns one
/// readiness flag per fd (POLLIN, POLLERR or POLLHUP set). Uses ppoll, whose
/// timeout is an hrtimer: with 1 ns slack it wakes within microseconds.
/// At most 8 fds.
pub fn wait_readable(fds: &[RawFd], deadline_ns: Option<u64>) -> io::Result<[bool; 8]> {
    assert!(fds.len() <= 8, "wait_readable supports at most 8 fds");
    let mut pollfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 8];
    for (p, &fd) in pollfds.iter_mut().zip(fds) {
        p.fd = fd;
        p.events = libc::POLLIN;
    }
    let timeout = deadline_ns.map(|d| {
        let rel = d.saturating_sub(now_ns());
        libc::timespec {
            tv_sec: (rel / 1_000_000_000) as libc::time_t,
            tv_nsec: (rel % 1_000_000_000) as libc::c_long,
        }
    });
    let timeout_ptr = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pollfds` holds `fds.len()` initialised entries; the timeout
    // pointer is null or points to a timespec living until the call returns;
    // a null sigmask leaves the signal mask unchanged.
    let rc = unsafe {
        libc::ppoll(
            pollfds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            timeout_ptr,
            std::ptr::null(),
        )
    };
    let mut ready = [false; 8];
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(ready);
        }
        return Err(err);
    }
    for (r, p) in ready.iter_mut().zip(&pollfds[..fds.len()]) {
        *r = p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    }
    Ok(ready)
}

/// Restores SIGPIPE's default action (end the process quietly), which
/// Rust's runtime sets to ignored: for commands that only print to stdout
/// (`relay --check`, `ctl`, `keygen`), so `splitway relay --check | head -1`
/// ends like `cat` does instead of panicking on the broken pipe. Never for
/// a running relay: a write to a reset socket must be an error there.
pub fn default_sigpipe() -> Result<(), SysError> {
    // SAFETY: SIG_DFL is a valid disposition for SIGPIPE; signal(2) touches
    // no memory of ours. Called before any other thread exists.
    let previous = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    if previous == libc::SIG_ERR {
        return Err(SysError::io(
            "signal(SIGPIPE, SIG_DFL)",
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_until_is_never_early() {
        set_min_timer_slack().expect("timer slack");
        for _ in 0..20 {
            let deadline = now_ns() + 200_000;
            sleep_until_ns(deadline);
            assert!(now_ns() >= deadline);
        }
    }

    #[test]
    fn wait_readable_times_out_at_deadline() {
        let deadline = now_ns() + 1_000_000;
        let ready = wait_readable(&[], Some(deadline)).expect("ppoll");
        assert!(ready.iter().all(|r| !r));
        assert!(now_ns() >= deadline);
    }
}
