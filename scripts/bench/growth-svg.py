#!/usr/bin/env python3
"""Charts (SVG) and a summary from a bench-growth raw file.

Usage: growth-svg.py bench-results/growth-<stamp>.txt
Writes growth-<stamp>-{cpu,memory,setup}.svg and growth-<stamp>.summary.txt
beside it. Values are medians over rounds; no dependency beyond Python.
"""
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

COLORS = {"splitway": "#1f77b4", "haproxy": "#d62728", "pair": "#2ca02c",
          "pair-rc": "#98df8a", "pair-rs": "#17becf", "direct": "#7f7f7f"}


def load(path):
    vals = defaultdict(list)  # (test, method, x) -> [value]
    for line in open(path):
        if not line[:1].isdigit():
            continue
        f = line.split()
        if len(f) != 6:
            continue
        _, method, test, x, value, _unit = f
        try:
            vals[(test, method, float(x))].append(float(value))
        except ValueError:
            pass
    med = defaultdict(dict)  # (test, method) -> {x: median}
    for (test, method, x), v in vals.items():
        med[(test, method)][x] = statistics.median(v)
    return med


def chart(title, xlabel, ylabel, series, path, logx=True):
    """series: list of (label, color, dashed, {x: y})."""
    w, h, ml, mr, mt, mb = 720, 420, 70, 160, 40, 50
    pts = [(x, y) for _, _, _, s in series for x, y in s.items()]
    if not pts:
        return
    xs = [x for x, _ in pts if not logx or x > 0]
    x0, x1 = min(xs), max(xs)
    y1 = max(y for _, y in pts) * 1.1 or 1.0
    fx = (lambda x: math.log10(x)) if logx else (lambda x: x)
    span = (fx(x1) - fx(x0)) or 1.0

    def px(x):
        return ml + (fx(x) - fx(x0)) / span * (w - ml - mr)

    def py(y):
        return h - mb - y / y1 * (h - mt - mb)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>',
         f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="black"/>',
         f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="black"/>',
         f'<text x="{(ml + w - mr) / 2}" y="{h - 12}" text-anchor="middle">{xlabel}</text>',
         f'<text transform="translate(16,{(mt + h - mb) / 2}) rotate(-90)" text-anchor="middle">{ylabel}</text>']
    # A tick at every x; its label unless it would overlap the previous one
    # (close levels on a linear axis, e.g. 1,000 and 2,000 of 18,000).
    right = -math.inf
    for x in sorted({x for x, _ in pts}):
        o.append(f'<line x1="{px(x):.1f}" y1="{h - mb}" x2="{px(x):.1f}" y2="{h - mb + 5}" stroke="black"/>')
        half = 3.5 * len(f"{x:g}")  # ~7 px per digit at 12 px
        if px(x) - half < right + 4:
            continue
        right = px(x) + half
        o.append(f'<text x="{px(x):.1f}" y="{h - mb + 18}" text-anchor="middle">{x:g}</text>')
    for i in range(6):
        y = y1 * i / 5
        o.append(f'<line x1="{ml}" y1="{py(y):.1f}" x2="{w - mr}" y2="{py(y):.1f}" stroke="#eee"/>')
        o.append(f'<text x="{ml - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
    for i, (label, color, dashed, s) in enumerate(series):
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(s.items()))
        dash = ' stroke-dasharray="6,4"' if dashed else ""
        o.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for x, y in s.items():
            o.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        ly = mt + 10 + 18 * i
        o.append(f'<line x1="{w - mr + 10}" y1="{ly}" x2="{w - mr + 34}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
        o.append(f'<text x="{w - mr + 40}" y="{ly + 4}">{label}</text>')
    o.append("</svg>")
    Path(path).write_text("\n".join(o) + "\n")


def fit(points):
    """Least-squares slope and intercept of {x: y}."""
    xs, ys = list(points), [points[x] for x in points]
    if len(xs) < 2:
        return None, None
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None, None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def main():
    raw = Path(sys.argv[1])
    med = load(raw)
    stem = raw.with_suffix("")
    methods = [m for m in COLORS if any(k[1] == m for k in med)]
    lines = [f"# summary of {raw.name} (medians over rounds)"]

    cpu = [(m, COLORS[m], m.startswith("pair-"), med[("cpu_per_gb", m)]) for m in methods if ("cpu_per_gb", m) in med]
    chart("Proxy CPU per GB against parallel streams (iperf3)", "parallel streams", "CPU-seconds per GB",
          cpu, f"{stem}-cpu.svg")
    for m, _, _, s in cpu:
        gb = med.get(("gbit_s", m), {})
        lines.append("cpu_per_gb " + m + " " + " ".join(
            f"{x:g}:{y:.3f}" + (f"@{gb[x]:.1f}Gb/s" if x in gb else "") for x, y in sorted(s.items())))

    mem = [(m, COLORS[m], m.startswith("pair-"), {x: y / 1024 for x, y in med[("rss_kb", m)].items()})
           for m in methods if ("rss_kb", m) in med]
    chart("Proxy RSS against open idle connections", "open connections", "RSS (MB)", mem,
          f"{stem}-memory.svg", logx=False)
    # The memory sweep runs every proxy process as two copies (<name>.a,
    # <name>.b); the method's rows are their sums.
    copies = sorted({k[1] for k in med if k[0] == "rss_kb" and "." in k[1]})
    for m, _, _, s in mem:
        slope, icpt = fit({x: y * 1024 * 1024 for x, y in s.items() if x > 0})
        per = f"{slope:.0f} B/connection (least squares over {len(s) - 1} levels)" if slope is not None else "n/a"
        n = sum(1 for c in copies if c.rsplit(".", 1)[0] == m or c.startswith(m + "-"))
        procs = f" ({n} processes)" if n > 1 else ""
        lines.append(f"memory {m}{procs} idle {s.get(0.0, float('nan')):.2f} MB, at {max(s):g}: {s[max(s)]:.2f} MB, {per}")
    if copies:
        # Each copy at the top level: how even the halves are, and how far
        # each process is from RLIMIT_NOFILE (open descriptors).
        parts = []
        for c in copies:
            rss, fds = med[("rss_kb", c)], med.get(("fds", c), {})
            x = max(rss)
            parts.append(f"{c} {rss[x] / 1024:.2f} MB" + (f"/{fds[x]:.0f} fds" if x in fds else "") + f"@{x:g}")
        lines.append("memory per process " + " ".join(parts))

    setup = []
    for m in methods:
        for q, dashed in (("p50_us", True), ("p99_us", False)):
            key = (f"setup_{q}", m)
            if key in med:
                setup.append((f"{m} {q[:3]}", COLORS[m], dashed, {x: y / 1000 for x, y in med[key].items()}))
    chart("Setup latency against new connections per second", "new connections per second (offered)",
          "connect to first byte (ms)", setup, f"{stem}-setup.svg")
    for m in methods:
        p50, p99 = med.get(("setup_p50_us", m), {}), med.get(("setup_p99_us", m), {})
        got = med.get(("setup_achieved", m), {})
        if not p99:
            continue  # the pair's relays apart have no setup rows
        lines.append("setup " + m + " " + " ".join(
            f"{x:g}/s:p50={p50.get(x, float('nan')):.0f}us,p99={p99.get(x, float('nan')):.0f}us,got={got.get(x, float('nan')):.0f}"
            for x in sorted(p99)))
    summary = "\n".join(lines) + "\n"
    Path(f"{stem}.summary.txt").write_text(summary)
    print(summary, end="")


if __name__ == "__main__":
    main()
