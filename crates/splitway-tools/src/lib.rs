//! The host tools (issue #31: one binary per product): `agent`, which puts
//! the destination in the SYN of a client host's connections, and
//! `bypass`, which pairs co-located sockets in the kernel. Neither needs
//! the relay or the lab; the `splitway-tools` binary carries them, and the
//! `splitway` front mounts the same commands.

pub mod agent;
pub mod bypass;
pub mod cli;
