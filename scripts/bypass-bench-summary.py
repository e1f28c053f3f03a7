#!/usr/bin/env python3
"""Summarises a bench-results/bypass-bench-*.txt run: per test, the medians
of plain and bypass, and the median (and range) of the per-round ratios,
bypass over plain (> 1 = the bypass is better; latency is inverted).

usage: scripts/bypass-bench-summary.py bench-results/bypass-bench-X.txt
"""
import statistics
import sys
from collections import defaultdict


def main(path):
    values = defaultdict(dict)  # test -> {(round, mode): value}
    units = {}
    order = []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        r, mode, test, value, unit = line.split()
        if value == "FAIL":
            continue
        values[test][(r, mode)] = float(value)
        units[test] = unit
        if test not in order:
            order.append(test)
    print(f"{'test':32} {'plain':>10} {'bypass':>10} {'ratio':>6}  range")
    for test in order:
        v = values[test]
        rounds = sorted({r for r, _ in v})
        ratios = []
        for r in rounds:
            p, b = v.get((r, "plain")), v.get((r, "bypass"))
            if p is None or b is None:
                continue
            ratios.append(p / b if units[test] == "usec_half_rtt" else b / p)
        if not ratios:
            continue
        plain = statistics.median(x for (r, m), x in v.items() if m == "plain")
        bypass = statistics.median(x for (r, m), x in v.items() if m == "bypass")
        print(
            f"{test:32} {plain:10.2f} {bypass:10.2f} {statistics.median(ratios):6.2f}"
            f"  {min(ratios):.2f}-{max(ratios):.2f} ({units[test]}, {len(ratios)} rounds)"
        )


if __name__ == "__main__":
    main(sys.argv[1])
