import json, glob, os, sys
D = sys.argv[1]
runs = {json.loads(l)["run"]: json.loads(l) for l in open(f"{D}/runs.jsonl")}
out = {"what": "cc-resume (1 MB over 32.7/215/26 ms, 6 connections per run through one pair of relay processes; the first has nothing saved), splitway_resume with the jump at CA_EVENT_TX_START vs cubic, --relay-congestion on every relay leg",
       "drivers": ["scripts/cc-resume-pool.sh (split+es+pool rounds)", "run-split-full.sh (split, full)"],
       "results": {}}
for f in sorted(glob.glob(f"{D}/*.json")):
    name = os.path.basename(f)[:-5]
    if name == "summary": continue
    d = json.load(open(f))
    for c in d["chains"]:
        for r in c["results"]:
            out["results"][name] = {"config": r["config"], "relay_congestion": name.split("-")[1] if "+" not in name.split("-")[0] or True else None,
                "commit": d["commit"], "kernel": d["kernel"], "date": d["date"], "n": r["n"], "failures": r["failures"], "status": r["status"],
                "total_ms": r["total_ms"], "suspect": r["suspect"], "load_average_start": d["load_average_start"], "load_average_end": d["load_average_end"],
                "loadavg_before_run": runs.get(name, {}).get("loadavg_before")}
print(json.dumps(out, indent=1))
