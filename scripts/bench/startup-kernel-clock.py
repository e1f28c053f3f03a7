#!/usr/bin/env python3
"""exec -> listening and exec -> READY=1 of the relay, and exec -> READY=1 of
the C floor, on the kernel's clock: `perf record -a` of sched_process_exec
and sendto around one footprint-check.py run, so the harness's own latency
(its preexec, its wake-up in recv) is left out of both.

    startup-kernel-clock.py RELAY FLOOR ROUNDS

The relay's notifications are told apart by length: "STATUS=listening;
loading the accelerations" (43 bytes) and "READY=1\\nSTATUS=serving" (22);
the floor sends "READY=1" (7). Prints one line per start and the medians.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile

relay, floor, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(tempfile.mkdtemp(prefix="swkc-"), "perf.data")
subprocess.run(["perf", "record", "-q", "-a", "-e", "sched:sched_process_exec",
                "-e", "syscalls:sys_enter_sendto", "-o", data, "--", "python3",
                os.path.join(here, "footprint-check.py"), relay, floor,
                os.path.join(here, "../../bench-results/footprint-baseline.txt"),
                "--rounds", rounds], check=True)
out = subprocess.run(["perf", "script", "-i", data, "-F", "pid,time,event,trace"],
                     capture_output=True, text=True, check=True).stdout
os.unlink(data)
execs, rows = {}, {"listening": [], "ready": [], "floor": []}
names = {43: "listening", 22: "ready", 7: "floor"}
for line in out.splitlines():
    m = re.match(r"\s*(\d+)\s+([\d.]+):\s+(\S+):\s+(.*)", line)
    if not m:
        continue
    pid, t, event, trace = int(m[1]), float(m[2]), m[3], m[4]
    if event == "sched:sched_process_exec":
        if trace.startswith(f"filename={relay} ") or trace.startswith(f"filename={floor} "):
            execs[pid] = t
    elif pid in execs:
        length = int(re.search(r"len: (0x[0-9a-f]+)", trace)[1], 16)
        what = names.get(length)
        if what and "addr_len: 0x00000000" not in trace:
            ms = (t - execs[pid]) * 1e3
            rows[what].append(ms)
            print(f"pid {pid} exec -> {what} {ms:.3f} ms")
for what, v in rows.items():
    if v:
        print(f"median exec -> {what}: {statistics.median(v):.3f} ms over {len(v)} starts "
              f"(min {min(v):.3f}, max {max(v):.3f})")
