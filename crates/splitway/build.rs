//! Release builds of the binary lay out their functions in the order an
//! idle relay first runs them (`startup-order.txt`, written by
//! `make startup-order`): the code a relay keeps mapped is then a few
//! contiguous 64 KB fault-around blocks instead of blocks all over .text.
//! Symbols the file names that no longer exist are skipped, so a stale file
//! costs locality, never a build.

fn main() {
    println!("cargo:rerun-if-changed=startup-order.txt");
    // Set to build the unordered binary a footprint comparison needs.
    println!("cargo:rerun-if-env-changed=SPLITWAY_NO_STARTUP_ORDER");
    let wanted = std::env::var_os("SPLITWAY_NO_STARTUP_ORDER").is_none();
    let order = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("startup-order.txt");
    // lld (rustc's default linker on this target) takes the option.
    let lld_target = std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-linux-gnu");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    if wanted && lld_target && release && order.exists() {
        println!(
            "cargo:rustc-link-arg-bin=splitway=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=splitway=-Wl,--no-warn-symbol-ordering");
    }
}
