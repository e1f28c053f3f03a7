#!/usr/bin/env bash
# bypass-floor: how much of the sk_msg bypass's request/response gain is left
# to take, and what its read counter costs. Alternating rounds of five modes
# on loopback, in one run:
#   plain   no bypass;
#   counter `splitway bypass enable` for another port: nothing here is
#           paired, only the host-wide read counter runs;
#   bypass  `splitway bypass enable` (bpf/bypass.c: ordering rules, the read
#           counter, statistics);
#   floor   scripts/bench/lib/bypass-floor.c: every send of a paired socket
#           redirected, the least work an sk_msg program can do. Not safe
#           for streams; request/response only, and never part of splitway;
#   hook    scripts/bench/lib/recv-hook.c: a program that does nothing on the
#           read counter's tracepoint (what its dispatch alone costs).
# MODES picks some (default: all); PLACES="" leaves only the bulk test.
# Debian's sockperf (ping-pong 64 B / 1 KB / 16 KB) and redis-benchmark (GET,
# one client), client and server on one CPU (`cpu0`) and on two (`cpu1`),
# as in scripts/bench/bench-bypass.sh, and iperf3 bulk with 1 KB writes (not in
# `floor`, which redirects every write of a stream). Raw output:
# bench-results/bypass-floor-*.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/splitway}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
MAX_LOAD=${MAX_LOAD:-3}
PLACES=${PLACES-cpu0 cpu1}
read -ra modes <<< "${MODES:-plain counter bypass floor hook}"
# shellcheck source=lib/bypass-cg.sh
. scripts/bench/lib/bypass-cg.sh
# shellcheck source=lib/bypass-bench.sh
. scripts/bench/lib/bypass-bench.sh
bench_quiet_or_exit bypass-floor
P_SOCKPERF=23121 P_REDIS=23122 P_IPERF=23123 P_UNUSED=23129
pin="/sys/fs/bpf/swfloor-$$"
tmp=$(mktemp -d /tmp/swfloor.XXXXXX)
obj=$tmp/floor.o
clang -O2 -g -target bpf -DFLOOR_PORT_MIN=$P_SOCKPERF -DFLOOR_PORT_MAX=$P_REDIS \
  -I"/usr/include/$(uname -m)-linux-gnu" -c scripts/bench/lib/bypass-floor.c -o "$obj" || exit 1
clang -O2 -g -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
  -c scripts/bench/lib/recv-hook.c -o "$tmp/recv-hook.o" || exit 1
gcc -O2 -Wall scripts/bench/lib/bpf-attach.c -o "$tmp/bpf-attach" -lbpf || exit 1
bypass_cg_up bypass-floor
out="bench-results/bypass-floor-$(date -u +%Y%m%dT%H%M%SZ).txt"
pids=()
floor_off() {
  [ -d "$pin" ] || return 0
  bpftool prog detach pinned "$pin/floor_msg" msg_verdict pinned "$pin/maps/FLOOR_SOCKS" 2>/dev/null
  bpftool cgroup detach "$cg" sock_ops pinned "$pin/floor_sockops" 2>/dev/null
  rm -rf "$pin"
}
floor_on() {
  mkdir -p "$pin/maps" &&
    bpftool prog loadall "$obj" "$pin" pinmaps "$pin/maps" &&
    bpftool cgroup attach "$cg" sock_ops pinned "$pin/floor_sockops" &&
    bpftool prog attach pinned "$pin/floor_msg" msg_verdict pinned "$pin/maps/FLOOR_SOCKS"
}
# The hook stays attached while bpf-attach's stdin (a fifo) is open.
hook_fd=
hook_on() {
  mkfifo "$tmp/hook.fifo"
  "$tmp/bpf-attach" "$tmp/recv-hook.o" <"$tmp/hook.fifo" >"$tmp/hook.out" 2>&1 &
  hook_pid=$!
  exec {hook_fd}>"$tmp/hook.fifo"
  for _ in $(seq 50); do grep -q attached "$tmp/hook.out" && return 0; kill -0 $hook_pid 2>/dev/null || break; sleep 0.1; done
  cat "$tmp/hook.out" >&2
  return 1
}
hook_off() {
  [ -n "$hook_fd" ] || return 0
  exec {hook_fd}>&-
  hook_fd=
  wait "$hook_pid" 2>/dev/null
  rm -f "$tmp/hook.fifo"
}
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  floor_off
  bypass_cg_down
  hook_off
  rm -rf "$tmp"
  wait 2>/dev/null
}
trap cleanup EXIT

bench_header bypass-floor "rounds $ROUNDS, ${SECS}s per measurement; modes ${modes[*]}; placements ${PLACES:-none}; columns: round mode test value unit" | tee "$out"

"$BIN" bypass disable >/dev/null
bypass_servers_up bypass-floor

client_cpus() { case $1 in cpu1) echo 1 ;; cpu0) echo 0 ;; esac; }

measure() { # round mode
  local r=$1 m=$2 place size
  for place in $PLACES; do
    for pid in $SOCKPERF_PID $REDIS_PID; do taskset -apc 0 "$pid" >/dev/null; done
    for size in 64 1024 16384; do
      echo "$r $m sockperf_pp_${size}B_$place $(sockperf_pp_us "$(client_cpus "$place")" $size "$SECS") usec_half_rtt"
    done
    echo "$r $m redis_get_c1_$place $(redis_get_rps 1 50000 "$(client_cpus "$place")") req_per_s"
  done
  [ "$m" = floor ] && return
  for pid in $SOCKPERF_PID $REDIS_PID; do taskset -apc 0-1 "$pid" >/dev/null; done
  echo "$r $m iperf3_1K $(iperf3_gbit 1K "$SECS") Gbit_s"
}

run_mode() { # round mode
  case $2 in
    plain) measure "$1" plain | tee -a "$out" ;;
    counter)
      "$BIN" bypass enable --cgroup "$cg" --loopback-only --ports $P_UNUSED >/dev/null
      measure "$1" counter | tee -a "$out"
      "$BIN" bypass disable >/dev/null
      ;;
    bypass)
      "$BIN" bypass enable --cgroup "$cg" --loopback-only --ports $P_SOCKPERF,$P_REDIS,$P_IPERF >/dev/null
      measure "$1" bypass | tee -a "$out"
      "$BIN" bypass status --json | tr -d '\n ' | sed 's/^/# bypass status after round: /' | tee -a "$out"
      echo | tee -a "$out"
      "$BIN" bypass disable >/dev/null
      ;;
    floor)
      floor_on || { echo "bypass-floor: loading the floor program failed" >&2; exit 1; }
      measure "$1" floor | tee -a "$out"
      echo "# floor sockhash after round: $(bpftool map dump pinned "$pin/maps/FLOOR_SOCKS" 2>&1 | tail -1)" | tee -a "$out"
      floor_off
      ;;
    hook)
      hook_on || { echo "bypass-floor: attaching the empty hook failed" >&2; exit 1; }
      measure "$1" hook | tee -a "$out"
      hook_off
      ;;
  esac
}

# The modes' order rotates every round, so none always runs first.
n=${#modes[@]}
for r in $(seq "$ROUNDS"); do
  for ((i = 0; i < n; i++)); do run_mode "$r" "${modes[$(((i + r - 1) % n))]}"; done
done
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
grep -q FAIL "$out" && { echo "bypass-floor: a measurement failed (see $out)" >&2; exit 1; }
echo "wrote $out" >&2
