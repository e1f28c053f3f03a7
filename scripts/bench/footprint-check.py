#!/usr/bin/env python3
"""The relay binary's footprint against its baseline (issue #31): fails when
idle RSS grows by more than 10 %, or the time from exec to listening above
the C floor's by more than 50 %; prints exec -> READY=1.

The relay runs the README's rc config (TPROXY on eth0, SOCKS5, HTTP CONNECT,
one peer) in a network namespace of its own (`swfp-<pid>`, removed on every
exit), where `eth0` is one end of a veth pair inside it and the peer's
address leads nowhere: nothing it does can leave the namespace. Each round
starts the C floor (scripts/bench/lib/listen-floor.c, a program that only
listens and sends READY=1) and the relay, alternating which goes first.
Both binaries are dropped from the page cache and read back first, so
what fault-around maps does not depend on how their pages got there.

- RSS is compared in kB (the same source and toolchain build the same
  binary; its starts agree within 1 %).
- exec -> listening: from a clock read just before execve to the kernel's
  timestamp of the relay's `STATUS=listening` (sent once every listener
  listens; clients queue from then on). The floor's exec -> READY=1 is
  timed the same way, and what is judged is the relay's median minus the
  floor's, over 71 starts each: the harness's own share (tearing down its
  forked child at exec) moves both alike. That difference is about 1 ms
  and moved between 0.81 and 1.30 ms from run to run for one binary on
  this 2-core VM (docs/efficiency.md), so a 10 % bound would fail at
  random: the bound is 50 %, which an added start-up step of half a
  millisecond crosses. One run over it is measured again, and the second
  run decides.
- exec -> READY=1 (every rule installed and BPF acceleration loaded, every
  start error reported) is printed, not judged: it is mostly parsing the
  kernel's BTF (libbpf and aya each do it), the BPF loads and `nft`, whose
  starts spread from 36 to 73 ms in one run.

    footprint-check.py RELAY FLOOR BASELINE [--rounds N] [--timing-rounds N] [--write-baseline]

BASELINE holds `key = value` lines (rss_kb, listening_above_floor_ms, and
the other medians for the record) and comments saying where they were
measured.
"""
import argparse
import ctypes
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# How far above its baseline each judged figure may go.
TOLERANCE = {"rss_kb": 1.10, "listening_above_floor_ms": 1.50}

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


LIBC = ctypes.CDLL(None, use_errno=True)
SO_TIMESTAMPNS = 35  # = SCM_TIMESTAMPNS; Python's socket module has no name for it


def sent_ns(ancillary):
    """The kernel's CLOCK_REALTIME stamp of a datagram (SO_TIMESTAMPNS)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec * 1_000_000_000 + nsec
    raise SystemExit("a notification without its receive timestamp")

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_REC, MS_SLAVE, MNT_DETACH = 0x4000, 0x80000, 2


def entering(ns, clock_w):
    """A preexec_fn doing what `ip netns exec` does (the network namespace,
    a mount namespace of its own with that namespace's sysfs, where a
    relay's bpffs mount stays too), then reading the clock just before
    execve: the times below start at exec, not at `ip`'s own start. The
    clock is CLOCK_REALTIME, which the kernel's receive timestamps use."""
    def enter():
        def check(ok, what):
            if not ok:
                os.write(2, f"{what}: errno {ctypes.get_errno()}\n".encode())
                os._exit(127)
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        check(LIBC.setns(fd, CLONE_NEWNET) == 0, "setns")
        check(LIBC.unshare(CLONE_NEWNS) == 0, "unshare")
        check(LIBC.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) == 0, "mount --make-rslave /")
        check(LIBC.umount2(b"/sys", MNT_DETACH) == 0, "umount /sys")
        check(LIBC.mount(ns.encode(), b"/sys", b"sysfs", 0, None) == 0, "mount sysfs")
        os.write(clock_w, str(time.clock_gettime_ns(time.CLOCK_REALTIME)).encode())
    return enter


def recache(path):
    """Drops `path` from the page cache and reads it back in whole: what a
    start maps by fault-around depends on how the file's pages came into
    the cache (one build measured 5,136 and 5,768 kB idle, 0.8 and 1.1 ms
    above the floor, written by the linker or read back later)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # a just-linked file's dirty pages would stay
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while f.read(1 << 20):
            pass


def start(ns, argv, notify_path, idle=True):
    """exec -> listening (the relay's STATUS=listening) and exec -> READY=1
    in ms, and the idle RSS 1 s later, of argv in ns."""
    if os.path.exists(notify_path):
        os.unlink(notify_path)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    # Each datagram stamped when the sender queued it: the times do not
    # include this process's own wake-up.
    notify.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    notify.settimeout(10)
    # The binary's pages in the page cache first: a start that reads from
    # disk measures the disk.
    with open(argv[0], "rb") as f:
        while f.read(1 << 20):
            pass
    clock_r, clock_w = os.pipe()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=entering(ns, clock_w), pass_fds=(clock_w,),
                         env=dict(os.environ, RUST_LOG="warn", NOTIFY_SOCKET=notify_path))
    os.close(clock_w)
    started = None
    listening_ms = None
    while True:
        try:
            msg, ancillary, _, _ = notify.recvmsg(256, 64)
        except TimeoutError:
            p.kill()
            raise SystemExit(f"{argv[0]}: no READY=1 within 10 s: {p.communicate()[1].decode()[-2000:]}")
        if started is None:
            started = int(os.read(clock_r, 64))
            os.close(clock_r)
        at_ms = (sent_ns(ancillary) - started) / 1e6
        if msg.startswith(b"STATUS=listening"):
            listening_ms = at_ms
        elif msg.split(b"\n")[0] == b"READY=1":
            ready_ms = at_ms
            break
        else:
            raise SystemExit(f"{argv[0]}: expected STATUS=listening or READY=1, got {msg!r}")
    notify.close()
    # The floor says only READY=1, once it listens.
    if listening_ms is None:
        listening_ms = ready_ms
    rss = None
    if idle:
        time.sleep(1.0)  # idle: after start-up work (admin, timers, pool dials) settles
        rss = rss_kb(p.pid)
    p.terminate()
    p.wait()
    return listening_ms, ready_ms, rss


def read_baseline(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                key, _, value = line.partition("=")
                out[key.strip()] = float(value)
    return out


def measure(a, ns, relay, floor, notify_path):
    """One run, relay and floor alternating: a.rounds starts that idle 1 s
    (RSS), then a.timing_rounds that stop at READY=1 (start-up times; many,
    as one start's time moves with the machine); medians."""
    listening, ready, floor_ready, rss = [], [], [], []
    for r in range(a.rounds + a.timing_rounds):
        idle = r < a.rounds
        for which in ("floor", "relay") if r % 2 else ("relay", "floor"):
            if which == "floor":
                floor_ready.append(start(ns, floor, notify_path, idle)[1])
            else:
                listening_ms, ms, kb = start(ns, relay, notify_path, idle)
                listening.append(listening_ms)
                ready.append(ms)
                if idle:
                    rss.append(kb)
    print(f"footprint-check: ms per start: listening {[round(x, 2) for x in listening]}, "
          f"READY=1 {[round(x, 1) for x in ready]}, floor {[round(x, 2) for x in floor_ready]}")
    m = {
        "rss_kb": statistics.median(rss),
        "listening_ms": statistics.median(listening),
        "ready_ms": statistics.median(ready),
        "floor_ms": statistics.median(floor_ready),
    }
    m["listening_above_floor_ms"] = m["listening_ms"] - m["floor_ms"]
    print(f"footprint-check: relay on the README's rc config, {len(rss)} starts idle, "
          f"{len(listening)} timed: idle RSS {m['rss_kb']:.0f} kB, exec -> listening "
          f"{m['listening_ms']:.2f} ms ({m['listening_above_floor_ms']:.2f} ms above the floor), "
          f"exec -> READY=1 {m['ready_ms']:.2f} ms, floor {m['floor_ms']:.2f} ms; RSS per start {rss}")
    return m


def judge(m, base, key):
    limit = base[key] * TOLERANCE[key]
    ok = m[key] <= limit
    print(f"footprint-check: {key} {m[key]:.3f} against baseline {base[key]:.3f} "
          f"(limit {limit:.3f}): {'ok' if ok else 'REGRESSED'}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("relay")
    ap.add_argument("floor")
    ap.add_argument("baseline")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--timing-rounds", type=int, default=60)
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
    base = None if a.write_baseline else read_baseline(a.baseline)
    failed = []
    run("ip", "netns", "add", ns)
    try:
        run("ip", "-n", ns, "link", "set", "lo", "up")
        # A veth pair inside the namespace (no dummy module on such hosts).
        run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
        run("ip", "-n", ns, "addr", "add", "10.0.12.1/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "eth1", "up")
        relay = [a.relay, "relay", "--config", cfg]
        recache(a.relay)
        recache(a.floor)
        floor = [a.floor]
        m = measure(a, ns, relay, floor, notify_path)
        if a.write_baseline:
            commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()
            with open(a.baseline, "w") as f:
                f.write(f"# scripts/bench/footprint-check.py --write-baseline, "
                        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, commit {commit}, "
                        f"kernel {os.uname().release}, {a.rounds} rounds\n")
                for key, value in m.items():
                    f.write(f"{key} = {value:.3f}\n")
            print(f"footprint-check: baseline written to {a.baseline}")
            return
        if not judge(m, base, "rss_kb"):
            failed.append("rss_kb")
        # The start-up figure moves with the machine more than RSS does: one
        # run over the bound is measured again, and the second run decides.
        if not judge(m, base, "listening_above_floor_ms"):
            print("footprint-check: measuring exec -> listening again")
            if not judge(measure(a, ns, relay, floor, notify_path), base,
                         "listening_above_floor_ms"):
                failed.append("listening_above_floor_ms")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    if failed:
        sys.exit(f"footprint-check: {', '.join(failed)} grew beyond its bound "
                 f"(if intended, rewrite {a.baseline} with --write-baseline and say why)")


if __name__ == "__main__":
    main()
