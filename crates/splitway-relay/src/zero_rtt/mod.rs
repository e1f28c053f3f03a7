//! 0-RTT peer Hellos (`[accel] zero_rtt`), issue #31's room: for now its
//! status line (`plan`). The Hello itself is still dialed and taken in
//! `peer/` (`dial_hello`, `HelloWindow`, `Unconfirmed`), and its outcomes
//! are counted in splitway-control's `zero_rtt_total`.

pub mod plan;
