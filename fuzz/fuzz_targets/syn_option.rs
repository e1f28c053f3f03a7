//! cargo-fuzz target; the properties are in `checks/syn_option.rs`.
#![no_main]

#[path = "../checks/syn_option.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
