"""What drafts add to a step, measured against what the cost profile predicts, with and without its
half-rows figure: an engine at batch B (contexts 192-320 tokens, as the profile's 256 +-25%), r rows
drafting w tokens each, the step timed (median of 5 after a warm-up) less a plain step's.

    PYTHONPATH=TREE python bench/results/session28/rows_cost.py PROFILE.json [B ...]
"""
import statistics
import sys
import time

import torch

from specactor.models import resolve_model
from specactor.policy.cost_model import CostModel
from specactor.protocol import SamplingParams
from specactor.verifier.engine import Engine, Sequence
from specactor.verifier.weights import load_causal_lm

torch.set_num_threads(2)
profile = sys.argv[1]
batches = [int(b) for b in sys.argv[2:]] or [32, 16, 8]
with_half = CostModel.from_profile(profile)
straight = CostModel.from_profile(profile)
straight.half_rows_s = None
model = load_causal_lm(resolve_model(None))
errors = {"half": [], "straight": []}
scaled = {"half": [], "straight": []}  # the predictions scaled by the measured plain step over the profile's
# (what the policy's online correction of plain steps does)
for batch in batches:
    eng = Engine(model, max_batch=batch, max_len=1024)
    g = torch.Generator().manual_seed(0)
    for i in range(batch):
        prompt = torch.randint(0, model.cfg.vocab_size, (192 + (128 * i) // max(1, batch - 1),), generator=g).tolist()
        eng.add(Sequence(f"r{i}", prompt, SamplingParams(temperature=1.0, max_tokens=600), seed=i))
    for _ in range(3):
        eng.step()

    def timed(drafts: dict) -> float:
        times = []
        for _ in range(6):
            t = time.perf_counter()
            eng.step(drafts)
            times.append(time.perf_counter() - t)
        return statistics.median(times[1:])

    plain = timed({})
    print(f"batch {batch}: plain step {plain * 1e3:.1f} ms (profile {with_half.verify_rows_s(batch, batch, 0) * 1e3:.1f})")
    print("| rows x tokens | measured added | half-rows profile | straight line |")
    print("|---|---|---|---|")
    for w in (1, 3, 7):
        for rows in sorted({1, 2, 4, batch // 4, batch // 2, 3 * batch // 4, batch}):
            if rows < 1 or rows > batch:
                continue
            drafts = {f"r{i}": ("ngram", [5] * w) for i in range(rows)}
            added = timed(drafts) - plain
            fed = batch + rows * w
            p_half = with_half.verify_rows_s(batch, fed, rows) - with_half.verify_rows_s(batch, batch, 0)
            p_line = straight.verify_rows_s(batch, fed, rows) - straight.verify_rows_s(batch, batch, 0)
            errors["half"].append(abs(p_half - added) / plain)
            errors["straight"].append(abs(p_line - added) / plain)
            scale = plain / with_half.verify_rows_s(batch, batch, 0)
            scaled["half"].append(abs(scale * p_half - added) / plain)
            scaled["straight"].append(abs(scale * p_line - added) / plain)
            print(f"| {rows} x {w} | {added * 1e3:.1f} ms | {p_half * 1e3:.1f} ms | {p_line * 1e3:.1f} ms |", flush=True)
for label, table in (("as profiled", errors), ("scaled to the plain step", scaled)):
    for name, errs in table.items():
        print(f"{label}, {name}: mean |error| {statistics.mean(errs) * 100:.1f}% of a plain step, median "
              f"{statistics.median(errs) * 100:.1f}%, worst {max(errs) * 100:.1f}% ({len(errs)} cases)")
