"""The policy's window search keeps a step's drafting time as rows move
(:class:`specactor.policy.drafting_tally.DraftingTally`): it must say what the from-scratch
formula (:func:`~specactor.policy.drafting_tally.drafting_seconds`) says for every set of rows,
or the search would pick other windows."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings, strategies as st

from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.drafting_tally import DraftingTally, FromScratchTally, drafting_seconds

METHODS = ["ngram", "suffix", "model"]


def _cost(shared: set[str]) -> CostModel:
    cost = CostModel.from_profile()
    for k, method in enumerate(METHODS):  # drafting that costs a share of a step, and more per row
        cost.observe_draft(method, 1, 1.0, 0.002 * (k + 1))
        cost.observe_draft(method, 16, 1.0, 0.01 * (k + 1))
    cost.shared_methods = shared
    return cost


def _assert_close(got: tuple[float, float, float], want: tuple[float, float, float]) -> None:
    for g, w in zip(got, want):
        assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-15), (got, want)


row = st.tuples(st.sampled_from(METHODS), st.sampled_from([0.0, 0.3, 1.0]) | st.floats(0, 1),
                st.sampled_from([1.0, 0.05]) | st.floats(0.01, 1))


@settings(deadline=None, max_examples=150)
@given(st.lists(row, min_size=1, max_size=24), st.sets(st.sampled_from(METHODS)), st.sets(st.sampled_from(METHODS)),
       st.lists(st.tuples(st.integers(0, 23), st.integers(0, 8)), max_size=80))
def test_the_tally_gives_the_drafting_time_of_the_rows_drafting_after_any_moves(
        entries: list[tuple[str, float, float]], counted: set[str], shared: set[str],
        moves: list[tuple[int, int]]) -> None:
    """Rows move between windows in any order, back to 0 and again, with acceptance 0 or 1 (a
    row certain to be cut, whose keep-chance of 0 cannot be divided out) and draft rates below 1."""
    cost = _cost(shared)
    tally = DraftingTally(cost, entries, counted, 8)
    windows = [0] * len(entries)
    for i, w in moves:
        i %= len(entries)
        tally.move(i, windows[i], w)
        windows[i] = w
        rows = [(m, p, windows[j], q) for j, (m, p, q) in enumerate(entries) if windows[j] and m in counted]
        _assert_close(tally.seconds(), drafting_seconds(cost, rows))


def test_keep_chances_too_small_for_a_float_product_are_divided_out_again() -> None:
    """40 rows whose drafts are kept with a chance of 1e-10 each: their product underflows to 0,
    from which no division recovers the one row left; the tally keeps logs, so removing them
    restores it."""
    cost = _cost(set())
    entries = [("ngram", 0.5 ** 0.125, 1.0)] + [("ngram", 0.0, 1 - 1e-10)] * 40  # keep-chances 0.5 and 1e-10
    tally = DraftingTally(cost, entries, {"ngram"}, 8)
    for i in range(len(entries)):
        tally.move(i, 0, 8)
    for i in range(1, len(entries)):
        tally.move(i, 8, 0)
    _assert_close(tally.seconds(), drafting_seconds(cost, [("ngram", 0.5 ** 0.125, 8, 1.0)]))


def test_plans_at_large_batch_choose_the_windows_the_from_scratch_search_chooses() -> None:
    """On a GPU-like cost shape where the cheap drafters' time matters (the tally is in use), 60
    random batches of 8-96 requests get the same windows and speeds either way."""
    rng = random.Random(3)
    for trial in range(60):
        cost = _cost({"model"} if trial % 2 else set())
        cost.observe_draft("ngram", 64, 1.0, 0.05)  # slow enough to be costly at every batch here
        fon = FastestOfN(METHODS, cost, max_window=rng.choice([8, 16]))
        n = rng.choice([8, 32, 96])
        entries = [(rng.choice(METHODS), rng.random(), rng.choice([1.0, 0.5, 0.1])) for _ in range(n)]
        steps = cost.at_batch(n)
        fast = fon._allocate(steps, entries)
        fon.tally_class = FromScratchTally
        slow = fon._allocate(steps, entries)
        assert fast[0] == slow[0]
        assert math.isclose(fast[1], slow[1], rel_tol=1e-9) and fast[2] == slow[2]
