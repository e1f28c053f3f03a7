#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/target/release/splitway}
P=swva$$
# Variants of the minimal tproxy config beside HAProxy, on the bench-tproxy rig:
# default (early SYN auto), es-on ([accel] early_syn = true: every SYN, no near-client
# learning), noes ([accel] early_syn = false), onesock (accept_sockets = 1).
# ab -n 20000 -c 8 against nginx, with the proxy's CPU per connection (utime+stime), TCP
# segments per connection each way on the relay host (nstat), splitway's early-SYN
# outcomes per connection; then the built-in generator at 1,000 conn/s for 3 s.
# Raw output: bench-results/tproxy-variants-*.txt.
ROUNDS=${ROUNDS:-3}
N=20000
out="bench-results/tproxy-variants-$(date -u +%Y%m%dT%H%M%SZ).txt"
exec > >(tee "$out")
echo "# bench-tproxy-variants $(date -u +%FT%TZ), commit $(git rev-parse --short=12 HEAD), $(uname -r), $(nproc) cpus, load before $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# columns: round variant ab_req_s cpu_us_per_conn segs_per_conn(in=out) early-SYN outcomes per conn | setup p50/p99 us at 1,000/s"
dir=$(mktemp -d /tmp/$P.XXXX)
source scripts/bench/lib/tproxy-rig.sh
rig_up || exit 1
cp $dir/splitway.toml $dir/default.toml
{ cat $dir/splitway.toml; printf '[accel]\nearly_syn = false\n'; } > $dir/noes.toml
{ cat $dir/splitway.toml; printf '[accel]\nearly_syn = true\n'; } > $dir/es-on.toml
{ sed 's/^mode = "tproxy"/mode = "tproxy"\naccept_sockets = 1/' $dir/splitway.toml; } > $dir/onesock.toml
for r in $(seq "$ROUNDS"); do
 for v in default es-on noes onesock haproxy; do
  if [ $v = haproxy ]; then start_proxy haproxy; else cp $dir/$v.toml $dir/splitway.toml; start_proxy splitway || { cat $dir/splitway.log; exit 1; }; fi
  nsx $C ab -q -n 2000 -c 8 "http://$SIP/" >/dev/null 2>&1 # warm-up
  nsx $R nstat -n >/dev/null
  t0=$(cpu_ticks "${proxy_pids[0]}")
  a=$(nsx $C ab -q -n $N -c 8 "http://$SIP/" | awk '/Requests per second/ {print $4}')
  t1=$(cpu_ticks "${proxy_pids[0]}")
  segs=$(nsx $R nstat -z TcpInSegs TcpOutSegs | awk -v n=$N 'NR > 1 {printf "%s=%.2f ", $1, $2 / n}')
  cpu=$(awk -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v n=$N 'BEGIN {printf "%.1f", d / hz / n * 1e6}')
  early=""
  if [ $v != haproxy ]; then
   early=$(nsx $R "$BIN" ctl metrics 2>/dev/null | awk -v n=$((N + 2000)) -F'[{}"= ]+' \
     '/^splitway_early_syn_total/ && $NF > 0 {printf "%s=%.3f ", $3, $NF / n}')
  fi
  l=$(nsx $C "$BIN" lab load rate --target $SIP:9003 --rate 1000 --seconds 3 | grep -o 'p50_us=[0-9.]* p99_us=[0-9.]*')
  echo "$r $v ab=$a cpu_us_per_conn=$cpu $segs${early:+early_per_conn: $early}| $l"
  stop_proxy
 done
done
echo "# load after $(cut -d' ' -f1-3 /proc/loadavg)"
