"""How long the Fastest-of-N policy takes to plan a batch, against the step it plans for.

    python bench/policy_plan_time.py [--batches 32,64,128,256] [--profiles packaged,PATH.json,...]

The policy actor plans every few verify steps (``plan_every``, 4) in the same process and event
loop as the cheap drafters, so a plan that outlasts those steps leaves the drafters and the
verifier's next assignments waiting. A plan's cost grows with the batch: every request's window
is searched against the whole batch's step. This times ``FastestOfN.plan`` on synthetic
observations (per request an acceptance drawn for the temperature's regime: T=1 0.1-0.5, T=0
0.5-0.95, drafts of 1-8 tokens on a third of the steps) as the product plans (the first phase of
the window search vectorised, :mod:`specactor.policy.window_sweep`, and the step's drafting time
kept by :class:`~specactor.policy.drafting_tally.DraftingTally`) and as it planned before
(one allocation at a time, the drafting time recomputed from every row:
:class:`~specactor.policy.drafting_tally.FromScratchTally`), in one process, plans alternating. Both policies see the same observations and seeds, so
they must make the same plans (checked). Beside each: the profile's plain decode step at that
batch (extrapolated past the profile's largest batch) and the share of one core the policy needs
at one plan every 4 steps. Prints a table; writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from datetime import date
from pathlib import Path

from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.drafting_tally import DraftingTally, FromScratchTally

METHODS = ["ngram", "suffix"]
REGIMES = {"T=1": (0.1, 0.5), "T=0": (0.5, 0.95)}
PLAN_EVERY = 4


def _observe(policies: list[FastestOfN], n: int, acceptance: list[float], rng: random.Random) -> None:
    """One verify step's verdicts, the same for every policy."""
    for i in range(n):
        rid = f"r{i}"
        for method in METHODS:
            if rng.random() < 1 / 3:
                drafted = rng.randint(1, 8)
                accepted = sum(1 for _ in range(drafted) if rng.random() < acceptance[i])
                for policy in policies:
                    policy.observe(rid, method, drafted, accepted)
                    policy.observe_offer(rid, method, True)
        for policy in policies:
            policy.observe_commit(rid, 2)


def time_plans(profile: str | None, batch: int, regime: str, plans: int, window: int, seed: int) -> dict:
    """Median and max plan time with the tally and from scratch, and whether the plans agree."""
    policies = []
    for tally, vectorized in ((DraftingTally, True), (FromScratchTally, False)):
        policy = FastestOfN(METHODS, CostModel.from_profile(profile), max_window=window, seed=seed)
        policy.tally_class, policy.vectorized_sweep = tally, vectorized
        for i in range(batch):
            policy.add_request(f"r{i}")
        policies.append(policy)
    rng = random.Random(seed)
    low, high = REGIMES[regime]
    acceptance = [rng.uniform(low, high) for _ in range(batch)]
    seconds: list[list[float]] = [[], []]
    same, drafting = True, 0
    for step in range(plans):
        _observe(policies, batch, acceptance, rng)
        made = []
        for k in ((0, 1) if step % 2 else (1, 0)):  # alternate which goes first
            t = time.perf_counter()
            made.append((k, policies[k].plan(batch, step * PLAN_EVERY)))
            seconds[k].append(time.perf_counter() - t)
        by = dict(made)
        same &= all(by[0][r].methods == by[1][r].methods and by[0][r].window == by[1][r].window for r in by[0])
        drafting = sum(1 for c in by[0].values() if c.window)
    decode_s = policies[0].cost.at_batch(batch).decode
    now_s, before_s = (statistics.median(s) for s in seconds)
    return {"profile": profile or "packaged", "batch": batch, "regime": regime, "plans": plans,
            "now_ms": 1e3 * now_s, "now_max_ms": 1e3 * max(seconds[0]),
            "before_ms": 1e3 * before_s, "before_max_ms": 1e3 * max(seconds[1]),
            "speedup": before_s / now_s, "decode_step_ms": 1e3 * decode_s,
            "core_share_now": now_s / (PLAN_EVERY * decode_s),
            "core_share_before": before_s / (PLAN_EVERY * decode_s),
            "rows_drafting_last_plan": drafting, "same_plans": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="32,64,128,256", help="comma-separated batch sizes")
    ap.add_argument("--profiles", default="packaged",
                    help="comma-separated cost profiles: 'packaged' or a profile JSON path")
    ap.add_argument("--regimes", default="T=1,T=0", help=f"acceptance regimes: {', '.join(REGIMES)}")
    ap.add_argument("--plans", type=int, default=30, help="plans timed per case (default 30)")
    ap.add_argument("--window", type=int, default=16, help="the policy's largest window (default 16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/policy_plan_time.json")
    args = ap.parse_args()
    regimes = args.regimes.split(",")
    if unknown := [r for r in regimes if r not in REGIMES]:
        ap.error(f"unknown regime {unknown[0]!r}; choose from {', '.join(REGIMES)}")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    rows = []
    print("| profile | regime | batch | plan, now | plan, before | speedup | decode step | "
          "policy core share at 1 plan / 4 steps | rows drafting | same plans |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for profile in args.profiles.split(","):
        path = None if profile == "packaged" else profile
        if path is not None and not Path(path).is_file():
            ap.error(f"no cost profile at {path!r}")
        for regime in regimes:
            for batch in batches:
                r = time_plans(path, batch, regime, args.plans, args.window, args.seed)
                rows.append(r)
                print(f"| {Path(r['profile']).stem} | {regime} | {batch} | {r['now_ms']:.1f} ms | "
                      f"{r['before_ms']:.1f} ms | {r['speedup']:.1f}x | {r['decode_step_ms']:.1f} ms | "
                      f"{100 * r['core_share_now']:.0f}% (was {100 * r['core_share_before']:.0f}%) | "
                      f"{r['rows_drafting_last_plan']} | {r['same_plans']} |", flush=True)
    out = {"date": date.today().isoformat(), "machine": platform.processor() or platform.machine(),
           "python": platform.python_version(), "command": "python bench/policy_plan_time.py " +
           " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
