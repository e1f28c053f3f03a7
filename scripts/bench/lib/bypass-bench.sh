# Shared by the bypass benchmarks (sourced after bypass-cg.sh, whose cgroup
# `cg` and `incg` they use): the quiet-machine check, the raw file's header,
# Debian's servers inside the cgroup and one measurement of each tool.
# The caller sets P_SOCKPERF, P_REDIS, P_IPERF and `pids`.
# shellcheck shell=bash

# The machine is shared: refuses to start at load average >= MAX_LOAD
# (default 3) unless FORCE=1.
bench_quiet_or_exit() { # script name
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  if [ "${FORCE:-0}" != 1 ] && awk -v l="$load" -v m="${MAX_LOAD:-3}" 'BEGIN{exit !(l >= m)}'; then
    echo "$1: load average $load >= ${MAX_LOAD:-3}; not a quiet window (FORCE=1 to run anyway)" >&2
    exit 2
  fi
}

bench_header() { # title details
  echo "# $1 $(date -u +%FT%TZ)"
  echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
  echo "# kernel $(uname -r), $(nproc) cpus, load before $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $2"
}

# sockperf, redis-server and iperf3, started once inside the cgroup; only
# the connections made while a bypass is enabled are paired (pairing
# happens at ESTABLISHED). A server left from another run would answer from
# outside this cgroup and never be paired: a port in use stops the run.
# Sets SOCKPERF_PID and REDIS_PID; every pid goes to `pids`.
bypass_servers_up() { # script name
  local port
  for port in $P_SOCKPERF $P_REDIS $P_IPERF; do
    if ss -Hltn "sport = :$port" | grep -q .; then
      echo "$1: port $port is already in use (a server left from another run?)" >&2
      exit 1
    fi
  done
  incg_bg sockperf sr --tcp -i 127.0.0.1 -p "$P_SOCKPERF" >/dev/null 2>&1; pids+=($!); SOCKPERF_PID=$!
  incg_bg redis-server --port "$P_REDIS" --save '' --appendonly no --bind 127.0.0.1 >/dev/null 2>&1
  pids+=($!); REDIS_PID=$!
  incg_bg iperf3 -s -p "$P_IPERF" -B 127.0.0.1 >/dev/null 2>&1; pids+=($!)
  for _ in $(seq 50); do
    ss -ltn | grep -q ":$P_IPERF " && ss -ltn | grep -q ":$P_REDIS " && ss -ltn | grep -q ":$P_SOCKPERF " && break
    sleep 0.1
  done
}

# One measurement from inside the cgroup each, printed as the value or FAIL.
# sockperf ping-pong: half the average round trip in µs (lower is better;
# transactions/s of one ping-pong stream = 1e6 / (2 * value)).
sockperf_pp_us() { # client_cpus size secs
  local v
  v=$(incg taskset -c "$1" sockperf pp --tcp -i 127.0.0.1 -p "$P_SOCKPERF" -m "$2" -t "$3" 2>&1 |
    awk '/Summary: Latency is/ {print $5}')
  echo "${v:-FAIL}"
}

# redis-benchmark GET, requests per second; pinned to client_cpus if given.
redis_get_rps() { # clients requests [client_cpus]
  local v
  local -a pinned=()
  [ -n "${3:-}" ] && pinned=(taskset -c "$3")
  v=$(incg "${pinned[@]}" redis-benchmark -p "$P_REDIS" -c "$1" -n "$2" -t get -q 2>&1 |
    tr '\r' '\n' | awk '/GET:/ && /requests per second/ {v=$2} END {print v}')
  echo "${v:-FAIL}"
}

# iperf3 bulk with writes (and reads) of `len`, Gbit/s at the receiver.
iperf3_gbit() { # len secs
  incg iperf3 -c 127.0.0.1 -p "$P_IPERF" -t "$2" -l "$1" -J 2>&1 |
    python3 -c 'import json,sys
try:
    d=json.load(sys.stdin); print(round(d["end"]["sum_received"]["bits_per_second"]/1e9,3))
except Exception: print("FAIL")'
}
