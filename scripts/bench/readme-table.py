#!/usr/bin/env python3
"""Prints the lab table of docs/benchmarks.md (markdown; the README's headline is four of its rows) from a `splitway lab --json`
file: medians in ms with the model in brackets, * SUSPECT, † PREMISE, and
the 10 MB download time against e2e's. Usage: readme-table.py RUN.json"""
import json
import sys

run = json.load(open(sys.argv[1]))
rows = run["chains"][0]["results"]
sizes = [10_000, 100_000, 1_000_000, 10_000_000]
configs = list(dict.fromkeys(r["config"] for r in rows))
cell = {(r["config"], r["size_bytes"]): r for r in rows}


def mark(r):
    return ("*" if r.get("suspect") else "") + ("†" if r.get("premise") else "")


def fmt(r, metric):
    return f"{r[metric + '_ms']['median']:.0f} [{r['model_' + metric + '_ms']:.0f}]{mark(r)}"


print(f"Run {run['date']}, commit `{run['commit'][:12]}`, kernel {run['kernel']}, "
      f"load average {run.get('load_average_start', '?')} at the start and "
      f"{run.get('load_average_end', '?')} at the end.", file=sys.stderr)
print("| config | TTFB 10 KB | total 100 KB | total 1 MB | total 10 MB | 10 MB vs e2e |")
print("|---|---|---|---|---|---|")
e2e = cell[("e2e", sizes[-1])]["total_ms"]["median"]
for c in configs:
    cells = [fmt(cell[(c, sizes[0])], "ttfb")]
    cells += [fmt(cell[(c, s)], "total") for s in sizes[1:]]
    speedup = e2e / cell[(c, sizes[-1])]["total_ms"]["median"]
    print(f"| `{c}` | " + " | ".join(cells) + f" | {speedup:.2f}× |")
