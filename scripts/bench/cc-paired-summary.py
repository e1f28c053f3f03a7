#!/usr/bin/env python3
"""Summary of scripts/bench/cc-paired.sh's output: per chain, the paired ratio
splitway_cubic / cubic for each loss seed, their median and spread, and the
njit-lossy split rows per algorithm. Usage: cc-paired-summary.py DIR"""
import json, math, statistics, sys
from pathlib import Path

d = Path(sys.argv[1])
runs = {}
for line in (d / "runs.jsonl").read_text().splitlines():
    r = json.loads(line)
    runs[r["run"]] = r


def rows(path):
    rep = json.loads(path.read_text())
    out = {}
    for c in rep["chains"]:
        for m in c["results"]:
            if m["config"] == "split":
                out[c["name"]] = m
    return rep, out


def sign_ci(xs):
    """Distribution-free CI of the median from order statistics (binomial),
    the widest pair (k, n-1-k) with coverage >= 0.9; None if n too small."""
    xs = sorted(xs)
    n = len(xs)
    best = None
    for k in range(n // 2):
        cover = 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        if cover >= 0.9:
            best = (xs[k], xs[n - 1 - k], round(cover, 3))
    return best


summary = {"dir": str(d), "parity": {}, "njit_lossy": {}}
seeds = sorted(
    {int(p.stem.split("seed")[1]) for p in d.glob("parity-*-seed*.json")}
)
pairs = {}
meta = {}
for k in seeds:
    a, b = d / f"parity-cubic-seed{k}.json", d / f"parity-splitway_cubic-seed{k}.json"
    if not (a.exists() and b.exists()):
        continue
    ra, ma = rows(a)
    rb, mb = rows(b)
    assert ra["loss_seed"] == rb["loss_seed"] == k, (a, b)
    meta[k] = {"commit": ra["commit"], "kernel": ra["kernel"]}
    for chain in ma:
        x, y = ma[chain], mb[chain]
        ok = x["status"] == "ok" and y["status"] == "ok" and x["n"] == y["n"] == 1
        pairs.setdefault(chain, []).append({
            "seed": k,
            "cubic_ms": x["total_ms"]["median"] if x["n"] else None,
            "splitway_cubic_ms": y["total_ms"]["median"] if y["n"] else None,
            "statuses": [x["status"], y["status"]],
            "suspect": [x.get("suspect"), y.get("suspect")],
            "ratio": (y["total_ms"]["median"] / x["total_ms"]["median"]) if ok else None,
            "load_cubic": runs.get(f"parity-cubic-seed{k}", {}).get("loadavg_before"),
            "load_splitway_cubic": runs.get(f"parity-splitway_cubic-seed{k}", {}).get("loadavg_before"),
        })
for chain, ps in pairs.items():
    ratios = [p["ratio"] for p in ps if p["ratio"] is not None]
    cub = [p["cubic_ms"] for p in ps if p["ratio"] is not None]
    swc = [p["splitway_cubic_ms"] for p in ps if p["ratio"] is not None]
    summary["parity"][chain] = {
        "pairs": len(ratios),
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_min": min(ratios, default=None),
        "ratio_max": max(ratios, default=None),
        "ratio_median_ci_order_stats": sign_ci(ratios),
        "splitway_cubic_slower_in": sum(r > 1 for r in ratios),
        "cubic_ms_median": statistics.median(cub) if cub else None,
        "splitway_cubic_ms_median": statistics.median(swc) if swc else None,
        "each": ps,
    }
for p in sorted(d.glob("njit-lossy-*.json")):
    cc = p.stem[len("njit-lossy-"):]
    rep, m = rows(p)
    summary["njit_lossy"][cc] = {
        "reps": rep["reps"], "quick": rep["quick"], "commit": rep["commit"],
        "load_start": rep["load_average_start"], "load_end": rep["load_average_end"],
        "chains": {c: {"n": r["n"], "status": r["status"], "suspect": r.get("suspect"),
                       "total_ms": r["total_ms"]} for c, r in m.items()},
    }
summary["meta"] = meta
print(json.dumps(summary, indent=1))
