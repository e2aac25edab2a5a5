"""Per run: verify steps, their time, gaps between them, no-draft vs draft steps (GPU events)."""
import json, sys, statistics as st, glob
def load(p):
    return [json.loads(l) for l in open(p) if '"verify.step"' in l]
for path in sorted(sys.argv[1:]):
    s = load(path)
    if not s: continue
    span = s[-1]["ts"] - s[0]["ts"] + s[0]["step_ms"]/1e3
    tot = sum(x["step_ms"] for x in s)/1e3
    fwd = sum(x["forward_ms"] for x in s)/1e3
    gaps = [ (b["ts"]-a["ts"])*1e3 - b["step_ms"] for a,b in zip(s,s[1:])]
    nd = [x for x in s if x["drafted"]==0 and x["prefill_tokens"]==0]
    dr = [x for x in s if x["drafted"]>0]
    nd32 = [x["step_ms"] for x in nd if x["batch_size"]>=24]
    ndf32 = [x["forward_ms"] for x in nd if x["batch_size"]>=24]
    ndsmall = [x["step_ms"] for x in nd if x["batch_size"]<=4]
    print(f"{path.split('/')[-1]:38s} steps {len(s):4d} span {span:5.2f}s steps {tot:5.2f}s fwd {fwd:5.2f}s gaps sum {sum(gaps)/1e3:5.2f}s med {st.median(gaps):.2f}ms | nodraft {len(nd)} b>=24 med {st.median(nd32) if nd32 else 0:.2f} (fwd {st.median(ndf32) if ndf32 else 0:.2f}) b<=4 med {st.median(ndsmall) if ndsmall else 0:.2f} | draft steps {len(dr)} med {st.median([x['step_ms'] for x in dr]) if dr else 0:.2f} drafted {sum(x['drafted'] for x in s)} acc {sum(x['accepted'] for x in s)} waited {sum(x['waited_ms'] for x in s)/1e3:.2f}s")
