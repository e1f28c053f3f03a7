#!/usr/bin/env bash
# Do tokio readers stall on a paired socket? A tokio reader takes a read
# shorter than its buffer as "drained"; a tcp_bpf read returns redirected
# bytes alone even with TCP bytes queued behind them. Two probes, run with
# the binary BIN (its bypass program is what is measured):
#   pipelined  two 100 B writes before a read (torture --mode pipelined),
#              plain and paired: readers that got the first write alone
#              and then waited 2 s for the queued second;
#   relay      RUNS runs of 5 echoes of up to MAXB bytes through a splitway
#              relay in the bypass cgroup (HTTP CONNECT) to a Python echo
#              server outside it (torture --mode echo-client): runs not done
#              within 10 s, with the stuck sockets (ss) of each.
# Output: bench-results/bypass-stall-*.txt (LABEL names the build). Root.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/splitway}
TORTURE=${TORTURE:-$(dirname "$BIN")/splitway-bypass-torture}
RUNS=${RUNS:-100}
MAXB=${MAXB:-3000000}
LABEL=${LABEL:-$(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)}
# shellcheck source=lib/bypass-cg.sh
. scripts/bench/lib/bypass-cg.sh
bypass_cg_up bypass-stall
tmp=$(mktemp -d); out="bench-results/bypass-stall-$(date -u +%Y%m%dT%H%M%SZ).txt"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; bypass_cg_down; rm -rf "$tmp"; }
trap cleanup EXIT
for p in 23280 23281; do
  if ss -Hltn "sport = :$p" | grep -q .; then echo "bypass-stall-probe: port $p in use" >&2; exit 1; fi
done
printf 'name = "byp"\nadmin = "off"\n[[listen]]\nmode = "http-connect"\naddr = "127.0.0.1:23280"\n[[route]]\ndst = "0.0.0.0/0"\nvia = "direct"\n' > "$tmp/relay.toml"
cat > "$tmp/echo.py" <<'PY'
import socket, threading
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 23281)); l.listen(64)
def serve(s):
    while True:
        d = s.recv(8192)
        if not d: break
        s.sendall(d)
    s.shutdown(socket.SHUT_WR); s.close()
while True:
    s, _ = l.accept(); threading.Thread(target=serve, args=(s,), daemon=True).start()
PY
probe() {
  echo "# bypass stall probe $(date -u +%FT%TZ), build $LABEL, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$BIN" bypass disable >/dev/null
  echo "## pipelined, plain: $(incg "$TORTURE" --mode pipelined --trials 20)"
  "$BIN" bypass enable --cgroup "$cg" --any-port
  echo "## pipelined, paired: $(incg "$TORTURE" --mode pipelined --trials 20)"
  python3 "$tmp/echo.py" & pids+=($!)
  incg_bg "$BIN" relay -c "$tmp/relay.toml" >"$tmp/relay.log" 2>&1; pids+=($!)
  for _ in $(seq 50); do ss -ltn | grep -q ':23280 ' && ss -ltn | grep -q ':23281 ' && break; sleep 0.1; done
  stalled=0
  for i in $(seq "$RUNS"); do
    incg timeout 40 "$TORTURE" --mode echo-client --trials 5 --max-bytes "$MAXB" \
      --connect 127.0.0.1:23281 --via-connect 127.0.0.1:23280 >"$tmp/echo.out" 2>&1 &
    t=$!
    for _ in $(seq 100); do kill -0 $t 2>/dev/null || break; sleep 0.1; done
    if kill -0 $t 2>/dev/null; then
      stalled=$((stalled + 1))
      echo "## relay echo run $i: not done after 10 s; its sockets:"
      ss -tnmi '( sport = :23280 or dport = :23280 or sport = :23281 or dport = :23281 )'
      wait $t; tail -1 "$tmp/echo.out"
    elif ! wait $t; then
      echo "## relay echo run $i failed: $(tail -1 "$tmp/echo.out")"
    fi
  done
  echo "## relay echo: $stalled of $RUNS runs (5 echoes of up to $MAXB bytes each) not done within 10 s"
  "$BIN" bypass status --json | tr -d ' \n'; echo
}
# Not in a pipeline: the servers' pids must reach cleanup.
probe >"$out" 2>&1
cat "$out"
echo "wrote $out"
