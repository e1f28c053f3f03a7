#!/usr/bin/env python3
"""The relay binary's footprint against its baseline (issue #31): fails when
idle RSS grows by more than 10 %; prints exec -> READY=1 beside the C floor.

The relay runs the README's rc config (TPROXY on eth0, SOCKS5, HTTP CONNECT,
one peer) in a network namespace of its own (`swfp-<pid>`, removed on every
exit), where `eth0` is one end of a veth pair inside it and the peer's
address leads nowhere: nothing it does can leave the namespace. Each round starts the C
floor (scripts/bench/lib/listen-floor.c, a program that only listens and
sends READY=1) and the relay, alternating which goes first. RSS is compared
in kB (the same source and toolchain build the same binary; its rounds
agree within 3 %). Start-up time is printed but not judged: on the README's
config it is mostly reading and parsing the kernel's BTF (libbpf and aya
each do it), the BPF loads, and `nft`, which overlap since 2026-11-29; its
rounds spread from 36 to 72 ms in one run, and one binary's median moved by
9 % between two runs minutes apart (docs/efficiency.md), so a 10 % bound
would fail at random.

    footprint-check.py RELAY FLOOR BASELINE [--rounds N] [--write-baseline]

BASELINE holds `key = value` lines (rss_kb, ready_ms, floor_ms,
ready_over_floor) and comments saying where they were measured.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TOLERANCE = 1.10

RC = """name = "rc"
psk_file = "psk.key"

[[listen]]
mode = "tproxy"
addr = "0.0.0.0:7000"
intercept = { interfaces = ["eth0"], ports = [80, 443] }

[[listen]]
mode = "socks5"
addr = "127.0.0.1:1080"

[[listen]]
mode = "http-connect"
addr = "127.0.0.1:3128"

[[peer]]
name = "rs"
addr = "10.0.12.2:7100"

[[route]]
dst = "10.0.3.0/24"
via = "rs"
"""


def run(*args):
    subprocess.run(args, check=True, capture_output=True)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit(f"no VmRSS for {pid}")


def start(ns, argv, notify_path):
    """exec -> READY=1 in ms, and the idle RSS 1 s later, of argv in ns."""
    if os.path.exists(notify_path):
        os.unlink(notify_path)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(10)
    # The binary's pages in the page cache first: a start that reads from
    # disk measures the disk.
    with open(argv[0], "rb") as f:
        while f.read(1 << 20):
            pass
    started = time.monotonic_ns()
    p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE,
                         env=dict(os.environ, RUST_LOG="warn", NOTIFY_SOCKET=notify_path))
    try:
        msg = notify.recv(64)
    except TimeoutError:
        p.kill()
        raise SystemExit(f"{argv[0]}: no READY=1 within 10 s: {p.communicate()[1].decode()[-2000:]}")
    ready_ms = (time.monotonic_ns() - started) / 1e6
    notify.close()
    if msg != b"READY=1":
        raise SystemExit(f"{argv[0]}: expected READY=1, got {msg!r}")
    time.sleep(1.0)  # idle: after start-up work (admin, timers, pool dials) settles
    # `ip netns exec` execs the binary in place: p.pid is the relay.
    rss = rss_kb(p.pid)
    p.terminate()
    p.wait()
    return ready_ms, rss


def read_baseline(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                key, _, value = line.partition("=")
                out[key.strip()] = float(value)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("relay")
    ap.add_argument("floor")
    ap.add_argument("baseline")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--write-baseline", action="store_true")
    a = ap.parse_args()
    ns = f"swfp-{os.getpid()}"
    work = tempfile.mkdtemp(prefix="swfp-")
    notify_path = os.path.join(work, "notify.sock")
    cfg = os.path.join(work, "rc.toml")
    with open(cfg, "w") as f:
        f.write(RC)
    psk = subprocess.run([a.relay, "keygen"], check=True, capture_output=True, text=True).stdout
    with open(os.path.join(work, "psk.key"), "w") as f:
        f.write(psk)
    os.chmod(os.path.join(work, "psk.key"), 0o600)
    run("ip", "netns", "add", ns)
    try:
        run("ip", "-n", ns, "link", "set", "lo", "up")
        # A veth pair inside the namespace (no dummy module on such hosts).
        run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
        run("ip", "-n", ns, "addr", "add", "10.0.12.1/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "eth1", "up")
        relay = [a.relay, "relay", "--config", cfg]
        floor = [a.floor]
        ready, floor_ready, rss = [], [], []
        for r in range(a.rounds):
            for which in ("floor", "relay") if r % 2 else ("relay", "floor"):
                if which == "floor":
                    floor_ready.append(start(ns, floor, notify_path)[0])
                else:
                    ms, kb = start(ns, relay, notify_path)
                    ready.append(ms)
                    rss.append(kb)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    print(f"footprint-check: ready ms per round {[round(x, 1) for x in ready]}, "
          f"floor {[round(x, 1) for x in floor_ready]}")
    m = {
        "rss_kb": statistics.median(rss),
        "ready_ms": statistics.median(ready),
        "floor_ms": statistics.median(floor_ready),
    }
    m["ready_over_floor"] = m["ready_ms"] / m["floor_ms"]
    print(f"footprint-check: relay on the README's rc config, {a.rounds} rounds: idle RSS "
          f"{m['rss_kb']:.0f} kB, exec -> READY=1 {m['ready_ms']:.2f} ms, floor "
          f"{m['floor_ms']:.2f} ms ({m['ready_over_floor']:.2f}x); RSS per round {rss}")
    if a.write_baseline:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        with open(a.baseline, "w") as f:
            f.write(f"# scripts/bench/footprint-check.py --write-baseline, "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, commit {commit}, "
                    f"kernel {os.uname().release}, {a.rounds} rounds\n")
            for key, value in m.items():
                f.write(f"{key} = {value:.3f}\n")
        print(f"footprint-check: baseline written to {a.baseline}")
        return
    base = read_baseline(a.baseline)
    failed = []
    for key in ("rss_kb",):
        limit = base[key] * TOLERANCE
        verdict = "ok" if m[key] <= limit else "REGRESSED"
        print(f"footprint-check: {key} {m[key]:.3f} against baseline {base[key]:.3f} "
              f"(limit {limit:.3f}): {verdict}")
        if m[key] > limit:
            failed.append(key)
    if failed:
        sys.exit(f"footprint-check: {', '.join(failed)} grew by more than 10 % "
                 f"(if intended, rewrite {a.baseline} with --write-baseline and say why)")


if __name__ == "__main__":
    main()
