#!/usr/bin/env python3
"""Summarises a bench-results/bypass-bench-*.txt or bypass-floor-*.txt run:
per test, the median of every mode, and for each mode other than plain the
median (and range) of its per-round ratios to plain (> 1 = better than
plain; latency is inverted).

usage: scripts/bench/bypass-bench-summary.py bench-results/bypass-bench-X.txt
"""
import statistics
import sys
from collections import defaultdict


def main(path):
    values = defaultdict(dict)  # test -> {(round, mode): value}
    units = {}
    order = []
    modes = []
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
        if mode not in modes:
            modes.append(mode)
    # plain first, the others in the order the file names them
    others = [m for m in modes if m != "plain"]
    print(f"{'test':28} {'plain':>10} " + " ".join(f"{m:>10} {'ratio':>6} {'range':>10}" for m in others))
    for test in order:
        v = values[test]
        rounds = sorted({r for r, _ in v})
        plain = [x for (r, m), x in v.items() if m == "plain"]
        if not plain:
            continue
        cells = []
        for mode in others:
            ratios = []
            for r in rounds:
                p, b = v.get((r, "plain")), v.get((r, mode))
                if p is None or b is None:
                    continue
                ratios.append(p / b if units[test] == "usec_half_rtt" else b / p)
            if not ratios:
                cells.append(f"{'-':>10} {'-':>6} {'':>10}")
                continue
            med = statistics.median(x for (r, m), x in v.items() if m == mode)
            cells.append(
                f"{med:10.2f} {statistics.median(ratios):6.2f} {min(ratios):4.2f}-{max(ratios):4.2f}"
            )
        print(f"{test:28} {statistics.median(plain):10.2f} " + " ".join(cells) + f"  ({units[test]})")


if __name__ == "__main__":
    main(sys.argv[1])
