#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/target/release/splitway}
P=swva$$
# Variants of the minimal tproxy config beside HAProxy, on the bench-tproxy rig:
# default (early SYN on), noes ([accel] early_syn = false), onesock (accept_sockets = 1).
# ab -n 20000 -c 8 against nginx, then the built-in generator at 1,000 conn/s for 3 s.
dir=$(mktemp -d /tmp/$P.XXXX)
source scripts/lib/tproxy-rig.sh
trap rig_cleanup EXIT
rig_topology; rig_configs; rig_servers || exit 1
cp $dir/splitway.toml $dir/default.toml
{ cat $dir/splitway.toml; printf '[accel]\nearly_syn = false\n'; } > $dir/noes.toml
{ sed 's/^mode = "tproxy"/mode = "tproxy"\naccept_sockets = 1/' $dir/splitway.toml; } > $dir/onesock.toml
for r in 1 2 3; do
 for v in default noes onesock haproxy; do
  if [ $v = haproxy ]; then start_proxy haproxy; else cp $dir/$v.toml $dir/splitway.toml; start_proxy splitway || { cat $dir/splitway.log; exit 1; }; fi
  a=$(nsx $C ab -q -n 20000 -c 8 "http://$SIP/" | awk '/Requests per second/ {print $4}')
  l=$(nsx $C "$BIN" lab load rate --target $SIP:9003 --rate 1000 --seconds 3 | grep -o 'p50_us=[0-9.]* p99_us=[0-9.]*')
  echo "$r $v ab=$a $l"
  stop_proxy
 done
done
