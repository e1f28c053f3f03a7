#!/usr/bin/env bash
# Does a local client of the relay gain from `splitway bypass`? 64 B
# request/response (scripts/bench/bypass/relay_rr.py, Python) through the relay's
# HTTP CONNECT listener to an echo server, client, relay and server all in
# one cgroup and pinned to CPU 0 (the placement where the bypass shows, see
# docs/bypass.md); plain and paired (both legs' ports) in alternating rounds.
# Output: bench-results/bypass-relay-rr-*.txt. Needs root.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/splitway}
ROUNDS=${ROUNDS:-3}; N=${N:-20000}
# shellcheck source=lib/bypass-cg.sh
. scripts/bench/lib/bypass-cg.sh
bypass_cg_up bypass-relay-rr
tmp=$(mktemp -d); out="bench-results/bypass-relay-rr-$(date -u +%Y%m%dT%H%M%SZ).txt"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; bypass_cg_down; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
for p in 23190 23191; do
  if ss -Hltn "sport = :$p" | grep -q .; then echo "bypass-relay-rr: port $p in use" >&2; exit 1; fi
done
printf 'name = "byp"\nadmin = "off"\n[[listen]]\nmode = "http-connect"\naddr = "127.0.0.1:23190"\n[[route]]\ndst = "0.0.0.0/0"\nvia = "direct"\n' > "$tmp/relay.toml"
incg_bg taskset -c 0 "$BIN" relay -c "$tmp/relay.toml" >"$tmp/relay.log" 2>&1; pids+=($!)
for _ in $(seq 50); do ss -ltn | grep -q ':23190 ' && break; sleep 0.1; done
{
  echo "# bypass relay request/response $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $ROUNDS rounds of $N round trips, 64 B, client, relay and echo server on CPU 0"
  for r in $(seq "$ROUNDS"); do
    "$BIN" bypass disable >/dev/null
    incg taskset -c 0 python3 scripts/bench/bypass/relay_rr.py 23190 23191 "$N" "$r plain"
    "$BIN" bypass enable --cgroup "$cg" --loopback-only --ports 23190,23191 >/dev/null
    incg taskset -c 0 python3 scripts/bench/bypass/relay_rr.py 23190 23191 "$N" "$r paired"
  done
  "$BIN" bypass status --json | tr -d ' \n'; echo
} | tee "$out"
