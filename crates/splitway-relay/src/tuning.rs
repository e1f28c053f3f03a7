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

/// A TCP_USER_TIMEOUT for relay legs that carry traffic over a path that
/// may die: data unacknowledged this long ends the leg, instead of the
/// kernel's 15 retransmissions (about 15 minutes). Not on by default: with
/// it on every relay leg, `relay_paths::loss_on_the_chosen_leg_moves_new_connections`
/// (5 % emulated loss) saw probe legs reset within 2 s of the loss in 4 of
/// 14 runs on kernel 6.18, against 0 of 12 without it (and 0 of 6 with the
/// 5 s keepalive alone), a cause not yet found. Set `user_timeout` on a
/// `[[peer]]` or `[upstream]` to have it.
pub const PEER_USER_TIMEOUT_SUGGESTED: Duration = Duration::from_secs(10);

/// Applies `tuning` to a socket. `keepalive_default` is the leg kind's
/// default when the config leaves it unset. TCP_USER_TIMEOUT only as the
/// config sets it ([`PEER_USER_TIMEOUT_SUGGESTED`] says why). Failures are returned, not
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
    if let Some(t) = tuning.user_timeout.flatten() {
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
