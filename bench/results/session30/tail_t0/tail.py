"""Where a T=0 vLLM rollout's tail goes: per request, and the policy's assignments of the last ones."""
import sys
from specactor.event_log import read_events

ev = read_events(sys.argv[1])
fin = [e for e in ev if e["event"] == "request.finished"]
fin.sort(key=lambda e: e["latency_s"])
print("requests by finish time: id tokens steps drafted accepted latency")
for e in fin:
    print(f"  {e['request_id']:>16} {e['tokens']:4d} {e['steps']:4d} {e['drafted']:5d} {e['accepted']:5d} {e['latency_s']:7.2f}")
half = fin[len(fin) // 2 - 1]["latency_s"]
last = [e["request_id"] for e in fin[-4:]]
print("half finished at", half)
for e in ev:
    if e["event"] == "policy.assign" and e["request_id"] in last:
        print("  assign", e["request_id"], "step", e["step"], e["methods"], "w", e["window"], e["mode"], e["reason"][:90])
steps = [e for e in ev if e["event"] == "verify.step"]
tail = [e for e in steps if e["batch_size"] <= 4]
print("steps", len(steps), "tail steps (batch<=4)", len(tail))
if tail:
    import statistics
    print("  tail: new tokens/step", round(statistics.mean(e["new_tokens"] for e in tail), 2),
          "drafted/step", round(statistics.mean(e["drafted"] for e in tail), 2),
          "step_ms", round(statistics.median(e["step_ms"] for e in tail), 1),
          "waited_ms", round(statistics.median(e["waited_ms"] for e in tail), 2),
          "steps with no draft", sum(e["drafted"] == 0 for e in tail))
