#!/usr/bin/env bash
# Issue #17: cc-resume's split+es+pool row (pooled legs), splitway_resume vs
# cubic, alternating, each run's load in runs.jsonl.
# Usage: scripts/bench/cc-resume-pool.sh OUTDIR BINARY ROUNDS
set -u
out=$1 bin=$2 rounds=$3
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
    for cc in cubic splitway_resume; do
        name="split+es+pool-$cc-round$r"
        before=$(cat /proc/loadavg)
        SPLITWAY_BIN=$bin "$bin" lab scenario cc-resume --configs split+es+pool \
            --relay-congestion "$cc" --json "$out/$name.json" --out-dir /tmp/cc2-charts \
            >"$out/$name.log" 2>&1
        rc=$?
        printf '{"run": "%s", "exit": %s, "loadavg_before": "%s", "loadavg_after": "%s", "finished": "%s", "binary_sha256": "%s"}\n' \
            "$name" "$rc" "$before" "$(cat /proc/loadavg)" "$(date -u +%FT%TZ)" \
            "$(sha256sum "$bin" | cut -c1-16)" >>"$out/runs.jsonl"
    done
done
