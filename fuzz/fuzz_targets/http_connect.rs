//! cargo-fuzz target; the properties are in `checks/http_connect.rs`.
#![no_main]

#[path = "../checks/http_connect.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
