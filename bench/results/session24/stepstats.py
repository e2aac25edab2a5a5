"""Per run of ab.sh: verify steps, drafted tokens, forward and step seconds, draft chunks, policy.assign
events, and per batch range (steps without drafts) the count, median forward ms and median step-forward ms."""
import json,sys,collections,statistics as st
for f in sys.argv[1:]:
    steps=0; drafted=0; fwd=0.0; stepms=0.0; by=collections.defaultdict(list); ov=collections.defaultdict(list); chunks=0; assigns=0
    for l in open(f+".events.jsonl"):
        e=json.loads(l)
        if e["event"]=="draft.chunk": chunks+=1
        if e["event"]=="policy.assign": assigns+=1
        if e["event"]!="verify.step": continue
        steps+=1; drafted+=e["drafted"]; fwd+=e["forward_ms"]; stepms+=e["step_ms"]
        if e["drafted"]==0 and e["prefill_tokens"]==0:
            b=e["batch_size"]; k="1-3" if b<4 else "4-7" if b<8 else "8-15" if b<16 else "16+"
            by[k].append(e["forward_ms"]); ov[k].append(e["step_ms"]-e["forward_ms"])
    print(f,"steps",steps,"drafted",drafted,"fwd",round(fwd/1e3,1),"step",round(stepms/1e3,1),"chunks",chunks,"assign",assigns,{k:(len(v),round(st.median(v),1),round(st.median(ov[k]),2)) for k,v in sorted(by.items())})
