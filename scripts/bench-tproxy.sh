#!/usr/bin/env bash
# bench-tproxy: one relay doing the same work as its peers (issue #21). Three
# namespaces, client — relay — server, joined by veth; the client's traffic to
# the server is routed through the relay host, where, in turn:
#   direct    the kernel only forwards (the floor: no proxy at all);
#   splitway  a splitway relay intercepts it with TPROXY (its minimal config:
#             tproxy listener with `intercept`, route direct);
#   haproxy   HAProxy (TCP mode, splice-auto) intercepts it with the same
#             TPROXY rule and forwards to the original destination.
# Third-party tools from Debian, run in the client namespace against servers
# in the server namespace: sockperf ping-pong 64 B (one connection),
# ab against nginx (a new connection per request), iperf3 bulk (the proxy's
# CPU-seconds per GB from /proc), redis-benchmark GET with 50 clients.
# Methods alternate in every round, so each ratio comes from one run.
# Raw output: bench-results/tproxy-bench-*.txt (columns: round method test
# value unit), ratios against haproxy at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/target/release/splitway}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
AB_REQUESTS=${AB_REQUESTS:-20000}
P=swbt$$
C=$P-c R=$P-r S=$P-s
CIP=10.201.1.1 RIN=10.201.1.2 ROUT=10.201.2.1 SIP=10.201.2.2
RELAY_PORT=7000
dir=$(mktemp -d /tmp/$P.XXXX)
out="bench-results/tproxy-bench-$(date -u +%Y%m%dT%H%M%SZ).txt"
mkdir -p bench-results
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  stop_proxy
  # Whatever runs in the namespaces (the servers are children of
  # `ip netns exec`, not of this shell) goes with them.
  for n in $C $R $S; do ip netns pids "$n" 2>/dev/null | xargs -r kill 2>/dev/null; done
  wait 2>/dev/null
  for n in $C $R $S; do
    for _ in $(seq 50); do [ -z "$(ip netns pids "$n" 2>/dev/null)" ] && break; sleep 0.1; done
    ip netns del "$n" 2>/dev/null
  done
  rm -rf "$dir"
}
proxy_pid=
stop_proxy() {
  if [ -n "$proxy_pid" ]; then
    kill "$proxy_pid" 2>/dev/null
    wait "$proxy_pid" 2>/dev/null
    proxy_pid=
  fi
  ip netns exec $R nft delete table inet swbt_haproxy 2>/dev/null
  return 0
}
trap cleanup EXIT
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# --- topology ---------------------------------------------------------------
for n in $C $R $S; do ip netns add "$n"; nsx "$n" ip link set lo up; done
ip link add vc netns $C type veth peer name vr netns $R
ip link add vs netns $R type veth peer name vd netns $S
nsx $C ip addr add $CIP/24 dev vc; nsx $C ip link set vc up
# One client source address per method: a proxy's TIME_WAIT sockets in the
# relay namespace (transparent, bound to the server's address) outlive it,
# and early demux would hand a later direct SYN on the same 4-tuple to them.
for a in 11 12 13; do nsx $C ip addr add 10.201.1.$a/24 dev vc; done
nsx $R ip addr add $RIN/24 dev vr; nsx $R ip link set vr up
nsx $R ip addr add $ROUT/24 dev vs; nsx $R ip link set vs up
nsx $S ip addr add $SIP/24 dev vd; nsx $S ip link set vd up
nsx $C ip route add default via $RIN
nsx $S ip route add default via $ROUT
nsx $R sysctl -qw net.ipv4.ip_forward=1
# TPROXY's local delivery (used by both proxies; splitway installs its own
# nft rule, HAProxy gets the README's manual one).
nsx $R ip rule add fwmark 1 lookup 100
nsx $R ip route add local 0.0.0.0/0 dev lo table 100
for n in $C $S; do nsx "$n" sysctl -qw net.ipv4.tcp_tw_reuse=1; done

# --- servers ------------------------------------------------------------------
cat > "$dir/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $dir/nginx.pid;
error_log stderr error;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen $SIP:80 backlog=4096; location / { return 200 "ok\n"; } }
}
EOF
nsx $S nginx -c "$dir/nginx.conf" -e stderr >/dev/null 2>&1 & pids+=($!)
nsx $S sockperf sr --tcp -i $SIP -p 11111 >/dev/null 2>&1 & pids+=($!)
nsx $S iperf3 -s -p 5201 -B $SIP >/dev/null 2>&1 & pids+=($!)
nsx $S redis-server --port 6379 --bind $SIP --save '' --appendonly no --protected-mode no >/dev/null 2>&1 & pids+=($!)
PORTS="80, 5201, 6379, 11111"

wait_listen() { # ns port
  for _ in $(seq 100); do
    nsx "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
    sleep 0.05
  done
  echo "bench-tproxy: nothing listens on port $2 in $1" >&2
  return 1
}
for p in 80 11111 5201 6379; do wait_listen $S $p || exit 1; done

# --- proxies ------------------------------------------------------------------
cat > "$dir/splitway.toml" <<EOF
name = "bench"
[[listen]]
mode = "tproxy"
addr = "0.0.0.0:$RELAY_PORT"
intercept = { interfaces = ["vr"], ports = [$PORTS] }
[[route]]
dst = "0.0.0.0/0"
via = "direct"
EOF
cat > "$dir/haproxy.cfg" <<EOF
global
  maxconn 4000
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option splice-auto
listen tproxy
  bind 0.0.0.0:$RELAY_PORT transparent
  server origin 0.0.0.0
EOF
cat > "$dir/haproxy.nft" <<EOF
table inet swbt_haproxy {
  chain prerouting {
    type filter hook prerouting priority mangle; policy accept;
    meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn socket transparent 1 meta mark set 1 accept
    meta nfproto ipv4 iifname "vr" tcp dport { $PORTS } tproxy ip to :$RELAY_PORT meta mark set 1 accept
  }
}
EOF

start_proxy() { # method
  local src
  case $1 in direct) src=11 ;; splitway) src=12 ;; haproxy) src=13 ;; esac
  nsx $C ip route replace default via $RIN src 10.201.1.$src
  case $1 in
    direct) ;;
    splitway)
      # `ip netns exec` execs the command: $! is the proxy's own pid.
      ip netns exec $R "$BIN" relay --config "$dir/splitway.toml" >"$dir/splitway.log" 2>&1 &
      proxy_pid=$!
      wait_listen $R $RELAY_PORT || { cat "$dir/splitway.log" >&2; exit 1; }
      # Listening comes before the rules: wait for the intercept table.
      for _ in $(seq 100); do nsx $R nft list tables | grep -q splitway && break; sleep 0.05; done
      ;;
    haproxy)
      nsx $R nft -f "$dir/haproxy.nft"
      ip netns exec $R haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
      proxy_pid=$!
      wait_listen $R $RELAY_PORT || { cat "$dir/haproxy.log" >&2; exit 1; }
      ;;
  esac
}

cpu_ticks() { # utime+stime of the proxy process (all its threads)
  awk '{print $14 + $15}' "/proc/$proxy_pid/stat"
}

measure() { # round method
  local r=$1 m=$2 v t0 t1 bytes
  v=$(nsx $C sockperf pp --tcp -i $SIP -p 11111 -m 64 -t "$SECS" 2>&1 |
    awk '/Summary: Latency is/ {print $5}')
  echo "$r $m sockperf_pp_64B ${v:-FAIL} usec_half_rtt"
  nsx $C ab -q -n "$AB_REQUESTS" -c 8 "http://$SIP/" >"$dir/ab.out" 2>&1
  v=$(awk '/Requests per second/ {print $4} /Failed requests/ {f=$3} END {if (f > 0) print "FAILED:" f}' "$dir/ab.out" | tr '\n' ' ')
  [ -n "$v" ] || sed 's/^/# ab: /' "$dir/ab.out" | tail -3 >&2
  echo "$r $m ab_new_conn_c8 ${v:-FAIL} req_s"
  v=$(nsx $C redis-benchmark -h $SIP -p 6379 -c 50 -n 200000 -t get -q 2>&1 |
    tr '\r' '\n' | awk '/^GET:/ {print $2}' | tail -1)
  echo "$r $m redis_get_c50 ${v:-FAIL} req_s"
  [ "$m" != direct ] && t0=$(cpu_ticks)
  read -r v bytes < <(nsx $C iperf3 -c $SIP -p 5201 -t "$SECS" -J 2>/dev/null |
    python3 -c 'import json,sys; e=json.load(sys.stdin)["end"]["sum_received"]; print(e["bits_per_second"]/1e9, e["bytes"])')
  [ "$m" != direct ] && t1=$(cpu_ticks)
  echo "$r $m iperf3_bulk ${v:-FAIL} Gbit_s"
  if [ "$m" != direct ] && [ -n "${bytes:-}" ]; then
    awk -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v b="$bytes" -v r="$r" -v m="$m" \
      'BEGIN {printf "%s %s bulk_cpu %.3f cpu_s_per_GB\n", r, m, d / hz / (b / 1e9)}'
  fi
}

{
  echo "# bench-tproxy $(date -u +%FT%TZ)"
  echo "# commit $(git rev-parse --short=12 HEAD)$(git diff --quiet || echo -dirty)"
  echo "# kernel $(uname -r), $(nproc) cpus, load before $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $("$BIN" --version 2>/dev/null), $(haproxy -v 2>/dev/null | head -1)"
  echo "# rounds $ROUNDS, ${SECS}s per timed tool, ab -n $AB_REQUESTS -c 8; columns: round method test value unit"
} | tee "$out"

methods=(${METHODS:-direct splitway haproxy})
for r in $(seq "$ROUNDS"); do
  # Rotate the order each round so no method always runs first.
  for ((i = 0; i < ${#methods[@]}; i++)); do
    m=${methods[$(((i + r) % ${#methods[@]}))]}
    start_proxy "$m"
    measure "$r" "$m" | tee -a "$out"
    if [ -n "$proxy_pid" ] && ! kill -0 "$proxy_pid" 2>/dev/null; then
      echo "$r $m proxy_alive FAIL exited" | tee -a "$out"
    fi
    stop_proxy
  done
done
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"

# Medians over rounds and the ratio splitway / haproxy (for latency and CPU,
# haproxy / splitway, so > 1 is always splitway better).
python3 - "$out" <<'EOF' | tee -a "$out"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l[0].isdigit()]
vals = {}
for r, m, t, v, u in rows:
    try:
        vals.setdefault((t, u), {}).setdefault(m, []).append(float(v))
    except ValueError:
        print(f"# FAILED measurement: round {r} {m} {t} {v}")
lower_better = {"usec_half_rtt", "cpu_s_per_GB"}
print("# summary: test, unit, median per method, splitway vs haproxy (>1: splitway better)")
for (t, u), per in vals.items():
    med = {m: statistics.median(v) for m, v in per.items()}
    ratio = ""
    if "splitway" in med and "haproxy" in med:
        s, h = med["splitway"], med["haproxy"]
        if min(s, h) > 0:
            ratio = f"{(h / s if u in lower_better else s / h):.2f}x"
    print("# " + t + " " + u + " " + " ".join(f"{m}={v:.3f}" for m, v in sorted(med.items())) + " " + ratio)
EOF
grep -q "FAIL" "$out" && { echo "bench-tproxy: a measurement failed (see $out)" >&2; exit 1; }
exit 0
