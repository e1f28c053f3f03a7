//! splitway wire protocols, sans-I/O: the relay↔relay header and reply, peer
//! authentication, SOCKS5, HTTP CONNECT, proxy clients' credentials, the PROXY protocol and the
//! destination TCP option.
//!
//! Nothing here reads a socket, spawns a task or draws random numbers; callers
//! feed bytes in and pass nonces explicitly, so every state machine is
//! deterministic and testable byte by byte.
//!
//! Every decoder is incremental with the same contract:
//! `Ok(None)` = need more bytes; `Ok(Some((value, consumed)))` = a complete
//! frame at the start of the buffer (bytes after `consumed` belong to the
//! caller); `Err` = malformed, final — more bytes never turn it into success.
//! Every decoder has a hard size limit and fails, rather than waiting, once
//! the input reaches it without completing.
//!
//! The byte layouts are specified in `docs/protocol.md`.

pub mod addr;
pub mod auth;
pub mod header;
pub mod http_connect;
pub mod proxy_auth;
pub mod proxy_protocol;
pub mod socks5;
pub mod syn_option;
pub mod zero_rtt;

pub use addr::Destination;
