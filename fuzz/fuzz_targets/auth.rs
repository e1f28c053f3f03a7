//! cargo-fuzz target; the properties are in `checks/auth.rs`.
#![no_main]

#[path = "../checks/auth.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
