//! Release builds of the relay binary (`splitway-relay`, what the unit and
//! the image run) lay out their functions in the order an idle relay first
//! runs them (`startup-order.txt`, written by
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
            "cargo:rustc-link-arg-bin=splitway-relay=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=splitway-relay=-Wl,--no-warn-symbol-ordering");
    }
    // Relative relocations packed as DT_RELR: the loader applies the same
    // ~10,000 of them from a 3 KB bitmap instead of a 240 KB table (exec to
    // listening 2.06 against 2.13 ms, idle RSS 5.7 against 5.9 MB, measured
    // side by side: bench-results/footprint-relr-20261127T0814Z.txt). The binary then
    // needs glibc 2.36 or later: taken only where the building host has it,
    // and SPLITWAY_NO_RELR=1 builds for an older one.
    println!("cargo:rerun-if-env-changed=SPLITWAY_NO_RELR");
    if lld_target && std::env::var_os("SPLITWAY_NO_RELR").is_none() && host_glibc_has_relr() {
        println!("cargo:rustc-link-arg-bin=splitway-relay=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this host's glibc (`getconf GNU_LIBC_VERSION`: "glibc 2.36")
/// loads DT_RELR, which it does from 2.36 on.
fn host_glibc_has_relr() -> bool {
    let Ok(out) = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut version = text
        .trim()
        .strip_prefix("glibc ")
        .unwrap_or_default()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}
