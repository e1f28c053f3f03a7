#!/bin/bash
# Pins every lab link-emulator thread (named emu-*) to CPU $1, re-checking
# every 0.3 s for new ones, until killed. For the experiment in docs/lab.md
# ("What the emulator costs per packet"):
#   scripts/bench/pin-emulator-threads.sh 1 & pin=$!
#   ./target/release/splitway lab scenario paper-ktcp --quick --configs e2e,full ...
#   kill $pin
set -u
cpu=${1:?usage: pin-emulator-threads.sh CPU}
while true; do
  for task in /proc/[0-9]*/task/[0-9]*; do
    comm=$(cat "$task/comm" 2>/dev/null) || continue
    case "$comm" in emu-*) taskset -p -c "$cpu" "${task##*/}" >/dev/null 2>&1 ;; esac
  done
  sleep 0.3
done
