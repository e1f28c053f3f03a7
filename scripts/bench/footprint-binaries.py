#!/usr/bin/env python3
"""Footprint of splitway binaries side by side: idle RSS (anon / file) and
PSS after start, and exec → listening, alternating binaries in every round.

exec → listening is timed from a clock read in the child just before
execve (preexec_fn) to the relay's READY=1 on NOTIFY_SOCKET, which it sends
once every listener listens; the harness sleeps in recv meanwhile, so it
does not compete for the 2 cores the way polling connect() did. Before each
start the binary is read once, so its pages are in the page cache: this
machine's page cache is reclaimed continually (a relay started after 20 s
idle took 5 major faults), and a start that reads from disk measures the
disk. Its shared libraries are read the same way. A `floor` binary (scripts/bench/lib/listen-floor.c) gives the same harness's
time for a C program that only listens and notifies.

Usage: footprint-binaries.py ROUNDS LABEL=BINARY [LABEL=BINARY ...]
The relay runs the bench's minimal config (one HTTP CONNECT listener, admin
on, route direct) on loopback ports 17000/17050, in a network namespace of
its own (`swfb-<pid>`, removed on every exit; since 2026-11-28: earlier runs
used the host's loopback). `ip netns exec` runs inside the timed span, for
every binary alike. Prints one row per
measurement (round label metric value unit) and medians at the end.
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

NOTIFY = os.path.join(tempfile.gettempdir(), f"footprint-notify-{os.getpid()}.sock")
NETNS = f"swfb-{os.getpid()}"

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
    # Page faults up to idle: what fault-around and code layout change.
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    out["minflt"], out["majflt"] = int(fields[7]), int(fields[9])
    return out


def shared_libraries(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return [w for line in out.splitlines() for w in line.split() if w.startswith("/")]


def one(binary, cfg):
    for path in [binary] + shared_libraries(binary):
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    if os.path.exists(NOTIFY):
        os.unlink(NOTIFY)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(NOTIFY)
    notify.settimeout(10)
    clock_r, clock_w = os.pipe()

    def just_before_exec():
        os.write(clock_w, str(time.monotonic_ns()).encode())

    p = subprocess.Popen(["ip", "netns", "exec", NETNS, binary, "relay", "--config", cfg],
                         stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, preexec_fn=just_before_exec,
                         env=dict(os.environ, RUST_LOG="warn", NOTIFY_SOCKET=NOTIFY))
    try:
        # The relay says STATUS=listening once every listener listens, then
        # READY=1 once its start is done: this times READY=1.
        msg = notify.recv(64)
        while msg.startswith(b"STATUS="):
            msg = notify.recv(64)
    except TimeoutError:
        raise SystemExit(f"{binary}: no READY=1 within 10 s (exit {p.poll()})")
    ready_ns = time.monotonic_ns()
    if msg.split(b"\n")[0] != b"READY=1":
        raise SystemExit(f"{binary}: expected READY=1, got {msg!r}")
    os.close(clock_w)
    exec_ns = int(os.read(clock_r, 64))
    os.close(clock_r)
    notify.close()
    ready_ms = (ready_ns - exec_ns) / 1e6
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
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(["ip", "-n", NETNS, "link", "set", "lo", "up"], check=True)
        measure(rounds, bins, cfg, rows)
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    print(f"# load after {open('/proc/loadavg').read().split()[:3]}")
    for label, _ in bins:
        for metric in ("ready_ms", "rss_kb", "rss_anon_kb", "rss_file_kb", "pss_kb", "minflt", "majflt"):
            v = [x for l, m, x in rows if l == label and m == metric]
            extra = f" min {min(v):.3f}" if metric == "ready_ms" else ""
            print(f"# {label} {metric} median {statistics.median(v):.3f}{extra}")


def measure(rounds, bins, cfg, rows):
    for r in range(1, rounds + 1):
        for label, b in (bins if r % 2 else bins[::-1]):
            ready, st = one(b, cfg)
            for metric, value, unit in (("ready_ms", f"{ready:.3f}", "ms"), ("rss_kb", st["VmRSS"], "kB"),
                                        ("rss_anon_kb", st["RssAnon"], "kB"), ("rss_file_kb", st["RssFile"], "kB"),
                                        ("pss_kb", st["Pss"], "kB"), ("minflt", st["minflt"], "faults"),
                                        ("majflt", st["majflt"], "faults")):
                print(f"{r} {label} {metric} {value} {unit}")
                rows.append((label, metric, float(value)))


if __name__ == "__main__":
    main()
