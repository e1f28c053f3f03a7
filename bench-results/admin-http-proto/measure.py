#!/usr/bin/env python3
"""Footprint of the admin HTTP server: binary size, exec->listening (the
first successful connect to the admin port after fork+exec; minimum of
RUNS) and RSS once idle after one GET /status, for each binary given.

Usage: measure.py OUT RUNS NAME=PATH[:ARG...] ...  ARG `{port}` is replaced.
Exec->listening is load-sensitive: the minimum over many runs is the figure;
the load average is recorded before and after.
"""
import os, signal, socket, subprocess, sys, time

def load():
    return open("/proc/loadavg").read().split()[:3]

def rss_kib(pid):
    values = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def get_status(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:80]
    return len(data)

def one_run(cmd):
    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in cmd]
    start = time.perf_counter_ns()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                listening_us = (time.perf_counter_ns() - start) / 1000
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"{argv} exited with {proc.returncode}")
        get_status(port)
        time.sleep(0.3)
        mem = rss_kib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return listening_us, mem["VmRSS"], mem["VmHWM"]

def main():
    out, runs, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"# admin HTTP server footprint, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, "
        f"commit {commit}{' (uncommitted changes)' if dirty else ''}, kernel {os.uname().release}, "
        f"{os.cpu_count()} CPUs, load before {' '.join(load())}",
        f"# {runs} runs each, alternating; exec->listening = first connect() to the admin port after Popen;",
        "# RSS after one GET /status and 0.3 s idle (VmRSS, VmHWM from /proc/PID/status).",
    ]
    bins = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        cmd = rest.split(":")
        size = os.path.getsize(cmd[0])
        stripped = "/tmp/admin-http-stripped"
        subprocess.run(["strip", "-o", stripped, cmd[0]], check=True)
        ssize = os.path.getsize(stripped)
        os.unlink(stripped)
        lines.append(f"binary {name}: {cmd[0]} {size} bytes as built, {ssize} stripped")
        bins.append((name, cmd))
    results = {name: [] for name, _ in bins}
    for i in range(runs):
        for name, cmd in (bins if i % 2 == 0 else bins[::-1]):
            results[name].append(one_run(cmd))
    for name, _ in bins:
        for us, rss, hwm in results[name]:
            lines.append(f"run {name}: listening_us {us:.0f} rss_kib {rss} hwm_kib {hwm}")
    for name, _ in bins:
        r = results[name]
        us = sorted(x[0] for x in r)
        rss = sorted(x[1] for x in r)
        lines.append(
            f"summary {name}: exec->listening min {us[0]:.0f} us, median {us[len(us)//2]:.0f} us; "
            f"idle RSS min {rss[0]} KiB, median {rss[len(rss)//2]} KiB"
        )
    lines.append(f"# load after {' '.join(load())}")
    text = "\n".join(lines) + "\n"
    open(out, "w").write(text)
    print(text, end="")

main()
