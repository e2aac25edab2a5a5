"""FastestOfN.plan time with and without the closed-batch check (every request told its limit), on
synthetic observations (per request 20 four-token drafts of each method at an acceptance drawn
from 0.1-0.5 for T=1, 0.5-0.95 for T=0); median of 12 plans.
    python bench/results/session26/plan_time_closed.py PROFILE.json"""
import random, statistics, time, sys
from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
prof = sys.argv[1]
for batch in (32, 256):
    for regime, (lo, hi) in {"T=1": (0.1, 0.5), "T=0": (0.5, 0.95)}.items():
        times = {}
        for told in (False, True):
            cost = CostModel.from_profile(prof)
            fon = FastestOfN(["ngram", "suffix"], cost, max_window=16, seed=1)
            rng = random.Random(3)
            for i in range(batch):
                rid = f"r{i}"; fon.add_request(rid); fon.observe_commit(rid, 50)
                p = rng.uniform(lo, hi)
                for m in ("ngram", "suffix"):
                    for _ in range(20):
                        k = 0
                        while k < 4 and rng.random() < p: k += 1
                        fon.observe(rid, m, 4, k)
                if told: fon.observe_limit(rid, 700, False)
            ts = []
            for step in range(12):
                t = time.perf_counter(); plan = fon.plan(batch, step=step * 4); ts.append(time.perf_counter() - t)
            drafting = sum(bool(c.window) for c in plan.values())
            times[told] = (statistics.median(ts) * 1e3, drafting)
        print(f"{prof.split('/')[-1]:40s} batch {batch:3d} {regime}: plan {times[False][0]:.1f} ms ({times[False][1]} drafting) -> told limits {times[True][0]:.1f} ms ({times[True][1]} drafting)")
