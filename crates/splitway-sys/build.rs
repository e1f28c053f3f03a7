//! Compiles the BPF programs in `<workspace>/bpf/*.c` (shared headers in
//! `bpf/include/`) into `OUT_DIR` with clang (`-target bpf`, with BTF), so
//! `src/bpf/<name>.rs` can embed `<name>.o`.
//!
//! A missing clang is a build failure, not a stub: a relay built without its
//! BPF object would only fail later, at run time, on another machine.
//! `SPLITWAY_BPF_SKIP=1` asks for that stub explicitly (a type check or a
//! build on a machine without clang and libbpf): every object is written
//! empty, libbpf is not linked, and `cfg(splitway_bpf_skip)` makes each
//! loader fail at run time with "built without BPF programs".

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let bpf_dir = manifest_dir.join("../../bpf");
    let include_dir = bpf_dir.join("include");
    let out_dir = PathBuf::from(env("OUT_DIR"));
    let clang = std::env::var("SPLITWAY_CLANG").unwrap_or_else(|_| "clang".to_owned());
    println!("cargo:rerun-if-env-changed=SPLITWAY_CLANG");
    println!("cargo:rerun-if-env-changed=SPLITWAY_BPF_SKIP");
    println!("cargo::rustc-check-cfg=cfg(splitway_bpf_skip)");
    let skip = std::env::var("SPLITWAY_BPF_SKIP").is_ok_and(|v| v == "1");
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    println!("cargo:rerun-if-changed={}", include_dir.display());

    // Shared headers (packet parsing, the congestion controls' core): any
    // change rebuilds every program.
    for header in files(&include_dir, "h") {
        println!("cargo:rerun-if-changed={}", header.display());
    }
    // One program a file; `src/bpf/<name>.rs` embeds `<name>.o`.
    let sources = files(&bpf_dir, "c");
    assert!(
        !sources.is_empty(),
        "no BPF sources (*.c) in {}",
        bpf_dir.display()
    );
    // What `splitway --version` lists as built: none when skipped.
    let names: Vec<String> = sources
        .iter()
        .filter(|_| !skip)
        .filter_map(|s| Some(s.file_stem()?.to_str()?.to_owned()))
        .collect();
    println!("cargo:rustc-env=SPLITWAY_BPF_PROGRAMS={}", names.join(","));
    if skip {
        // Empty objects keep every `include_bytes!` resolving; the loaders
        // check the cfg before parsing them.
        for source in &sources {
            let stem = source.file_stem().expect("source has a file name");
            let object = out_dir.join(stem).with_extension("o");
            std::fs::write(&object, b"")
                .unwrap_or_else(|e| panic!("writing {}: {e}", object.display()));
        }
        println!("cargo:rustc-cfg=splitway_bpf_skip");
        println!(
            "cargo:warning=SPLITWAY_BPF_SKIP=1: built without BPF programs (early SYN, the agent, bypass and the shipped congestion controls fail at run time)"
        );
        return;
    }
    for source in &sources {
        println!("cargo:rerun-if-changed={}", source.display());
        compile(&clang, source, &include_dir, &out_dir);
    }
    // The congestion controls (struct_ops) are loaded through libbpf.
    link_libbpf();
}

/// The files of `dir` ending in `.ext`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read BPF source dir {}: {e}", dir.display()))
        .map(|entry| entry.expect("read_dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    found.sort();
    found
}

/// Links Debian's libbpf (libbpf-dev) statically, with the libelf and zlib
/// it uses (libelf-dev, zlib1g-dev ship the archives): the binary needs
/// neither libbpf1, libelf1 nor zlib1g at run time, and every start skips
/// loading two shared libraries. See docs/congestion.md.
fn link_libbpf() {
    println!("cargo:rerun-if-env-changed=SPLITWAY_LIBBPF_DIR");
    let dir = std::env::var("SPLITWAY_LIBBPF_DIR")
        .map(PathBuf::from)
        .ok()
        .or_else(|| {
            let triple = multiarch_triple()?;
            let dir = Path::new("/usr/lib").join(triple);
            dir.join("libbpf.a").is_file().then_some(dir)
        });
    match dir {
        Some(dir) => println!("cargo:rustc-link-search=native={}", dir.display()),
        None => panic!(
            "\n\nsplitway-sys: libbpf.a not found (set SPLITWAY_LIBBPF_DIR).\n\
             Run `./scripts/install-deps.sh` (libbpf-dev, libelf-dev, zlib1g-dev) and build again.\n"
        ),
    }
    println!("cargo:rustc-link-lib=static=bpf");
    println!("cargo:rustc-link-lib=static=elf");
    println!("cargo:rustc-link-lib=static=z");
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("cargo did not set {key}"))
}

fn compile(clang: &str, source: &Path, include_dir: &Path, out_dir: &Path) {
    let stem = source.file_stem().expect("source has a file name");
    let object = out_dir.join(stem).with_extension("o");
    let mut cmd = Command::new(clang);
    cmd.args(["-O2", "-g", "-Wall", "-target", "bpf"]);
    cmd.arg("-I").arg(include_dir);
    // <linux/bpf.h> includes <asm/types.h>, which Debian keeps under the
    // multiarch directory that `-target bpf` does not search by itself.
    if let Some(dir) = multiarch_include_dir() {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg("-c").arg(source).arg("-o").arg(&object);
    let output = match cmd.output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "\n\nsplitway-sys: `{clang}` not found; it compiles the BPF programs in bpf/.\n\
             Run `./scripts/install-deps.sh` (installs clang, llvm and libbpf-dev) and build again,\n\
             or set SPLITWAY_BPF_SKIP=1 to build without the BPF programs.\n"
        ),
        Err(e) => panic!("splitway-sys: running {clang}: {e}"),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("bpf/bpf_helpers.h") || stderr.contains("asm/types.h") {
            "\nMissing headers: run `./scripts/install-deps.sh` (libbpf-dev, linux-libc-dev).\n"
        } else {
            ""
        };
        panic!(
            "\n\nsplitway-sys: {cmd:?} failed ({}):\n{stderr}{hint}",
            output.status
        );
    }
    // Not -Werror (a newer clang may add warnings), but never silent.
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        println!("cargo:warning={line}");
    }
}

fn multiarch_include_dir() -> Option<PathBuf> {
    // Host headers are what the kernel UAPI includes resolve to; the BPF
    // object itself is target-independent.
    let dir = Path::new("/usr/include").join(multiarch_triple()?);
    dir.is_dir().then_some(dir)
}

fn multiarch_triple() -> Option<&'static str> {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").ok()?;
    Some(match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "x86" => "i386-linux-gnu",
        "arm" => "arm-linux-gnueabihf",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        _ => return None,
    })
}
