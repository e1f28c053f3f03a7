//! 0-RTT peer Hellos (`[accel] zero_rtt`), issue #31's room: the
//! dialer's Hello and Confirm bytes (`dial`, no I/O), the acceptor's replay window and what
//! backs it (`replay`), the Confirm an accepted Hello owes (`confirm`), the
//! outcomes both ends count (`metrics`), and the status line (`plan`). The
//! Hello's frames are the peer handshake's: `peer/` connects, writes and
//! reads the proof around the dial's bytes and takes Hellos through this
//! room's window; the room imports no `peer`.

mod confirm;
mod dial;
mod metrics;
pub mod plan;
mod replay;

use std::sync::Arc;

pub use confirm::Unconfirmed;
pub(crate) use dial::{confirm, hello, refused};
pub use metrics::{ZeroRttMetrics, ZeroRttOutcome};
pub use replay::{HelloRegister, HelloWindow, unix_ms};

use crate::config::Config;

/// Whether this relay takes 0-RTT Hellos: `Some(shares_port)` when it has a
/// plain (non-TLS) peer listener, `shares_port` when one of them has
/// `reuse_port` (other processes may accept on its port).
pub fn hello_listeners(cfg: &Config) -> Option<bool> {
    let mut plain = cfg
        .listeners
        .iter()
        .filter(|l| l.mode.accepts_relays() && l.tls.is_none())
        .peekable();
    plain.peek()?;
    Some(plain.any(|l| l.reuse_port))
}

/// What the room starts at bind: the replay window (with 0-RTT on), and
/// for the status line what guards it against replays (`Ok`) or why Hellos
/// are refused (`Err`), when this relay has a plain peer listener.
pub struct Started {
    pub window: Option<Arc<HelloWindow>>,
    pub register: Option<Result<String, String>>,
}

/// Opens the host-wide register and the window Hellos are admitted by.
pub fn start(cfg: &Config, metrics: ZeroRttMetrics) -> Started {
    let listeners = hello_listeners(cfg);
    let window = cfg.accel.zero_rtt.then(|| {
        let register = match listeners {
            Some(shares_port) => HelloRegister::open(shares_port),
            None => HelloRegister::Local("no plain peer listener".into()),
        };
        Arc::new(HelloWindow::new(
            cfg.accel.zero_rtt_window,
            register,
            metrics,
        ))
    });
    let register = listeners.and(window.as_ref().map(|w| w.describe()));
    Started { window, register }
}
