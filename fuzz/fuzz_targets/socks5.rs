//! cargo-fuzz target; the properties are in `checks/socks5.rs`.
#![no_main]

#[path = "../checks/socks5.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
