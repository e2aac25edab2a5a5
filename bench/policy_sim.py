"""The Fastest-of-N policy against fixed and random assignment, in simulation.

    python bench/policy_sim.py [--seeds 7] [--requests 32]

Costs come from the packaged cost profile (2-core CPU, smollm2-135m) and the
default drafting costs; acceptance is synthetic, so the figures say how the
policy decides, not how fast the real engine is (bench/speculation.py does).
Workloads (long-tailed lengths, Pareto(1.2) x 40 tokens, capped at 400):
  mixed:     half the requests suit ngram (0.85), half the model drafter (0.9)
  switching: like mixed, but every request's best method swaps half-way
  similar:   two cheap methods with moderate, request-dependent acceptance
Reports the median makespan over seeds per policy; writes
bench/results/policy_sim.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from datetime import date
from pathlib import Path

from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.simulation import FixedPolicy, RandomPolicy, SimRequest, Simulator

METHODS = ["ngram", "suffix", "model"]


def _length(rng: random.Random) -> int:
    return max(8, min(int(rng.paretovariate(1.2) * 40), 400))


def workload(kind: str, n: int, seed: int) -> list[SimRequest]:
    rng = random.Random(seed)
    good_ngram = {"ngram": 0.85, "suffix": 0.6, "model": 0.5}
    good_model = {"ngram": 0.1, "suffix": 0.3, "model": 0.9}
    out = []
    for i in range(n):
        length = _length(rng)
        if kind == "mixed":
            out.append(SimRequest(f"r{i}", length, good_ngram if i % 2 else good_model))
        elif kind == "switching":
            a, b = (good_ngram, good_model) if i % 2 else (good_model, good_ngram)
            out.append(SimRequest(f"r{i}", length, a, switch_at=length // 2, acceptance_after=b))
        elif kind == "similar":
            x = rng.uniform(0.45, 0.75)
            out.append(SimRequest(f"r{i}", length, {"ngram": x, "suffix": 1.2 - x, "model": 0.0}))
        else:
            raise ValueError(kind)
    return out


def policies(methods: list[str], seed: int):
    yield from ((f"fixed {m}", FixedPolicy(m)) for m in methods)
    yield "random", RandomPolicy(methods, seed=seed)
    for scheme in ("thompson", "ucb", "greedy"):
        yield f"fon {scheme}", FastestOfN(methods, CostModel.from_profile(), scheme=scheme, seed=seed)
    yield "fon thompson, no racing", FastestOfN(methods, CostModel.from_profile(), racing=False, seed=seed)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--out", default="bench/results/policy_sim.json")
    args = parser.parse_args()
    cost = CostModel.from_profile()
    results: dict[str, dict[str, float]] = {}
    for kind in ("mixed", "switching", "similar"):
        methods = ["ngram", "suffix"] if kind == "similar" else METHODS
        spans: dict[str, list[float]] = {}
        for seed in range(args.seeds):
            for name, policy in policies(methods, seed):
                run = Simulator(cost, seed=seed).run(workload(kind, args.requests, seed), policy)
                spans.setdefault(name, []).append(run.makespan_s)
        results[kind] = {name: statistics.median(v) for name, v in spans.items()}
    print("| policy | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    names = list(results["mixed"])
    for name in names:
        print(f"| {name} | " + " | ".join(f"{results[k][name]:.2f} s" if name in results[k] else "-"
                                          for k in results) + " |")
    out = {"date": date.today().isoformat(), "seeds": args.seeds, "requests": args.requests,
           "median_makespan_s": results}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
