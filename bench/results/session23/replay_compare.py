"""Geometric policy replayed before and after, per profile and rollout: speedup (tail speedup),
worst of the 5 seeds, and the clairvoyant ceiling where the before side has it.
    python bench/results/session23/replay_compare.py bench/results/session23/replay_before bench/results/session23/replay_final"""
import glob
import json
import os
import sys

rows: dict[tuple[str, str], dict] = {}
for side, folder in (("before", sys.argv[1]), ("after", sys.argv[2])):
    for path in sorted(glob.glob(f"{folder}/*.json")):
        profile = os.path.basename(path)[:-5].replace("smollm2-135m-float32-cpu-t2-1a83fe2c4f72fbe9", "this-cpu")
        for rollout, value in json.load(open(path))["rollouts"].items():
            name = os.path.basename(rollout).replace(".jsonl", "").replace("rollout_", "")
            rows.setdefault((profile, name.replace("_torch_autoregressive_after_fix", "")), {})[side] = value["runs"]
print(f"{'profile':28s} {'rollout':12s} {'before (tail)':>18s} {'after (tail)':>18s} worst seed b/a  clairvoyant")
for (profile, rollout), sides in rows.items():
    if len(sides) < 2:
        continue
    before, after = sides["before"]["geometric"], sides["after"]["geometric"]
    plain = sides["before"]["plain"]["makespan_s"]
    ceiling = sides["before"].get("clairvoyant", {}).get("speedup")
    print(f"{profile:28s} {rollout:12s} {before['speedup']:.3f}x ({before['phase2_speedup']:.2f}) "
          f"{after['speedup']:.3f}x ({after['phase2_speedup']:.2f}) "
          f"{plain / max(before['makespans_s']):.2f}/{plain / max(after['makespans_s']):.2f}"
          + (f"  {ceiling:.2f}x" if ceiling else ""))
