#!/usr/bin/env bash
# bench-growth: how a relay's cost grows (issue #21), splitway beside HAProxy
# on the same work (TPROXY on the relay host, scripts/bench/lib/tproxy-rig.sh),
# and the relay pair (rc + rs) with each relay's own cost:
#   cpu     proxy CPU-seconds per GB against 1–64 parallel streams (iperf3);
#   setup   setup latency p50/p99 (connect to first response byte) against
#           new connections per second, open loop (`splitway lab load rate`);
#   memory  proxy RSS against 1,000–18,000 open idle connections (`splitway
#           lab load idle`, each connection one 64 B exchange, then held).
# cpu and setup run one process per relay (start_proxy). A process holds 2
# descriptors per connection and RLIMIT_NOFILE's hard limit is 20,000 here
# (not raisable without CAP_SYS_RESOURCE), so one process holds fewer than
# 10,000: for memory every proxy process runs as two copies (start_split),
# each intercepting one of two server ports (9003, 9004) and holding the
# half of the connections the client opens to it. Memory rows are the sum
# over the copies (<method>; the pair also pair-rc and pair-rs), with each
# copy apart (<name>.a, <name>.b: RSS and open descriptors); the copies
# start fresh, so the sums at 0 connections are two idle processes.
# Methods alternate at every point. Raw rows in
# bench-results/growth-<stamp>.txt (round method test x value unit); the
# charts (SVG) and least-squares slopes are drawn from that file by
# scripts/bench/growth-svg.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/target/release/splitway}
ROUNDS=${ROUNDS:-2}
SECS=${SECS:-4}
STREAMS=${STREAMS:-1 2 4 8 16 32 64}
# Open connections in all, half through each copy (see above).
OPEN=${OPEN:-1000 2000 4000 8000 12000 16000 18000}
RATES=${RATES:-100 200 500 1000 2000 5000}
P=swbg$$
dir=$(mktemp -d /tmp/$P.XXXX)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="bench-results/growth-$stamp.txt"
mkdir -p bench-results
# The backends and the holders of idle connections hold up to 9,000 each
# and inherit this shell's soft limit (the proxies raise their own).
ulimit -n "$(ulimit -Hn)" 2>/dev/null
# shellcheck source=scripts/bench/lib/tproxy-rig.sh
source scripts/bench/lib/tproxy-rig.sh
rig_up || exit 1

cpu_point() { # round method streams
  local r=$1 m=$2 n=$3 bytes v i
  local -a t0=()
  for i in "${!proxy_pids[@]}"; do t0[i]=$(cpu_ticks "${proxy_pids[i]}"); done
  read -r v bytes < <(iperf3_bulk -P "$n")
  echo "$r $m gbit_s $n ${v:-FAIL} Gbit_s"
  [ "$m" = direct ] && return
  local sum=0 d
  for i in "${!proxy_pids[@]}"; do
    d=$(($(cpu_ticks "${proxy_pids[i]}") - t0[i]))
    sum=$((sum + d))
    [ "${#proxy_pids[@]}" -gt 1 ] && echo "$r ${proxy_names[i]} cpu_per_gb $n $(cpu_per_gb "$d" "${bytes:-}") cpu_s_per_GB"
  done
  echo "$r $m cpu_per_gb $n $(cpu_per_gb "$sum" "${bytes:-}") cpu_s_per_GB"
}

# RSS of every proxy process apart (when there are several; with its open
# descriptors when it is a copy), of each relay (pair-rc, pair-rs: the sum
# over its copies) and of the method (the sum over all).
rss_rows() { # round method x
  local r=$1 m=$2 x=$3 i sum=0 v name g
  local -A group=()
  local -a groups=()
  for i in "${!proxy_pids[@]}"; do
    v=$(rss_kb "${proxy_pids[i]}")
    name=${proxy_names[i]}
    sum=$((sum + v))
    [ "${#proxy_pids[@]}" -gt 1 ] && echo "$r $name rss_kb $x $v kB"
    [ "$name" = "${name%.*}" ] && continue
    echo "$r $name fds $x $(fd_count "${proxy_pids[i]}") count"
    g=${name%.*}
    [ -z "${group[$g]:-}" ] && groups+=("$g")
    group[$g]=$((${group[$g]:-0} + v))
  done
  for g in "${groups[@]}"; do
    [ "$g" != "$m" ] && echo "$r $g rss_kb $x ${group[$g]} kB"
  done
  echo "$r $m rss_kb $x $sum kB"
}

# A process opening `count` connections to the server's `port` and holding
# them until its stdin, a fifo, closes: its pid in holder_pid, the fifo's
# write end (opened here) in holder_fd. The output goes to $dir/<tag>.out.
start_holder() { # port count tag
  mkfifo "$dir/$3.fifo"
  nsx $C "$BIN" lab load idle --target "$SIP:$1" --count "$2" <"$dir/$3.fifo" >"$dir/$3.out" 2>&1 &
  holder_pid=$!
  exec {holder_fd}>"$dir/$3.fifo"
}

# Until the holder reports (`open=N`) or exits; true when all `count` are up.
holder_opened() { # pid count tag
  local line
  for _ in $(seq 600); do grep -q '^open=' "$dir/$3.out" && break; kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  line=$(grep '^open=' "$dir/$3.out")
  [ "$line" = "open=$2" ] && return 0
  sed 's/^/# idle: /' "$dir/$3.out" | tail -2
  return 1
}

# Each level opens what it adds, half to port 9003 (copy a) and half to
# SPLIT_DPORT (copy b); the connections of earlier levels stay open.
memory_sweep() { # round method
  local r=$1 m=$2 have_a=0 have_b=0 want a b ka kb pa pb fa fb ok fd p
  local -a holders=() fds=()
  # The copies have just started: a relay's RSS peaks for some 40 ms after
  # its nft table appears (loading the SYN watch's BPF program, ~19 MB
  # against ~9 MB settled), so settle as before every level.
  sleep 1
  rss_rows "$r" "$m" 0
  for want in $OPEN; do
    a=$((want / 2)) b=$((want - want / 2))
    ka=$((a - have_a)) kb=$((b - have_b))
    start_holder 9003 "$ka" "hold-$want-a"
    pa=$holder_pid fa=$holder_fd
    start_holder $SPLIT_DPORT "$kb" "hold-$want-b"
    pb=$holder_pid fb=$holder_fd
    holders+=("$pa" "$pb") fds+=("$fa" "$fb")
    ok=1
    holder_opened "$pa" "$ka" "hold-$want-a" || ok=0
    holder_opened "$pb" "$kb" "hold-$want-b" || ok=0
    if [ $ok = 0 ]; then
      echo "$r $m rss_kb $want FAIL kB"
      break
    fi
    have_a=$a have_b=$b
    # Let the proxies settle (buffers of the last connections) before reading RSS.
    sleep 1
    rss_rows "$r" "$m" "$want"
  done
  for fd in "${fds[@]}"; do exec {fd}>&-; done
  for p in "${holders[@]}"; do wait "$p" 2>/dev/null; done
  rm -f "$dir"/hold-*.fifo
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
    if start_proxy "$m"; then
      {
        for n in $STREAMS; do cpu_point "$r" "$m" "$n"; done
        for rate in $RATES; do setup_point "$r" "$m" "$rate"; done
        proxies_alive || echo "$r $m proxy_alive x FAIL exited"
      } | tee -a "$out"
    else
      echo "$r $m start FAIL" | tee -a "$out"
    fi
    stop_proxy
    if start_split "$m"; then
      {
        memory_sweep "$r" "$m"
        proxies_alive || echo "$r $m proxy_alive memory FAIL exited"
      } | tee -a "$out"
    else
      echo "$r $m start_split FAIL" | tee -a "$out"
    fi
    stop_proxy
  done
done
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
python3 scripts/bench/growth-svg.py "$out" || exit 1
grep -q "FAIL" "$out" && { echo "bench-growth: a measurement failed (see $out)" >&2; exit 1; }
exit 0
