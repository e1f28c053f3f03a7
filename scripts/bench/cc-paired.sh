#!/usr/bin/env bash
# Issue #17 measurements: cc-parity paired by loss seed (common random
# numbers: cubic and splitway_cubic see the same emulator loss decisions for
# seed k), then njit-lossy's split row per relay algorithm. Each run's load
# is recorded in runs.jsonl. Usage: scripts/bench/cc-paired.sh OUTDIR NSEEDS STOP_HHMM
# (no new parity pair starts after STOP_HHMM UTC, so njit-lossy still runs).
set -u
out=$1 seeds=$2 stop=$3
# The binary is copied first so rebuilds during the runs do not change it;
# njit-lossy uses $NJIT_BIN if that file exists when it starts.
bin=${PARITY_BIN:-./target/release/splitway}
njit_bin=${NJIT_BIN:-}
mkdir -p "$out"
log() {  # name exit before after
    printf '{"run": "%s", "exit": %s, "loadavg_before": "%s", "loadavg_after": "%s", "finished": "%s", "binary_sha256": "%s"}\n' \
        "$1" "$2" "$3" "$4" "$(date -u +%FT%TZ)" "$(sha256sum "$bin" | cut -c1-16)" >>"$out/runs.jsonl"
}
one() {  # name args...
    local name=$1; shift
    local before; before=$(cat /proc/loadavg)
    SPLITWAY_BIN=$bin "$bin" lab "$@" >"$out/$name.log" 2>&1
    local rc=$?
    log "$name" "$rc" "$before" "$(cat /proc/loadavg)"
}
for k in $(seq 1 "$seeds"); do
    if [[ $(date -u +%H%M) > $stop ]]; then
        echo "stop time $stop reached before seed $k" >>"$out/runs.jsonl.note"
        break
    fi
    for cc in cubic splitway_cubic; do
        one "parity-$cc-seed$k" scenario cc-parity --configs split --reps 1 \
            --relay-congestion "$cc" --loss-seed "$k" --json "$out/parity-$cc-seed$k.json" --out-dir /tmp/cc2-charts
    done
done
if [[ -n $njit_bin && -x $njit_bin ]]; then bin=$njit_bin; fi
for cc in bbr reno cubic splitway_cubic splitway_resume; do
    one "njit-$cc" scenario njit-lossy --configs split \
        --relay-congestion "$cc" --json "$out/njit-lossy-$cc.json" --out-dir /tmp/cc2-charts
done
