//! One testbed for the lab, bench, soak and the integration tests:
//!
//! - `config`: typed relay configs (the relay's own raw layer), written
//!   with `toml` instead of TOML formatted by hand
//! - `chain`: a chain of network namespaces joined by veth pairs, with one
//!   addressing plan
//! - `probe`: what this host can do (root, namespaces, BPF attach)
//! - `proxy`: SOCKS5 and HTTP CONNECT client handshakes

pub mod chain;
pub mod config;
pub mod probe;
pub mod proxy;
