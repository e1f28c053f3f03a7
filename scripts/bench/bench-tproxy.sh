#!/usr/bin/env bash
# bench-tproxy: one relay doing the same work as its peers (issue #21), and
# the relay pair. Namespaces client — relay host — T — server joined by veth
# (scripts/bench/lib/tproxy-rig.sh); the client's traffic to the server is routed
# through the relay host, where, in turn:
#   direct    the kernel only forwards (the floor: no proxy at all);
#   splitway  a splitway relay intercepts it with TPROXY (its minimal config:
#             tproxy listener with `intercept`, route direct);
#   haproxy   HAProxy (TCP mode, splice-auto) intercepts it with the same
#             TPROXY rule and forwards to the original destination;
#   pair      splitway rc intercepts it and forwards over a relay leg to rs
#             on T (the real deployment); CPU is reported per relay;
#   baseline  (only when METHODS names it) the splitway method with the
#             binary BIN_BASELINE: an earlier build, before/after in one run;
#   splitway1, haproxy1, floor, floor1
#             (only when METHODS names them) one-thread variants and the
#             least a forwarder does per connection (scripts/bench/lib/tproxy-rig.sh).
# Third-party tools from Debian, run in the client namespace against servers
# in the server namespace: sockperf ping-pong 64 B (one connection),
# ab against nginx (a new connection per request), iperf3 bulk (the proxy's
# CPU-seconds per GB from /proc), redis-benchmark GET with 50 clients; and
# the built-in open-loop generator (`splitway lab load rate`) for setup
# latency p50/p99 at 1,000 new connections per second.
# Methods alternate in every round, so each ratio comes from one run.
# TESTS limits the measurements (e.g. TESTS="ab setup").
# Raw output: bench-results/tproxy-bench-*.txt (columns: round method test
# value unit), ratios against haproxy at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/target/release/splitway}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
AB_REQUESTS=${AB_REQUESTS:-20000}
# Which measurements run (a subset for quick before/after runs).
TESTS=" ${TESTS:-sockperf ab redis setup iperf3} "
P=swbt$$
dir=$(mktemp -d /tmp/$P.XXXX)
out="bench-results/tproxy-bench-$(date -u +%Y%m%dT%H%M%SZ).txt"
mkdir -p bench-results
# shellcheck source=scripts/bench/lib/tproxy-rig.sh
source scripts/bench/lib/tproxy-rig.sh
rig_up || exit 1

wanted() { [[ $TESTS == *" $1 "* ]]; }

measure() { # round method
  local r=$1 m=$2
  wanted sockperf && measure_sockperf "$r" "$m"
  wanted ab && measure_ab "$r" "$m"
  wanted redis && measure_redis "$r" "$m"
  wanted setup && measure_setup "$r" "$m"
  wanted iperf3 && measure_bulk "$r" "$m"
  return 0
}

measure_sockperf() { # round method
  local r=$1 m=$2 v
  v=$(nsx $C sockperf pp --tcp -i $SIP -p 11111 -m 64 -t "$SECS" 2>&1 |
    awk '/Summary: Latency is/ {print $5}')
  echo "$r $m sockperf_pp_64B ${v:-FAIL} usec_half_rtt"
}

measure_ab() { # round method
  local r=$1 m=$2 v
  local -a ab_t0=()
  local i
  for i in "${!proxy_pids[@]}"; do ab_t0[i]=$(cpu_ticks "${proxy_pids[i]}"); done
  nsx $C ab -q -n "$AB_REQUESTS" -c 8 "http://$SIP/" >"$dir/ab.out" 2>&1
  v=$(awk '/Requests per second/ {print $4} /Failed requests/ {f=$3} END {if (f > 0) print "FAILED:" f}' "$dir/ab.out" | tr '\n' ' ')
  [ -n "$v" ] || sed 's/^/# ab: /' "$dir/ab.out" | tail -3 >&2
  echo "$r $m ab_new_conn_c8 ${v:-FAIL} req_s"
  if [ "$m" != direct ]; then
    # The proxies' CPU (all relays of the method) per ab connection.
    local ab_ticks=0
    for i in "${!proxy_pids[@]}"; do
      ab_ticks=$((ab_ticks + $(cpu_ticks "${proxy_pids[i]}") - ab_t0[i]))
    done
    echo "$r $m ab_cpu_per_conn $(awk -v t="$ab_ticks" -v hz="$(getconf CLK_TCK)" -v n="$AB_REQUESTS" 'BEGIN {printf "%.1f", t / hz / n * 1e6}') us"
  fi
}

measure_redis() { # round method
  local r=$1 m=$2 v
  v=$(nsx $C redis-benchmark -h $SIP -p 6379 -c 50 -n 200000 -t get -q 2>&1 |
    tr '\r' '\n' | awk '/^GET:/ {print $2}' | tail -1)
  echo "$r $m redis_get_c50 ${v:-FAIL} req_s"
}

measure_setup() { # round method
  local r=$1 m=$2 v line key
  line=$(setup_rate 1000 "$SECS")
  for key in p50_us p99_us; do
    # A run with a failed connection has no valid percentile.
    v=$(kv "$line" "$key")
    [ "$(kv "$line" failures)" = 0 ] || v=FAIL
    echo "$r $m setup_${key}_at_1000 $v us"
  done
}

measure_bulk() { # round method
  local r=$1 m=$2 v bytes i d sum=0
  local -a t0=() names=(rs rc)
  for i in "${!proxy_pids[@]}"; do t0[i]=$(cpu_ticks "${proxy_pids[i]}"); done
  read -r v bytes < <(iperf3_bulk)
  echo "$r $m iperf3_bulk ${v:-FAIL} Gbit_s"
  [ "$m" = direct ] && return
  for i in "${!proxy_pids[@]}"; do
    d=$(($(cpu_ticks "${proxy_pids[i]}") - t0[i]))
    sum=$((sum + d))
    # The pair's relays apart: what each machine of a deployment pays.
    [ "$m" = pair ] && echo "$r pair-${names[i]} bulk_cpu $(cpu_per_gb "$d" "${bytes:-}") cpu_s_per_GB"
  done
  echo "$r $m bulk_cpu $(cpu_per_gb "$sum" "${bytes:-}") cpu_s_per_GB"
}

{
  echo "# bench-tproxy $(date -u +%FT%TZ)"
  echo "# commit $(git rev-parse --short=12 HEAD)$(git diff --quiet || echo -dirty)"
  echo "# kernel $(uname -r), $(nproc) cpus, load before $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $("$BIN" --version 2>/dev/null), $(haproxy -v 2>/dev/null | head -1)"
  [ -n "${BIN_BASELINE:-}" ] && echo "# baseline binary $BIN_BASELINE: $("$BIN_BASELINE" --version 2>/dev/null | tr '\n' ' ')"
  [ -n "${BASELINE_APPEND:-}" ] && echo "# baseline's config ends with: $(printf '%b' "$BASELINE_APPEND" | tr '\n' ' ')"
  echo "# rounds $ROUNDS, tests$TESTS, ${SECS}s per timed tool, ab -n $AB_REQUESTS -c 8; columns: round method test value unit"
} | tee "$out"

methods=(${METHODS:-direct splitway haproxy pair})
for r in $(seq "$ROUNDS"); do
  # Rotate the order each round so no method always runs first.
  for ((i = 0; i < ${#methods[@]}; i++)); do
    m=${methods[$(((i + r) % ${#methods[@]}))]}
    start_proxy "$m" || exit 1
    measure "$r" "$m" | tee -a "$out"
    if ! proxies_alive; then
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
lower_better = {"usec_half_rtt", "cpu_s_per_GB", "us"}
print("# summary: test, unit, median per method; each splitway method vs haproxy, and splitway vs baseline (>1: splitway better)")
for (t, u), per in vals.items():
    med = {m: statistics.median(v) for m, v in per.items()}
    ratios = []
    h = med.get("haproxy")
    for m in ("splitway", "splitway1", "baseline", "floor", "floor1", "haproxy1", "pair", "pair-rc", "pair-rs"):
        s = med.get(m)
        if s is not None and h is not None and min(s, h) > 0:
            ratios.append(f"{m}={(h / s if u in lower_better else s / h):.2f}x")
    b, s = med.get("baseline"), med.get("splitway")
    if b is not None and s is not None and min(b, s) > 0:
        ratios.append(f"splitway_vs_baseline={(b / s if u in lower_better else s / b):.2f}x")
    print("# " + t + " " + u + " " + " ".join(f"{m}={v:.3f}" for m, v in sorted(med.items())) + " " + " ".join(ratios))
EOF
grep -q "FAIL" "$out" && { echo "bench-tproxy: a measurement failed (see $out)" >&2; exit 1; }
exit 0
