//! Per-leg socket tuning, applied before connect (dialed legs) or right
//! after accept (client legs).

use std::os::fd::AsFd;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};

use crate::config::LegTuning;

/// Keepalive for relay↔relay legs when the config says nothing: a dead peer
/// must be noticed even when the split connection (or a pooled leg) is
/// idle. Probes every 2 s after 5 s of silence, 3 of them: an idle leg
/// whose path died is dropped about 11 s after it last heard from its peer.
pub const PEER_KEEPALIVE_DEFAULT: Duration = Duration::from_secs(5);

/// TCP_USER_TIMEOUT of relay legs when the config says nothing: data
/// unacknowledged this long ends the leg, instead of the kernel's 15
/// retransmissions (about 15 minutes), so a path that dies under traffic
/// is noticed too (keepalive only probes idle legs). Once suspected of
/// resetting path-probe legs under 5 % loss; the resets were the probe
/// answer's close (fixed: it lingers), and with this default
/// `relay_paths::loss_on_the_chosen_leg_moves_new_connections` passed 12 of
/// 12 runs. `user_timeout = "off"` removes it.
pub const PEER_USER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Applies `tuning` to a socket. `keepalive_default` is the leg kind's
/// default when the config leaves it unset; legs with one (relay legs) also
/// get [`PEER_USER_TIMEOUT_DEFAULT`] unless the config sets `user_timeout`.
/// Failures are returned, not
/// ignored: a leg that silently ran with the wrong congestion control would
/// falsify every measurement.
pub fn apply(
    sock: &impl AsFd,
    tuning: &LegTuning,
    keepalive_default: Option<Duration>,
) -> std::io::Result<()> {
    apply_with_buffers(sock, tuning, keepalive_default, None)
}

/// [`apply`] for an accepted socket, which inherited TCP_NODELAY from its
/// listener (`ingress::set_accept_options`): set again only if the config
/// turns it off.
pub fn apply_accepted(
    sock: &impl AsFd,
    tuning: &LegTuning,
    keepalive_default: Option<Duration>,
) -> std::io::Result<()> {
    apply_inner(sock, tuning, keepalive_default, None, true)
}

/// Like [`apply`], with a buffer size for legs whose config sets none
/// (turbo-start's big buffers on relay legs).
pub fn apply_with_buffers(
    sock: &impl AsFd,
    tuning: &LegTuning,
    keepalive_default: Option<Duration>,
    default_buffer: Option<usize>,
) -> std::io::Result<()> {
    apply_inner(sock, tuning, keepalive_default, default_buffer, false)
}

fn apply_inner(
    sock: &impl AsFd,
    tuning: &LegTuning,
    keepalive_default: Option<Duration>,
    default_buffer: Option<usize>,
    nodelay_inherited: bool,
) -> std::io::Result<()> {
    let s = SockRef::from(sock);
    let nodelay = tuning.nodelay.unwrap_or(true);
    if !(nodelay && nodelay_inherited) {
        s.set_nodelay(nodelay)?;
    }
    if let Some(n) = tuning.sndbuf.or(default_buffer) {
        s.set_send_buffer_size(n)?;
    }
    if let Some(n) = tuning.rcvbuf.or(default_buffer) {
        s.set_recv_buffer_size(n)?;
    }
    let keepalive = tuning.keepalive.unwrap_or(keepalive_default);
    // Relay legs (those with a keepalive default) get the user timeout by
    // default; `user_timeout = "off"` removes it.
    let user_timeout = match tuning.user_timeout {
        Some(set) => set,
        None => keepalive_default.map(|_| PEER_USER_TIMEOUT_DEFAULT),
    };
    if let Some(t) = user_timeout {
        s.set_tcp_user_timeout(Some(t))?;
    }
    if let Some(idle) = keepalive {
        s.set_tcp_keepalive(
            &TcpKeepalive::new()
                .with_time(idle)
                .with_interval(idle / 3 + Duration::from_secs(1))
                .with_retries(3),
        )?;
    }
    if let Some(cc) = &tuning.congestion {
        set_congestion(sock, cc)?;
    }
    Ok(())
}

/// `TCP_CONGESTION`. A shipped BPF algorithm that another process held and
/// has since unregistered (ENOENT) is registered again here and retried.
fn set_congestion(sock: &impl AsFd, cc: &str) -> std::io::Result<()> {
    let set = || splitway_sys::sock::set_congestion(&sock.as_fd(), cc);
    let missing = |e: &splitway_sys::SysError| matches!(e, splitway_sys::SysError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
    match set() {
        Ok(()) => Ok(()),
        Err(e) if missing(&e) && splitway_sys::cc::is_shipped(cc) => {
            crate::congestion::ensure(cc).map_err(std::io::Error::other)?;
            set().map_err(|e| std::io::Error::other(e.to_string()))
        }
        Err(e) => Err(std::io::Error::other(e.to_string())),
    }
}
