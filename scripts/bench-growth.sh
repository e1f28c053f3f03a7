#!/usr/bin/env bash
# bench-growth: how a relay's cost grows (issue #21), splitway beside HAProxy
# on the same work (TPROXY on the relay host, scripts/lib/tproxy-rig.sh),
# and the relay pair (rc + rs) with each relay's own cost:
#   cpu     proxy CPU-seconds per GB against 1–64 parallel streams (iperf3);
#   memory  proxy RSS against open idle connections (`splitway lab load
#           idle`, each connection one 64 B exchange, then held);
#   setup   setup latency p50/p99 (connect to first response byte) against
#           new connections per second, open loop (`splitway lab load rate`).
# Methods alternate at every point. Raw rows in
# bench-results/growth-<stamp>.txt (round method test x value unit); the
# charts (SVG) are drawn from that file by scripts/growth-svg.py.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/target/release/splitway}
ROUNDS=${ROUNDS:-2}
SECS=${SECS:-4}
STREAMS=${STREAMS:-1 2 4 8 16 32 64}
# RLIMIT_NOFILE's hard limit is 20,000 here and a proxy holds 2 fds per
# connection, so the memory sweep stops below 10,000 (issue asks to 18k).
OPEN=${OPEN:-1000 2000 4000 6000 8000 8900}
RATES=${RATES:-100 200 500 1000 2000 5000}
P=swbg$$
dir=$(mktemp -d /tmp/$P.XXXX)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="bench-results/growth-$stamp.txt"
mkdir -p bench-results
# shellcheck source=scripts/lib/tproxy-rig.sh
source scripts/lib/tproxy-rig.sh
rig_up || exit 1

# Rows for every proxy process of the method: `pair` reports rc and rs
# apart (method pair-rc, pair-rs) and their sum (pair).
names_of() { case $1 in pair) echo "pair-rs pair-rc" ;; *) echo "$1" ;; esac; }

cpu_point() { # round method streams
  local r=$1 m=$2 n=$3 bytes v i
  local -a t0=() names
  read -ra names <<< "$(names_of "$m")"
  for i in "${!proxy_pids[@]}"; do t0[i]=$(cpu_ticks "${proxy_pids[i]}"); done
  read -r v bytes < <(iperf3_bulk -P "$n")
  echo "$r $m gbit_s $n ${v:-FAIL} Gbit_s"
  [ "$m" = direct ] && return
  local sum=0 d
  for i in "${!proxy_pids[@]}"; do
    d=$(($(cpu_ticks "${proxy_pids[i]}") - t0[i]))
    sum=$((sum + d))
    [ "${#proxy_pids[@]}" -gt 1 ] && echo "$r ${names[i]} cpu_per_gb $n $(cpu_per_gb "$d" "${bytes:-}") cpu_s_per_GB"
  done
  echo "$r $m cpu_per_gb $n $(cpu_per_gb "$sum" "${bytes:-}") cpu_s_per_GB"
}

rss_rows() { # round method x
  local r=$1 m=$2 x=$3 i sum=0 v
  local -a names
  read -ra names <<< "$(names_of "$m")"
  for i in "${!proxy_pids[@]}"; do
    v=$(rss_kb "${proxy_pids[i]}")
    sum=$((sum + v))
    [ "${#proxy_pids[@]}" -gt 1 ] && echo "$r ${names[i]} rss_kb $x $v kB"
  done
  echo "$r $m rss_kb $x $sum kB"
}

memory_sweep() { # round method
  local r=$1 m=$2 have=0 want line k
  local -a holders=()
  rss_rows "$r" "$m" 0
  for want in $OPEN; do
    k=$((want - have))
    # Each holder keeps its connections until its stdin (a fifo) closes.
    mkfifo "$dir/hold-$want"
    nsx $C "$BIN" lab load idle --target $SIP:9003 --count "$k" <"$dir/hold-$want" >"$dir/idle-$want.out" 2>&1 &
    holders+=($!)
    exec {fd}>"$dir/hold-$want"
    eval "hold_fd_$want=$fd"
    for _ in $(seq 600); do grep -q '^open=' "$dir/idle-$want.out" && break; kill -0 "${holders[-1]}" 2>/dev/null || break; sleep 0.1; done
    line=$(grep '^open=' "$dir/idle-$want.out")
    if [ "$line" != "open=$k" ]; then
      echo "$r $m rss_kb $want FAIL kB"
      sed 's/^/# idle: /' "$dir/idle-$want.out" | tail -2
      break
    fi
    have=$want
    # Let the proxies settle (buffers of the last connections) before reading RSS.
    sleep 1
    rss_rows "$r" "$m" "$want"
  done
  for want in $OPEN; do
    fd=$(eval "echo \${hold_fd_$want:-}")
    [ -n "$fd" ] && exec {fd}>&-
    unset "hold_fd_$want"
    rm -f "$dir/hold-$want"
  done
  for p in "${holders[@]}"; do wait "$p" 2>/dev/null; done
}

setup_point() { # round method rate
  local r=$1 m=$2 rate=$3 line key unit
  line=$(setup_rate "$rate" "$SECS")
  for key in achieved:conn_s p50_us:us p99_us:us failures:count; do
    unit=${key#*:}
    key=${key%%:*}
    echo "$r $m setup_$key $rate $(kv "$line" "$key") $unit"
  done
}

{
  echo "# bench-growth $(date -u +%FT%TZ)"
  echo "# commit $(git rev-parse --short=12 HEAD)$(git diff --quiet || echo -dirty)"
  echo "# kernel $(uname -r), $(nproc) cpus, load before $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $("$BIN" --version 2>/dev/null), $(haproxy -v 2>/dev/null | head -1), iperf3 $(iperf3 --version | head -1 | cut -d' ' -f2)"
  echo "# rounds $ROUNDS, ${SECS}s per point; streams: $STREAMS; open: $OPEN; rates: $RATES"
  echo "# columns: round method test x value unit"
} | tee "$out"

methods=(${METHODS:-splitway haproxy pair})
for r in $(seq "$ROUNDS"); do
  for ((i = 0; i < ${#methods[@]}; i++)); do
    m=${methods[$(((i + r) % ${#methods[@]}))]}
    start_proxy "$m" || { echo "$r $m start FAIL" | tee -a "$out"; continue; }
    {
      for n in $STREAMS; do cpu_point "$r" "$m" "$n"; done
      for rate in $RATES; do setup_point "$r" "$m" "$rate"; done
      memory_sweep "$r" "$m"
      proxies_alive || echo "$r $m proxy_alive x FAIL exited"
    } | tee -a "$out"
    stop_proxy
  done
done
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
python3 scripts/growth-svg.py "$out" || exit 1
grep -q "FAIL" "$out" && { echo "bench-growth: a measurement failed (see $out)" >&2; exit 1; }
exit 0
