#!/usr/bin/env bash
# Measures the sk_msg-redirect hazards on this kernel, paired vs plain, with
# `splitway-bypass-torture`: FIONREAD and splice on a paired socket, a sender
# behind a reader that never reads (backpressure), and randomized trials with
# blocking threads vs epoll (tokio). Output: bench-results/bypass-probes-*.txt
# (date, commit, kernel, load in the header). Needs root; uses its own cgroup.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/splitway}
TORTURE=${TORTURE:-$(dirname "$BIN")/splitway-bypass-torture}
# shellcheck source=lib/bypass-cg.sh
. scripts/bench/lib/bypass-cg.sh
bypass_cg_up bypass-probe
out="bench-results/bypass-probes-$(date -u +%Y%m%dT%H%M%SZ).txt"
trap bypass_cg_down EXIT

in_cg() { incg "$TORTURE" "$@" 2>&1; }
plain() { "$TORTURE" "$@" 2>&1; }

{
  echo "# bypass probes $(date -u +%FT%TZ)"
  echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
  echo "# kernel $(uname -r), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$BIN" bypass disable >/dev/null
  "$BIN" bypass enable --cgroup "$cg" --any-port
  for fam in v4 v6 mapped; do
    echo "## splice/FIONREAD, $fam, paired:"; in_cg --mode splice --family "$fam"
    echo "## splice/FIONREAD, $fam, plain:"; plain --mode splice --family "$fam"
  done
  echo "## splice/FIONREAD after one byte read with recv (a recv-then-splice reader), paired:"
  in_cg --mode splice --warm
  echo "## the same, plain:"; plain --mode splice --warm
  echo "## backpressure (receiver never reads, nonblocking sender, cap 4 GB), paired:"
  in_cg --mode backpressure --cap-bytes 4000000000
  echo "## backpressure, plain:"; plain --mode backpressure
  echo "## backpressure after the reader read one byte (a run of redirects starts), paired:"
  in_cg --mode backpressure --warm --cap-bytes 4000000000
  echo "## the same, plain:"; plain --mode backpressure --warm
  for seed in 1 2 3; do
    echo "## 40 trials, blocking reader+writer threads per socket, seed $seed, paired:"
    in_cg --trials 40 --seed "$seed" --io blocking --timeout-secs 3
  done
  echo "## 40 trials, blocking threads, seed 1, plain:"
  plain --trials 40 --seed 1 --io blocking --timeout-secs 3
  echo "## 200 trials, tokio (epoll), paired:"; in_cg --trials 200 --seed 9
  echo "## counters:"; "$BIN" bypass status --json
} | tee "$out"
echo "wrote $out" >&2
