#!/usr/bin/env bash
# bench-bypass: plain loopback vs `splitway bypass`, alternating rounds in one
# run, with Debian's sockperf (ping-pong 64 B / 1 KB / 16 KB), redis-server +
# redis-benchmark (1 and 50 clients) and iperf3 (bulk, 1 KB / 16 KB / 128 KB
# writes). Every server and client runs in a cgroup this script creates; the
# bypass is enabled (for the benchmark ports only) in "bypass" rounds and
# disabled in "plain" rounds. Request/response runs in three placements of
# client and server on the CPUs (see client_cpus). Raw output:
# bench-results/bypass-bench-*.txt; summary: scripts/bench/bypass-bench-summary.py.
#
# The machine is shared: the run refuses to start at load average >= MAX_LOAD
# (default 3) unless FORCE=1, and records the load before and after.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/splitway}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
MAX_LOAD=${MAX_LOAD:-3}
PLACES=${PLACES:-any cpu1 cpu0}
# shellcheck source=lib/bypass-cg.sh
. scripts/bench/lib/bypass-cg.sh
# shellcheck source=lib/bypass-bench.sh
. scripts/bench/lib/bypass-bench.sh
bench_quiet_or_exit bench-bypass
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

bench_header bench-bypass "rounds $ROUNDS, ${SECS}s per measurement; placements $PLACES; columns: round mode test value unit" | tee "$out"

"$BIN" bypass disable >/dev/null
bypass_servers_up bench-bypass

# Where the client runs: the scheduler's choice (`any`), the other CPU
# from the server (`cpu1`: tcp_splice's "sender and receiver pinned to
# adjacent CPUs"), or the server's CPU (`cpu0`: a sidecar sharing a core).
# The servers are pinned to CPU 0 in every placement but `any`.
client_cpus() { case $1 in any) echo 0-1 ;; cpu1) echo 1 ;; cpu0) echo 0 ;; esac; }
server_cpus() { case $1 in any) echo 0-1 ;; *) echo 0 ;; esac; }

measure() { # round mode
  local r=$1 m=$2 place size len
  for place in $PLACES; do
    for pid in $SOCKPERF_PID $REDIS_PID; do taskset -apc "$(server_cpus "$place")" "$pid" >/dev/null; done
    for size in 64 1024 16384; do
      echo "$r $m sockperf_pp_${size}B_$place $(sockperf_pp_us "$(client_cpus "$place")" $size "$SECS") usec_half_rtt"
    done
    echo "$r $m redis_get_c1_$place $(redis_get_rps 1 20000 "$(client_cpus "$place")") req_per_s"
  done
  for pid in $SOCKPERF_PID $REDIS_PID; do taskset -apc 0-1 "$pid" >/dev/null; done
  echo "$r $m redis_get_c50 $(redis_get_rps 50 100000) req_per_s"
  for len in 1K 16K 128K; do
    echo "$r $m iperf3_${len} $(iperf3_gbit $len "$SECS") Gbit_s"
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
