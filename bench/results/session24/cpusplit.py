"""CPU seconds per process (main: the caller, drafters and policy; verifier) between the 2nd and the last
verify.step of a run of ab.sh. Usage: cpusplit.py TAG..."""
import json, sys
for name in sys.argv[1:]:
    d = json.load(open(name + ".cpu.json")); ev = [json.loads(l) for l in open(name + ".events.jsonl")]
    steps = [e["ts"] for e in ev if e["event"] == "verify.step"]
    pids = {}
    for e in ev: pids.setdefault(str(e.get("pid")), set()).add(e.get("actor"))
    t0, t1 = steps[1], steps[-1]
    def at(t):
        best = None
        for ts, v in d["series"]:
            if ts <= t: best = v
        return best
    a, b = at(t0), at(t1)
    out = {}
    for pid in b:
        who = "verifier" if "verifier" in pids.get(pid, ()) else "main"
        out[who] = round(b[pid] - a.get(pid, 0), 1)
    print(name, "span", round(t1 - t0, 1), out)
