"""What a drafter would have to accept, and at what cost, for a speedup target: the bench's
oracle ceiling for a hypothetical drafter, on a real run's sample lengths and the policy's
cost profile.

    python bench/required_acceptance.py [--suite bench/results/cpu_speed/long_tail/suite.json]
        [--temperature 1] [--epoch 0] [--costs 0,0.0625,0.125,0.25] [--max-window 16] [--profile P]
        [--out bench/results/required_acceptance.json]

Every sample gets the same per-token acceptance p, drafting on every step (rate 1); the
oracle picks, per sample and batch size, the window (0 = none) that is fastest on the cost
model, exactly as the bench's ceilings do (``specactor.bench.ceilings.uniform_drafter``). A drafted
token costs ``c`` target decode steps at batch 1, added to the verify step (on 2 shared cores a
drafter's compute is not hidden behind the verifier's; c = 0 is the zero-cost bound), in two
shapes: *per row* (c for every row it drafts for: a drafter that does not batch, like a suffix
matcher) and *batched* (c for all rows together: a small model whose batch costs what one row does,
the most a model drafter can hope for on a CPU). The answer to "why is T=1 >= 1.5x missed" is then a number: the p at which each cost
reaches the target, beside the p the drafters that exist show on the same workload.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

from specactor.bench.ceilings import uniform_drafter
from specactor.bench.suite import profile_label
from specactor.policy.cost_model import CostModel, DraftCost
from specactor.engine.profiling import profiles_dir


def _lengths(suite: dict, temperature: float, epoch: int) -> list[int]:
    for run in suite["runs"]:
        if run["mode"] == "autoregressive" and run["temperature"] == temperature and run["epoch"] == epoch:
            return [int(s["tokens"]) for s in run["per_sample"].values()]
    raise SystemExit(f"no autoregressive run at temperature {temperature}, epoch {epoch} in the suite file")


def _profile(suite: dict, given: str | None) -> CostModel:
    """The profile named (a path, or "packaged"), else the one the suite's ceilings used."""
    if given is not None:
        return CostModel.from_profile(given)
    name = suite.get("ceilings_profile") or "packaged"
    if name == "packaged":
        return CostModel.from_profile(None)
    path = profiles_dir() / name
    if not path.exists():
        raise SystemExit(f"the suite's cost profile {name} is not cached on this machine ({path}): pass "
                         "--profile PATH (or --profile packaged), or a suite file measured here")
    return CostModel.from_profile(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="bench/results/cpu_speed/long_tail/suite.json",
                        help="a `specactor bench` suite.json: sample lengths and the cost profile it used")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--epoch", type=int, default=0, help="0-based, as in suite.json")
    parser.add_argument("--costs", default="0,0.0625,0.125,0.25",
                        help="drafting cost per token and row, in target decode steps at batch 1")
    parser.add_argument("--profile", default=None,
                        help="cost profile to price steps on (default: the one the suite's ceilings used)")
    parser.add_argument("--max-window", type=int, default=16)
    parser.add_argument("--targets", default="1.5,2.0", help="makespan and tail speedups to solve p for")
    parser.add_argument("--out", default="bench/results/required_acceptance.json")
    args = parser.parse_args()
    suite = json.loads(Path(args.suite).read_text())
    lengths = _lengths(suite, args.temperature, args.epoch)
    base = _profile(suite, args.profile)
    decode_1 = base.at_batch(1).decode
    grid = [round(0.05 * i, 2) for i in range(1, 20)] + [0.97, 0.99, 1.0]
    makespan_target, tail_target = (float(x) for x in args.targets.split(","))
    rows = []
    for shape in ("per_row", "batched"):
        for c in (float(x) for x in args.costs.split(",")):
            seconds = c * decode_1
            draft = DraftCost(per_row_s=seconds) if shape == "per_row" else DraftCost(fixed_s=seconds)
            curve = [(p, *uniform_drafter(lengths, base, p, draft, args.max_window)) for p in grid]
            need = {name: next((p for p, *s in curve if s[i] >= target), None)
                    for i, (name, target) in enumerate((("makespan", makespan_target), ("tail", tail_target)))}
            rows.append({"shape": shape, "cost_in_decode_steps": c, "cost_ms_per_token": round(seconds * 1000, 2),
                         "curve": [{"p": p, "speedup": round(s, 3), "tail_speedup": round(t, 3)} for p, s, t in curve],
                         "p_needed": need})
            print(f"{shape:8s} c={c:<6g} ({seconds * 1000:4.1f} ms a token): p for {makespan_target:g}x makespan "
                  f"{need['makespan']}, for {tail_target:g}x tail {need['tail']}; "
                  + ", ".join(f"p={p:g}: {s:.2f}x/{t:.2f}x" for p, s, t in curve if p in (0.3, 0.5, 0.7, 0.9, 1.0)),
                  flush=True)
    report = {"date": date.today().isoformat(), "suite": args.suite, "temperature": args.temperature,
              "epoch": args.epoch, "samples": len(lengths), "max_window": args.max_window,
              "profile": profile_label(base.source), "decode_ms_batch_1": round(decode_1 * 1000, 2),
              "targets": {"makespan": makespan_target, "tail": tail_target}, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
