#!/usr/bin/env bash
# Does a local client of the relay's HTTP CONNECT listener survive being
# paired by `splitway bypass`? Download (relay reads the server, writes the
# client) and upload (relay reads the client: recv first, splice once a read
# fills 16 KiB, unless the bypass may pair its sockets) of 4 MB, plain vs the
# client<->relay connection paired.
# Output: bench-results/bypass-relay-*.txt. Needs root.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/splitway}
# shellcheck source=lib/bypass-cg.sh
. scripts/bench/lib/bypass-cg.sh
bypass_cg_up bypass-relay
tmp=$(mktemp -d); out="bench-results/bypass-relay-$(date -u +%Y%m%dT%H%M%SZ).txt"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; bypass_cg_down; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
printf 'name = "byp"\n[[listen]]\nmode = "http-connect"\naddr = "127.0.0.1:23180"\n[[route]]\ndst = "0.0.0.0/0"\nvia = "direct"\n' > "$tmp/relay.toml"
head -c 4000000 /dev/urandom > "$tmp/blob"; want=$(sha256sum "$tmp/blob" | cut -c1-16)
(cd "$tmp" && exec python3 -m http.server 23181 --bind 127.0.0.1 >/dev/null 2>&1) & pids+=($!)
if ss -Hltn "sport = :23180" | grep -q .; then echo "bypass-relay-probe: port 23180 in use" >&2; exit 1; fi
incg_bg "$BIN" relay -c "$tmp/relay.toml" >"$tmp/relay.log" 2>&1; pids+=($!)
for _ in $(seq 50); do ss -ltn | grep -q ':23180 ' && ss -ltn | grep -q ':23181 ' && break; sleep 0.1; done
run() {
  for i in 1 2 3; do
    got=$(incg curl -s -p -x http://127.0.0.1:23180 --max-time 10 http://127.0.0.1:23181/blob | sha256sum | cut -c1-16)
    echo "$1 download $i: sha256 $got, want $want"
  done
  incg timeout 40 python3 scripts/bench/bypass/connect_upload.py 4000000 "$1 upload"
}
{
  echo "# bypass relay probe $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$BIN" bypass disable >/dev/null; run plain
  "$BIN" bypass enable --cgroup "$cg" --loopback-only --ports 23180; run paired
  "$BIN" bypass status --json | tr -d ' \n'; echo
} | tee "$out"
