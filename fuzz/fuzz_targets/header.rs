//! cargo-fuzz target; the properties are in `checks/header.rs`.
#![no_main]

#[path = "../checks/header.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
