#!/usr/bin/env bash
# Runs every splitway-proto fuzz target for N seconds each (default 60).
#   fuzz/run.sh [seconds]
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). Only a stable
# toolchain is assumed: RUSTC_BOOTSTRAP=1 unlocks the nightly flags cargo-fuzz
# passes (-Zsanitizer=address, coverage passes).
# New inputs go to corpus/<target>/ (git keeps only seed-*); crashes to artifacts/<target>/.
set -euo pipefail

seconds="${1:-60}"
case "$seconds" in
    '' | *[!0-9]*) echo "usage: $0 [seconds]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
targets=(header socks5 http_connect auth)

command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install cargo-fuzz --locked" >&2; exit 1; }

cargo fuzz build

failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    echo "=== $target: ${seconds}s"
    log="$(mktemp)"
    if cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)' "$log" || tail -n 3 "$log"
    else
        failed+=("$target")
        tail -n 40 "$log"
        echo "!!! $target FAILED (reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run $target artifacts/$target/<file>)"
    fi
    rm -f "$log"
done

if ((${#failed[@]})); then
    echo "fuzz failures: ${failed[*]}" >&2
    exit 1
fi
echo "all fuzz targets ran ${seconds}s without a crash"
