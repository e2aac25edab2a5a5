"""The window search's first phase scores every batch prefix of a window at once
(:mod:`specactor.policy.window_sweep`): its speeds must be the one-at-a-time search's, or plans
would change."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.drafting_tally import FromScratchTally
from specactor.policy.window_sweep import verify_many

DATA = Path(__file__).parent / "data"
#: the packaged profile (uniform rows only), one with a one-row column (AVX2), a flat one, one with
#: one-row and half-rows columns (the default model on a 2-core EPYC)
PROFILES = [None, DATA / "avx2_profile.json", DATA / "flat_profile.json", DATA / "half_rows_profile.json"]
METHODS = ["ngram", "suffix", "model"]


@settings(deadline=None, max_examples=200)
@given(st.sampled_from(PROFILES), st.integers(1, 96), st.floats(0, 400), st.floats(0, 96),
       st.floats(0, 3), st.floats(0, 0.05))
def test_the_array_step_cost_is_the_scalar_one(profile, batch: int, extra: float, rows: float,
                                               scale: float, fixed: float) -> None:
    """Every branch of StepCosts.verify: plain steps, drafts on a share of a step (rows < 1),
    one row, every row, beyond the profile's ends, with learnt overheads."""
    steps = CostModel.from_profile(profile).at_batch(batch)
    steps.extra_scale, steps.draft_fixed = scale, fixed
    fed = batch + extra
    want = steps.verify(fed, rows)
    got = verify_many(steps, np.array([fed]), np.array([rows]))[0]
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15), (got, want)


def _policy(profile, rng: random.Random, shared: set[str], decoupled: bool, top: int) -> FastestOfN:
    cost = CostModel.from_profile(profile)
    for k, method in enumerate(METHODS):  # drafting that counts against the step, so the tally is in use
        cost.observe_draft(method, 1, 1.0, rng.choice([0.0005, 0.005, 0.05]) * (k + 1))
        cost.observe_draft(method, 32, 1.0, rng.choice([0.001, 0.02]) * (k + 1))
    cost.shared_methods = shared
    return FastestOfN(METHODS, cost, max_window=top, decoupled=decoupled)


def test_plans_choose_the_windows_the_one_at_a_time_search_chooses() -> None:
    """200 random batches of 1-128 requests on four profiles, drafting decoupled and coupled,
    with and without a method on the verifier's hardware: the same windows and speeds as the
    search before the sweep and the tally (one allocation at a time, drafting from every row)."""
    rng = random.Random(11)
    for trial in range(200):
        profile = PROFILES[trial % len(PROFILES)]
        shared = {"model"} if trial % 4 == 1 else set()
        decoupled = trial % 5 != 2
        top = rng.choice([4, 8, 16])
        n = rng.choice([1, 2, 7, 32, 128])
        entries = [(rng.choice(METHODS), rng.choice([0.0, 1.0, rng.random()]), rng.choice([1.0, 0.5, 0.05]))
                   for _ in range(n)]
        fast = _policy(profile, random.Random(trial), shared, decoupled, top)
        slow = _policy(profile, random.Random(trial), shared, decoupled, top)
        slow.vectorized_sweep, slow.tally_class = False, FromScratchTally
        steps = fast.cost.at_batch(n)
        got, want = fast._allocate(steps, entries), slow._allocate(slow.cost.at_batch(n), entries)
        assert got[0] == want[0], (trial, got, want)
        assert math.isclose(got[1], want[1], rel_tol=1e-9) and math.isclose(got[2], want[2], rel_tol=1e-12)
