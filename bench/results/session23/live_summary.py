"""Per live T=0/T=1 run of session 23: verify steps, whether the policy drafted after its step-7 plan,
the first step after the batch fell to 16 with 8+ accepted draft tokens (the repeating tail on), and
per batch range: steps, seconds, drafting steps, accepted/drafted, shadow scores right/drafts.
    python bench/results/session23/live_summary.py bench/results/session23/live_*/events-specactor-T*.jsonl"""
import json
import sys

for path in sys.argv[1:]:
    ev = [json.loads(line) for line in open(path)]
    steps = [e for e in ev if e["event"] == "verify.step"]
    assigns = [e for e in ev if e["event"] == "policy.assign" and e["step"] == 7]
    after7 = "on" if any(e["window"] > 0 for e in assigns) else "off"
    ranges: dict[int, list[float]] = {}
    for e in steps:
        b = e["batch_size"]
        key = 32 if b >= 32 else 16 if b >= 16 else 8 if b >= 8 else 4 if b >= 4 else 1
        r = ranges.setdefault(key, [0, 0.0, 0, 0, 0, 0, 0])
        r[0] += 1
        r[1] += e["step_ms"] / 1000
        r[2] += e["drafted"] > 0
        r[3] += e["accepted"]
        r[4] += e["drafted"]
        for _, (drafted, accepted, drafts) in (e.get("shadowed") or {}).items():
            r[5] += accepted
            r[6] += drafts
    half = next((e["step"] for e in steps if e["step"] > 1 and e["batch_size"] <= 16), None)
    on = next((e["step"] for e in steps if half and e["step"] >= half and e["accepted"] >= 8), None)
    print(f"{path}: {len(steps)} steps, step-7 plan {after7}, batch <= 16 from step {half}, tail drafting from {on}")
    for key, r in sorted(ranges.items(), reverse=True):
        print(f"   batch {key}+: {r[0]} steps {r[1]:.1f} s, drafting {r[2]}, accepted {r[3]}/{r[4]}, "
              f"shadow right {r[5]}/{r[6]}")
