#!/usr/bin/env bash
# Measures the free TCP option space of this kernel's SYN (the agent's probe
# mode) and the destination option's end-to-end tests; writes
# lab-results/syn-option-space-<date>.txt with date, commit, kernel and load.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="lab-results/syn-option-space-$(date -u +%Y%m%d).txt"
{
    echo "# splitway destination TCP option: SYN option space (docs/syn-option.md)"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD)$(git diff --quiet || echo ' (dirty)')"
    echo "kernel: $(uname -r)"
    echo "load: $(cat /proc/loadavg)"
    echo "sysctl: tcp_timestamps=$(sysctl -n net.ipv4.tcp_timestamps) tcp_sack=$(sysctl -n net.ipv4.tcp_sack) tcp_window_scaling=$(sysctl -n net.ipv4.tcp_window_scaling)"
    echo "command: cargo test -p splitway --test relay_syn_option -- --nocapture --test-threads=1"
    SPLITWAY_REQUIRE_NETNS=1 cargo test -q -p splitway --test relay_syn_option -- --nocapture --test-threads=1 2>&1 |
        grep -oE 'MEASURED.*|test result.*'
} | tee "$out"
