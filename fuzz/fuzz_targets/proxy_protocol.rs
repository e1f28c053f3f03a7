//! cargo-fuzz target; the properties are in `checks/proxy_protocol.rs`.
#![no_main]

#[path = "../checks/proxy_protocol.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
