//! cargo-fuzz target; the properties are in `checks/config.rs`.
#![no_main]

#[path = "../checks/config.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
