"""Host part of a step (step_ms - forward_ms) against the draft messages sent during it."""
import json, sys, bisect, statistics as st, collections
for path in sys.argv[1:]:
    steps, chunks = [], []
    for l in open(path):
        x = json.loads(l)
        if x["event"] == "verify.step" and x["prefill_tokens"] == 0:
            steps.append(x)
        elif x["event"] == "draft.chunk":
            chunks.append((x["ts"], x["requests"], x["tokens"]))
    chunks.sort()
    ts = [c[0] for c in chunks]
    by = collections.defaultdict(list)
    for s in steps:
        end = s["ts"]; start = end - s["step_ms"] / 1e3
        i, j = bisect.bisect_left(ts, start), bisect.bisect_left(ts, end)
        n = j - i
        reqs = sum(c[1] for c in chunks[i:j])
        by[(s["batch_size"] >= 24, min(n, 4))].append(s["step_ms"] - s["forward_ms"])
    print(path.split("/")[-1], " ".join(f"{'b>=24' if k[0] else 'b<24'} n={k[1]}: {len(v)} {st.median(v):.2f}" for k, v in sorted(by.items())))
