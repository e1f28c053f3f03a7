//! Link options of the `splitway` binary only.

fn main() {
    // Relative relocations packed as DT_RELR (glibc >= 2.36): the dynamic
    // loader reads a few KB instead of ~250 KB of .rela.dyn at every start.
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
