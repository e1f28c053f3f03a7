#!/usr/bin/env python3
"""Footprint of splitway binaries side by side: idle RSS (anon / file) and
PSS after start, and exec → listening, alternating binaries in every round.

Usage: footprint-binaries.py ROUNDS LABEL=BINARY [LABEL=BINARY ...]
The relay runs the bench's minimal config (one HTTP CONNECT listener, admin
on, route direct) on loopback ports 17000/17050. Prints one row per
measurement (round label metric value unit) and medians at the end.
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CONFIG = """name = "footprint"
admin = "127.0.0.1:17050"

[[listen]]
mode = "http-connect"
addr = "127.0.0.1:17000"

[[route]]
dst = "127.0.0.0/8"
via = "direct"
"""


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0])
    # PSS shares each shared-library page among the processes mapping it:
    # the fair figure when a static binary is compared with a dynamic one.
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1])
    return out


def one(binary, cfg):
    t0 = time.perf_counter()
    p = subprocess.Popen([binary, "relay", "--config", cfg], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="warn"))
    while True:
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", 17000))
            break
        except OSError:
            if p.poll() is not None:
                raise SystemExit(f"{binary} exited with {p.returncode}")
        finally:
            s.close()
    ready_ms = (time.perf_counter() - t0) * 1000
    time.sleep(1.0)  # idle: after start-up work (admin, timers) settles
    st = status(p.pid)
    p.terminate()
    p.wait()
    return ready_ms, st


def main():
    rounds = int(sys.argv[1])
    bins = [a.split("=", 1) for a in sys.argv[2:]]
    cfg = os.path.join(tempfile.mkdtemp(), "footprint.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    print(f"# footprint-binaries {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    print(f"# kernel {os.uname().release}, {os.cpu_count()} cpus, load before {open('/proc/loadavg').read().split()[:3]}")
    for label, b in bins:
        size = subprocess.run(["size", b], capture_output=True, text=True).stdout.splitlines()[-1].split()
        print(f"# {label}: {b}, text {size[0]} data {size[1]} bss {size[2]} bytes")
    rows = []
    for r in range(1, rounds + 1):
        for label, b in (bins if r % 2 else bins[::-1]):
            ready, st = one(b, cfg)
            for metric, value, unit in (("ready_ms", f"{ready:.3f}", "ms"), ("rss_kb", st["VmRSS"], "kB"),
                                        ("rss_anon_kb", st["RssAnon"], "kB"), ("rss_file_kb", st["RssFile"], "kB"),
                                        ("pss_kb", st["Pss"], "kB")):
                print(f"{r} {label} {metric} {value} {unit}")
                rows.append((label, metric, float(value)))
    print(f"# load after {open('/proc/loadavg').read().split()[:3]}")
    for label, _ in bins:
        for metric in ("ready_ms", "rss_kb", "rss_anon_kb", "rss_file_kb", "pss_kb"):
            v = [x for l, m, x in rows if l == label and m == metric]
            extra = f" min {min(v):.3f}" if metric == "ready_ms" else ""
            print(f"# {label} {metric} median {statistics.median(v):.3f}{extra}")


if __name__ == "__main__":
    main()
