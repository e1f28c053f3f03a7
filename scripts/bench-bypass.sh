#!/usr/bin/env bash
# bench-bypass: plain loopback vs `splitway bypass`, alternating rounds in one
# run, with Debian's sockperf (ping-pong 64 B / 1 KB / 16 KB), redis-server +
# redis-benchmark (1 and 50 clients) and iperf3 (bulk, 1 KB / 16 KB / 128 KB
# writes). Every server and client runs in a cgroup this script creates; the
# bypass is enabled (for the benchmark ports only) in "bypass" rounds and
# disabled in "plain" rounds. Request/response runs in three placements of
# client and server on the CPUs (see client_cpus). Raw output:
# bench-results/bypass-bench-*.txt; summary: scripts/bypass-bench-summary.py.
#
# The machine is shared: the run refuses to start at load average >= MAX_LOAD
# (default 3) unless FORCE=1, and records the load before and after.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/splitway}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
MAX_LOAD=${MAX_LOAD:-3}
PLACES=${PLACES:-any cpu1 cpu0}
load=$(cut -d' ' -f1 /proc/loadavg)
if [ "${FORCE:-0}" != 1 ] && awk -v l="$load" -v m="$MAX_LOAD" 'BEGIN{exit !(l >= m)}'; then
  echo "bench-bypass: load average $load >= $MAX_LOAD; not a quiet window (FORCE=1 to run anyway)" >&2
  exit 2
fi
# shellcheck source=lib/bypass-cg.sh
. scripts/lib/bypass-cg.sh
bypass_cg_up bypass-bench
out="bench-results/bypass-bench-$(date -u +%Y%m%dT%H%M%SZ).txt"
P_SOCKPERF=23111 P_REDIS=23112 P_IPERF=23113
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  # Everything still in the cgroup (a client cut short) goes too, so that no
  # server of this run answers the next run's clients from outside it.
  bypass_cg_down
  wait 2>/dev/null
}
trap cleanup EXIT

{
  echo "# bench-bypass $(date -u +%FT%TZ)"
  echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
  echo "# kernel $(uname -r), $(nproc) cpus, load before $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# rounds $ROUNDS, ${SECS}s per measurement; placements $PLACES; columns: round mode test value unit"
} | tee "$out"

"$BIN" bypass disable >/dev/null
# A server left from another run would answer from outside this cgroup and
# never be paired: refuse rather than measure plain twice.
for port in $P_SOCKPERF $P_REDIS $P_IPERF; do
  if ss -Hltn "sport = :$port" | grep -q .; then
    echo "bench-bypass: port $port is already in use (a server left from another run?)" >&2
    exit 1
  fi
done
# Servers start once, inside the cgroup; only the connections made while the
# bypass is enabled are paired (pairing happens at ESTABLISHED).
incg_bg sockperf sr --tcp -i 127.0.0.1 -p $P_SOCKPERF >/dev/null 2>&1; pids+=($!); SOCKPERF_PID=$!
incg_bg redis-server --port $P_REDIS --save '' --appendonly no --bind 127.0.0.1 >/dev/null 2>&1
pids+=($!); REDIS_PID=$!
incg_bg iperf3 -s -p $P_IPERF -B 127.0.0.1 >/dev/null 2>&1; pids+=($!)
for _ in $(seq 50); do
  ss -ltn | grep -q ":$P_IPERF " && ss -ltn | grep -q ":$P_REDIS " && ss -ltn | grep -q ":$P_SOCKPERF " && break
  sleep 0.1
done

# Where the client runs: the scheduler's choice (`any`), the other CPU
# from the server (`cpu1`: tcp_splice's "sender and receiver pinned to
# adjacent CPUs"), or the server's CPU (`cpu0`: a sidecar sharing a core).
# The servers are pinned to CPU 0 in every placement but `any`.
client_cpus() { case $1 in any) echo 0-1 ;; cpu1) echo 1 ;; cpu0) echo 0 ;; esac; }
server_cpus() { case $1 in any) echo 0-1 ;; *) echo 0 ;; esac; }

measure() { # round mode
  local r=$1 m=$2 v place
  for place in $PLACES; do
    for pid in $SOCKPERF_PID $REDIS_PID; do taskset -apc "$(server_cpus "$place")" "$pid" >/dev/null; done
    for size in 64 1024 16384; do
      v=$(incg taskset -c "$(client_cpus "$place")" sockperf pp --tcp -i 127.0.0.1 -p $P_SOCKPERF \
        -m $size -t "$SECS" 2>&1 | awk '/Summary: Latency is/ {print $5}')
      # sockperf reports latency as half the average round trip (lower is
      # better); transactions/s of one ping-pong stream = 1e6 / (2 * value).
      echo "$r $m sockperf_pp_${size}B_$place ${v:-FAIL} usec_half_rtt"
    done
    v=$(incg taskset -c "$(client_cpus "$place")" redis-benchmark -p $P_REDIS -c 1 -n 20000 -t get -q 2>&1 |
      tr '\r' '\n' | awk '/GET:/ && /requests per second/ {v=$2} END {print v}')
    echo "$r $m redis_get_c1_$place ${v:-FAIL} req_per_s"
  done
  for pid in $SOCKPERF_PID $REDIS_PID; do taskset -apc 0-1 "$pid" >/dev/null; done
  v=$(incg redis-benchmark -p $P_REDIS -c 50 -n 100000 -t get -q 2>&1 |
    tr '\r' '\n' | awk '/GET:/ && /requests per second/ {v=$2} END {print v}')
  echo "$r $m redis_get_c50 ${v:-FAIL} req_per_s"
  for len in 1K 16K 128K; do
    v=$(incg iperf3 -c 127.0.0.1 -p $P_IPERF -t "$SECS" -l $len -J 2>&1 |
      python3 -c 'import json,sys
try:
    d=json.load(sys.stdin); print(round(d["end"]["sum_received"]["bits_per_second"]/1e9,3))
except Exception as e: print("FAIL")')
    echo "$r $m iperf3_${len} ${v} Gbit_s"
  done
}

for r in $(seq "$ROUNDS"); do
  "$BIN" bypass disable >/dev/null
  measure "$r" plain | tee -a "$out"
  "$BIN" bypass enable --cgroup "$cg" --loopback-only --ports $P_SOCKPERF,$P_REDIS,$P_IPERF >/dev/null
  measure "$r" bypass | tee -a "$out"
  "$BIN" bypass status --json | tr -d '\n ' | sed 's/^/# status after round: /' | tee -a "$out"
  echo | tee -a "$out"
done
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
echo "wrote $out" >&2
