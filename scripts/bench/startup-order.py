#!/usr/bin/env python3
"""Writes crates/splitway-relay-cli/startup-order.txt: the functions a relay runs from
exec to idle (then on its first connections), in first-touch order, for the
linker's --symbol-ordering-file (crates/splitway-relay-cli/build.rs).

Why: an idle relay maps its code 64 KB at a time (fault-around), so startup
code scattered over the 8 MB of .text makes RSS, page faults and, with a cold
page cache, disk reads grow with how scattered it is, not with how much runs.
Packed together in the order it runs, the same code costs a fraction of that.

How: scripts/bench/lib/pagetouch.c (LD_PRELOAD) records every 4 KB page of the
binary a process touches and the instruction that touched it. The functions
holding those instructions come first; the other functions on touched pages
follow (they may have run too: only a page's first touch is seen). Running
this again on a binary built with the order refines it.

Usage: startup-order.py [BINARY] [--out FILE]   (default target/release/splitway)
       startup-order.py --coverage BINARY     how many of the file's names BINARY
                                              still has (a stale file places fewer)
Traced, each until idle and then through a few connections: the footprint
config (HTTP CONNECT + admin, route direct), and the README's minimal rs (peer
listener) and rc (TPROXY on eth0, SOCKS5, HTTP CONNECT, a peer; no congestion
key, so learned windows load), all in a throwaway namespace (`swpt<pid>`,
removed on every exit): no relay runs on the host's own loopback.
"""
import bisect
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NS = f"swpt{os.getpid()}"

FOOTPRINT = """name = "footprint"
admin = "127.0.0.1:{admin}"
[[listen]]
mode = "http-connect"
addr = "127.0.0.1:{port}"
[[route]]
dst = "127.0.0.0/8"
via = "direct"
"""
# rs listens on 127.0.0.3: rc's nesting guard takes its peers' addresses for
# relays, and refuses proxy requests from them (policy.allow_relay_clients),
# so the tracer's clients, on 127.0.0.1, must not share rs's address.
RS = """name = "rs"
psk_file = "{psk}"
admin = "127.0.0.1:{admin}"
[[listen]]
mode = "peer"
addr = "127.0.0.3:{peer}"
[[route]]
dst = "0.0.0.0/0"
via = "direct"
"""
RC = """name = "rc"
psk_file = "{psk}"
admin = "127.0.0.1:{admin}"
[[listen]]
mode = "tproxy"
addr = "0.0.0.0:7000"
intercept = {{ interfaces = ["eth0"], ports = [80] }}
[[listen]]
mode = "socks5"
addr = "127.0.0.1:1080"
[[listen]]
mode = "http-connect"
addr = "127.0.0.1:{port}"
[[peer]]
name = "rs"
addr = "127.0.0.3:{peer}"
[[route]]
dst = "127.0.0.2/32"
via = "rs"
[[route]]
dst = "0.0.0.0/0"
via = "direct"
"""


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def echo_server(listener):
    while True:
        try:
            c, _ = listener.accept()
        except OSError:
            return
        with c:
            while data := c.recv(65536):
                c.sendall(data)


def through(port, target):
    """The first connections: 20 HTTP CONNECTs, in the relay's namespace."""
    def run(netns):
        sh("ip", "netns", "exec", netns, sys.executable, __file__, "--connect", str(port),
           target)
    return run


def connect_requests(port, target, n):
    """HTTP CONNECT to `target` through the relay, 4 KB echoed each."""
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    raise SystemExit(f"relay closed the CONNECT to {target}: {head!r}")
                head += chunk
            if b" 200 " not in head.split(b"\r\n")[0]:
                raise SystemExit(f"CONNECT {target}: {head!r}")
            s.sendall(b"x" * 4096)
            got = 0
            while got < 4096:
                got += len(s.recv(65536))


def trace(binary, netns, config, out_dir, label, busy=None):
    """Runs the relay under the tracer; returns its idle trace, and its
    trace after `busy(netns)` (the first connections) if given."""
    cfg = os.path.join(out_dir, f"{label}.toml")
    with open(cfg, "w") as f:
        f.write(config)
    notify_path = os.path.join(out_dir, f"{label}.notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(30)
    env = dict(os.environ, LD_PRELOAD=os.path.join(out_dir, "pagetouch.so"),
               PAGETOUCH_OUT=os.path.join(out_dir, f"{label}.trace"),
               NOTIFY_SOCKET=notify_path, RUST_LOG="warn")
    prefix = ["ip", "netns", "exec", netns]
    log = open(os.path.join(out_dir, f"{label}.log"), "w")
    p = subprocess.Popen(prefix + [binary, "relay", "--config", cfg], env=env,
                         stdout=subprocess.DEVNULL, stderr=log)
    try:
        # STATUS=listening first, then READY=1 (with its STATUS=serving).
        msg = notify.recv(256)
        while msg.startswith(b"STATUS="):
            msg = notify.recv(256)
        if msg.split(b"\n")[0] != b"READY=1":
            raise SystemExit(f"{label}: expected READY=1, got {msg!r}")
        time.sleep(1.0)  # idle: timers and the admin server settle
        traces = []
        for phase in ("idle", "busy") if busy else ("idle",):
            if phase == "busy":
                busy(netns)
            p.send_signal(12)  # SIGUSR2: the tracer writes what it has
            path = os.path.join(out_dir, f"{label}.trace")
            for _ in range(100):
                time.sleep(0.05)
                if os.path.exists(path) and os.path.getsize(path) > 0:
                    break
            time.sleep(0.1)
            dst = os.path.join(out_dir, f"{label}.{phase}")
            os.replace(path, dst)
            traces.append(dst)
        return traces
    finally:
        p.terminate()
        p.wait()
        notify.close()
        if p.returncode not in (0, -15):
            log.flush()
            raise SystemExit(f"{label}: relay exited {p.returncode}:\n"
                             + open(log.name).read()[-2000:])


def symbols(binary):
    segs, syms = [], []
    for line in subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            segs.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
    for line in subprocess.run(["nm", "-S", "--defined-only", "--no-demangle", binary],
                               capture_output=True, text=True, check=True).stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "tTwWrR" and int(f[1], 16) > 0:
            syms.append((int(f[0], 16), int(f[1], 16), f[3]))
    syms.sort()
    return segs, syms


def order(binary, traces):
    segs, syms = symbols(binary)
    starts = [s[0] for s in syms]

    def vaddr(off):
        for o, v, size in segs:
            if o <= off < o + size:
                return off - o + v
        return None

    def holding(a):
        i = bisect.bisect_right(starts, a) - 1
        return i if i >= 0 and syms[i][0] <= a < syms[i][0] + syms[i][1] else None

    seen, names = set(), []
    for phase in ("idle", "busy"):
        entered, mates, pages = [], [], 0
        for t in (t for t in traces if t.endswith(phase)):
            for line in open(t):
                page, ip, _prot = line.split()
                pages += 1
                i = holding(int(ip, 16))
                if i is not None and i not in seen:
                    seen.add(i)
                    entered.append(i)
                pv = vaddr(int(page, 16))
                if pv is None:
                    continue
                j = max(0, bisect.bisect_right(starts, pv) - 1)
                while j < len(syms) and syms[j][0] < pv + 4096:
                    if syms[j][0] + syms[j][1] > pv and j not in seen:
                        seen.add(j)
                        mates.append(j)
                    j += 1
        size = lambda ix: sum(syms[i][1] for i in ix)
        print(f"# {phase}: {pages} page touches; {len(entered)} more functions entered "
              f"({size(entered)} B), {len(mates)} more on touched pages ({size(mates)} B)",
              file=sys.stderr)
        names += [syms[i][2] for i in entered + mates]
    return names


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--connect":
        connect_requests(int(sys.argv[2]), sys.argv[3], 20)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--coverage":
        names = [n for n in open(os.path.join(ROOT, "crates/splitway-relay-cli/startup-order.txt")).read().split()]
        have = {s[2] for s in symbols(sys.argv[2])[1]}
        found = sum(n in have for n in names)
        print(f"# startup-order.txt: {found} of {len(names)} names in {sys.argv[2]} "
              f"({100 * found / max(1, len(names)):.0f} %)")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--echo":
        echo_server(socket.create_server(("127.0.0.1", int(sys.argv[2]))))
        return
    args = [a for a in sys.argv[1:]]
    out = os.path.join(ROOT, "crates/splitway-relay-cli/startup-order.txt")
    if "--out" in args:
        i = args.index("--out")
        out = args[i + 1]
        del args[i:i + 2]
    binary = os.path.abspath(args[0] if args else os.path.join(ROOT, "target/release/splitway"))
    with tempfile.TemporaryDirectory(prefix="splitway-startup-order-") as d:
        sh("cc", "-O2", "-shared", "-fPIC", "-o", os.path.join(d, "pagetouch.so"),
           os.path.join(ROOT, "scripts/bench/lib/pagetouch.c"))
        psk = os.path.join(d, "psk.key")
        with open(psk, "w") as f:
            f.write(subprocess.run([binary, "keygen"], capture_output=True, text=True,
                                   check=True).stdout)
        os.chmod(psk, 0o600)
        sh("ip", "netns", "add", NS)
        try:
            sh("ip", "-n", NS, "link", "set", "lo", "up")
            sh("ip", "-n", NS, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
            sh("ip", "-n", NS, "link", "set", "eth0", "up")
            sh("ip", "-n", NS, "addr", "add", "10.0.1.2/24", "dev", "eth0")
            ns_echo = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, __file__,
                                        "--echo", "17199"])
            try:
                # The echo server listens before the first trace's connections.
                for _ in range(100):
                    ss = subprocess.run(["ip", "netns", "exec", NS, "ss", "-Hltn", "sport = :17199"],
                                        capture_output=True, text=True).stdout
                    if ss.strip():
                        break
                    time.sleep(0.05)
                else:
                    raise SystemExit("the namespace's echo server did not listen")
                traces = trace(binary, NS, FOOTPRINT.format(admin=17150, port=17100), d,
                               "footprint", through(17100, "127.0.0.1:17199"))
                traces += trace(binary, NS, RS.format(psk=psk, admin=17151, peer=17101), d, "rs")
                traces += trace(binary, NS, RC.format(psk=psk, admin=17152, port=17102,
                                                      peer=17101), d, "rc",
                                through(17102, "127.0.0.1:17199"))
            finally:
                ns_echo.terminate()
        finally:
            subprocess.run(["ip", "netns", "del", NS])
        # Startup and idle of every config first, then their first connections.
        names = order(binary, traces)
    with open(out, "w") as f:
        f.write("\n".join(names) + "\n")
    print(f"# wrote {len(names)} symbols to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
