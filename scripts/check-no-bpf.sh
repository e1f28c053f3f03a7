#!/usr/bin/env bash
# `SPLITWAY_BPF_SKIP=1 cargo check --workspace` on a machine without clang
# (issue #31); with `--test`, builds and runs splitway-sys's skip test
# instead. PATH is rebuilt from the current one as symlinks with every
# clang* left out, and SPLITWAY_CLANG and SPLITWAY_LIBBPF_DIR point nowhere,
# so a build script that still reached for clang or libbpf would fail.
# Its own target dir: the skip changes splitway-sys's build-script output,
# and sharing target/ would rebuild every crate above it on each switch. A
# fresh one is seeded with the dependencies `make lint`'s clippy just
# checked (same flags, so the same units): only the workspace is checked
# again, not its ~300 dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
main=${CARGO_TARGET_DIR:-target}
target=$main/no-bpf
if [[ ! -d $target/debug && -d $main/debug/.fingerprint ]]; then
    mkdir -p "$target/debug/deps"
    cp -a "$main/debug/.fingerprint" "$main/debug/build" "$target/debug/"
    find "$main/debug/deps" -maxdepth 1 \( -name '*.rmeta' -o -name '*.so' -o -name '*.d' \) \
        -exec cp -a -t "$target/debug/deps/" {} +
fi
mkdir -p "$target"
target=$(cd "$target" && pwd) # absolute: rustc runs in each crate's directory
bin=$target/bin-without-clang
rm -rf "$bin"
mkdir -p "$bin"
IFS=: read -r -a dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
    for f in "$dir"/*; do
        name=${f##*/}
        case $name in clang*) continue ;; esac
        if [[ -x $f && ! -e $bin/$name ]]; then
            ln -s "$f" "$bin/$name"
        fi
    done
done
if PATH=$bin command -v clang >/dev/null; then
    echo "check-no-bpf: clang is still on the rebuilt PATH" >&2
    exit 1
fi
cargo=$(command -v "${CARGO:-cargo}")
skip=(env PATH="$bin" SPLITWAY_BPF_SKIP=1 SPLITWAY_CLANG=/nonexistent/clang
    SPLITWAY_LIBBPF_DIR=/nonexistent CARGO_TARGET_DIR="$target" "$cargo")
if [[ ${1:-} == --test ]]; then
    # By hand: builds splitway-sys's tests without clang or libbpf (its
    # dependencies in full, a few minutes the first time) and runs the one
    # that checks what the loaders report.
    exec "${skip[@]}" test -p splitway-sys --lib -- a_skipped_build_names_the_skip
fi
log=$target/check.log
# Warnings fail the check, read from the output: RUSTFLAGS=-Dwarnings would
# change every unit's flags and so rebuild the seeded dependencies.
"${skip[@]}" check --workspace 2>&1 | tee "$log"
if grep '^warning' "$log" | grep -v '^warning: splitway-sys@.*: SPLITWAY_BPF_SKIP=1'; then
    echo "check-no-bpf: warnings in a build without BPF programs" >&2
    exit 1
fi
echo "check-no-bpf: the workspace type-checks with SPLITWAY_BPF_SKIP=1 and no clang on PATH"
