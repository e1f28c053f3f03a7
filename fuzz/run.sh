#!/usr/bin/env bash
# Runs the fuzz targets (splitway-proto's parsers and the relay config).
#   fuzz/run.sh [seconds] [target...]   each target for N seconds (default 60);
#                                       new inputs go to corpus/<target>/
#   fuzz/run.sh --ci [seconds]          CI smoke run: installs cargo-fuzz when
#                                       missing, every parser target for N
#                                       seconds (default 25), corpus/ left
#                                       untouched. `config` is left out (its
#                                       relay dependency takes ~15 min to build
#                                       with sanitizers); CI replays its corpus
#                                       in a stable test instead.
# Only a stable toolchain is assumed: RUSTC_BOOTSTRAP=1 unlocks the nightly
# flags cargo-fuzz passes (-Zsanitizer=address, coverage passes).
# git keeps only corpus/*/seed-*; crashes go to artifacts/<target>/.
set -euo pipefail

ci=0
if [[ "${1:-}" == "--ci" ]]; then
    ci=1
    shift
fi
seconds="${1:-$((ci ? 25 : 60))}"
case "$seconds" in
    '' | *[!0-9]*) echo "usage: $0 [--ci] [seconds] [target...]" >&2; exit 2 ;;
esac
shift || true
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
all=(header socks5 http_connect auth proxy_protocol syn_option config)
targets=("${all[@]}")
if ((ci)); then
    targets=(header socks5 http_connect auth proxy_protocol syn_option)
elif (($#)); then
    targets=("$@")
fi
features=()
if [[ " ${targets[*]} " == *" config "* ]]; then
    features=(--features config)
fi

started=$SECONDS
if ! command -v cargo-fuzz >/dev/null; then
    if ((ci)); then
        echo "=== installing cargo-fuzz"
        cargo install cargo-fuzz --locked
        echo "cargo-fuzz installed in $((SECONDS - started))s"
    else
        echo "cargo-fuzz missing: cargo install cargo-fuzz --locked (or: $0 --ci)" >&2
        exit 1
    fi
fi

phase=$SECONDS
cargo fuzz build "${features[@]}"
echo "fuzz targets built in $((SECONDS - phase))s"

scratch=""
if ((ci)); then
    # New inputs go to a scratch dir: a CI run must not grow the checkout.
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
fi

failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    corpora=("corpus/$target")
    if ((ci)); then
        mkdir -p "$scratch/$target"
        corpora=("$scratch/$target" "corpus/$target")
    fi
    dict=()
    if [[ -f "dict/$target.dict" ]]; then
        dict=("-dict=dict/$target.dict")
    fi
    echo "=== $target: ${seconds}s"
    log="$(mktemp)"
    if cargo fuzz run "${features[@]}" "$target" "${corpora[@]}" -- "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)' "$log" || tail -n 3 "$log"
    else
        failed+=("$target")
        tail -n 40 "$log"
        echo "!!! $target FAILED (reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run $target artifacts/$target/<file>)"
    fi
    rm -f "$log"
done

echo "total $((SECONDS - started))s"
if ((${#failed[@]})); then
    echo "fuzz failures: ${failed[*]}" >&2
    exit 1
fi
echo "all fuzz targets (${targets[*]}) ran ${seconds}s without a crash"
