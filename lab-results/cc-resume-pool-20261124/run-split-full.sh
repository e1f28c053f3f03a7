#!/usr/bin/env bash
# split row of cc-resume with the TX_START splitway_resume, cubic alongside.
set -u
out=lab-results/cc-resume-pool-20261124 bin=/tmp/cc2-resume-bin

for cfg in full split; do for cc in cubic splitway_resume; do
    name="$cfg-$cc"; [[ $cfg == split ]] && name="$cfg-$cc-round2"
    before=$(cat /proc/loadavg)
    SPLITWAY_BIN=$bin "$bin" lab scenario cc-resume --configs "$cfg" \
        --relay-congestion "$cc" --json "$out/$name.json" --out-dir /tmp/cc2-charts >"$out/$name.log" 2>&1
    rc=$?
    printf '{"run": "%s", "exit": %s, "loadavg_before": "%s", "loadavg_after": "%s", "finished": "%s", "binary_sha256": "%s"}\n' \
        "$name" "$rc" "$before" "$(cat /proc/loadavg)" "$(date -u +%FT%TZ)" "$(sha256sum "$bin" | cut -c1-16)" >>"$out/runs.jsonl"
done; done
