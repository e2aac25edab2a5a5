"""The cost model: progress law, interpolation of the profile, online correction."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from specactor.policy.cost_model import (NEGLIGIBLE, CostModel, DraftCost, expected_progress, progress_by_window,
                                         race_progress, useful_window)


@given(st.floats(0, 1), st.integers(0, 16))
def test_expected_progress_matches_the_truncated_geometric_law(p: float, w: int) -> None:
    direct = 1 + sum(p ** a * (1 - p) * a for a in range(w)) + p ** w * w
    assert expected_progress(p, w) == pytest.approx(direct, rel=1e-9, abs=1e-9)
    assert 1.0 <= expected_progress(p, w) <= w + 1


@given(st.floats(0, 1), st.integers(0, 32))
def test_progress_by_window_is_expected_progress_for_every_window(p: float, top: int) -> None:
    assert progress_by_window(p, top) == pytest.approx([expected_progress(p, w) for w in range(top + 1)], rel=1e-9)


@given(st.floats(0, 1), st.sampled_from([1, 2, 4, 8, 16, 32]), st.sampled_from([1, 3, 9, 17, 32]),
       st.floats(0, 5e-3), st.floats(0.05, 1), st.booleans())
def test_the_window_search_stops_where_tokens_buy_nothing_and_loses_nothing_by_it(
        p: float, batch: int, top: int, draft_s: float, rate: float, decoupled: bool) -> None:
    """best_window tries windows up to useful_window(p) only (the plan's cost at window 16 and
    T=1 acceptance): the speed it finds is within 1% of trying every window."""
    useful = useful_window(p, top)
    assert 0 <= useful <= top
    assert useful == top or p ** (useful + 1) < NEGLIGIBLE
    assert useful == 0 or p ** useful >= NEGLIGIBLE
    steps = CostModel.from_profile().at_batch(batch)
    _, found = steps.best_window(p, draft_s, rate, top, decoupled)
    exhaustive = max(steps.tokens_per_s(p, w, draft_s, rate, decoupled) for w in range(top + 1))
    assert found >= 0.99 * exhaustive


@given(st.lists(st.floats(0, 1), min_size=1, max_size=4), st.integers(1, 8))
def test_racing_never_loses_progress_and_one_racer_is_plain(ps: list[float], w: int) -> None:
    assert race_progress(ps[:1], w) == pytest.approx(expected_progress(ps[0], w))
    assert race_progress(ps, w) >= max(expected_progress(p, w) for p in ps) - 1e-9


def test_packaged_profile_is_interpolated_exactly_on_the_grid() -> None:
    cost = CostModel.from_profile()
    for bi, b in enumerate(cost.batch_sizes):
        for ci, c in enumerate(cost.chunk_lens):
            assert cost.verify_s(b, c) == pytest.approx(cost.forward_s[bi][ci])
    # between grid points it lies between the neighbours
    assert cost.verify_s(8, 1) < cost.verify_s(12, 1) < cost.verify_s(16, 1)


def test_online_correction_converges_to_a_slower_machine() -> None:
    cost = CostModel.from_profile()
    truth = 2.5 * cost.verify_s(8, 5)
    for _ in range(100):
        cost.observe_step(8, 40, truth)
    assert cost.verify_s(8, 5) == pytest.approx(truth, rel=0.02)


def _drafting_step(cost: CostModel, truth: CostModel, batch: int, window: int, rows: int, fixed_s: float,
                   noise: float, rng) -> None:
    """One measured step of ``rows`` rows drafting ``window`` tokens: the true profile plus a fixed cost."""
    fed = batch + rows * window
    seconds = truth.verify_rows_s(batch, fed, rows) + fixed_s + rng.gauss(0.0, noise)
    cost.observe_step(batch, fed, seconds, rows=rows)


def test_a_fixed_cost_of_drafting_is_learnt_with_the_scale() -> None:
    """Drafting rows have an attention part of their own whose fixed cost the profile can miss:
    learnt from noisy steps of mixed windows, both a 1-token and an 8-token draft are then
    predicted within 15% of what drafts really add."""
    import random

    rng = random.Random(3)
    truth, cost = CostModel.from_profile(), CostModel.from_profile()
    fixed = 0.3 * truth.verify_s(8, 1)
    for _ in range(150):
        _drafting_step(cost, truth, 8, rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4]), fixed, 0.005, rng)
    decode = truth.verify_s(8, 1)
    for window, rows in ((1, 1), (8, 4)):
        real = truth.verify_rows_s(8, 8 + rows * window, rows) + fixed - decode
        assert cost.verify_rows_s(8, 8 + rows * window, rows) - decode == pytest.approx(real, rel=0.15)


def test_what_drafts_cost_at_large_batch_does_not_leak_into_the_tail() -> None:
    """Live at f8697d5+: one scalar correction learnt from 1-3-token drafts at batch 32 (which
    cost 15-90 ms where the profile said 0-4) made the tail draft 1-token windows at 100%
    acceptance. Drafting cost learnt at batch 32 must leave batch 1-4 as the profile has it."""
    import random

    rng = random.Random(0)
    truth, cost = CostModel.from_profile(), CostModel.from_profile()
    for _ in range(60):
        _drafting_step(cost, truth, 32, rng.choice([1, 2, 3]), 1, 0.05, 0.02, rng)
    assert cost.verify_rows_s(32, 34, 1) - cost.verify_s(32, 1) > 0.03  # learnt where it was seen
    for batch in (1, 2, 4):
        assert cost.verify_rows_s(batch, 5 * batch, batch) == pytest.approx(truth.verify_rows_s(batch, 5 * batch, batch))
        assert cost.best_window(0.95, "ngram", batch, True)[0] >= 4


def test_speculation_is_switched_off_where_it_cannot_pay() -> None:
    cost = CostModel.from_profile()
    # a weak drafter pays at batch 1 (verification nearly free) but not at batch 64
    assert cost.best_window(0.5, "ngram", 1, True)[0] >= 1
    assert cost.best_window(0.3, "ngram", 64, True)[0] == 0
    # a good drafter still pays at large batch, with a window
    assert cost.best_window(0.95, "ngram", 64, True)[0] >= 2


def test_drafting_cost_is_learnt_from_timings() -> None:
    cost = CostModel.from_profile()
    for _ in range(50):
        cost.observe_draft("model", 8, 4, 4 * 0.040)  # 40 ms a token at batch 8
    assert cost.draft_s("model", 8) == pytest.approx(0.040, rel=0.05)
    # a slow drafter makes coupled mode slower than decoupled at the same window
    assert cost.tokens_per_s(0.9, 4, "model", 8, False) < cost.tokens_per_s(0.9, 4, "model", 8, True)


def test_bad_profile_is_refused_naming_the_problem(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"batch_sizes": [1, 2], "chunk_lens": [1], "forward_s": [[0.1]]}))
    with pytest.raises(ValueError, match="batch_sizes x chunk_lens"):
        CostModel.from_profile(path)
    path.write_text(json.dumps({"batch_sizes": [1]}))
    with pytest.raises(ValueError, match="chunk_lens"):
        CostModel.from_profile(path)


def test_a_drafter_that_rarely_has_a_draft_costs_and_gains_little() -> None:
    cost = CostModel.from_profile()
    # q = 0: exactly plain decoding, whatever the window
    assert cost.tokens_per_s(0.9, 6, "ngram", 8, True, draft_rate=0.0) == pytest.approx(
        cost.tokens_per_s(0.0, 0, "ngram", 8, True))
    # in between: half the gain of always drafting, for less than its verify work
    always = cost.tokens_per_s(0.6, 4, "ngram", 8, True, draft_rate=1.0)
    half = cost.tokens_per_s(0.6, 4, "ngram", 8, True, draft_rate=0.5)
    plain = cost.tokens_per_s(0.0, 0, "ngram", 8, True)
    assert min(always, plain) < half < max(always, plain)


def test_large_batch_with_a_weak_matcher_turns_speculation_off() -> None:
    from specactor.policy.bandit import FastestOfN

    policy = FastestOfN(["ngram", "suffix"], CostModel.from_profile(), seed=0)
    for i in range(48):
        policy.add_request(f"r{i}")
        for _ in range(20):  # one draft token in five right, drafts on half of the steps
            policy.observe(f"r{i}", "ngram", 4, 1 if _ % 4 == 0 else 0)
            policy.observe(f"r{i}", "suffix", 4, 1 if _ % 4 == 0 else 0)
            policy.observe_offer(f"r{i}", "ngram", _ % 2 == 0)
            policy.observe_offer(f"r{i}", "suffix", _ % 2 == 0)
    offs = [sum(not c.methods for c in policy.plan(48).values()) for _ in range(12)]
    assert min(offs[8:]) >= 40, f"requests off, plan after plan: {offs}"  # exploration is held, not constant
    small = FastestOfN(["ngram"], CostModel.from_profile(), seed=0)
    small.add_request("r")
    for _ in range(20):
        small.observe("r", "ngram", 4, 3)
    assert small.plan(1)["r"].methods == ["ngram"]


def test_a_noisy_profile_is_made_non_decreasing_before_use(tmp_path) -> None:
    """Measured on a noisy 2-core machine: batch 8 decoding slower than batch 16, and 2 tokens a
    row cheaper than 1. Left as is, the policy would verify drafts for less than a decode step."""
    import json

    from specactor.policy.cost_model import CostModel, monotone

    noisy = [[0.083, 0.086, 0.090], [0.180, 0.165, 0.222], [0.153, 0.249, 0.389], [0.259, 0.384, 0.569]]
    fitted = monotone(noisy)
    for row in fitted:
        assert row == sorted(row)
    for c in range(3):
        column = [row[c] for row in fitted]
        assert column == sorted(column)
    assert fitted[1][0] == fitted[2][0] == pytest.approx((0.180 + 0.153) / 2)  # pooled, not max'ed
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"batch_sizes": [1, 8, 16, 32], "chunk_lens": [1, 2, 4], "forward_s": noisy}))
    model = CostModel.from_profile(path)
    assert model.verify_s(8, 2) >= model.verify_s(8, 1)
    assert model.verify_s(16, 1) >= model.verify_s(8, 1)


def test_one_slow_plain_step_does_not_make_drafting_look_free() -> None:
    """T=0 bench, 2026-11-24: the first decode step after prefilling 32 prompts took 522 ms (the
    next plain ones 235-289), and the batch then drafted on nearly every step, so that slow step
    stood for the plain step; against it, drafting steps 80-160 ms dearer than plain decoding
    looked free and the policy drafted through the large-batch phase at 0.83x. The plain step is
    a median with the profile as prior, so one outlier moves nothing, and what drafting adds is
    then learnt."""
    import random

    rng = random.Random(1)
    truth, cost = CostModel.from_profile(), CostModel.from_profile()
    decode = truth.verify_s(32, 1)
    cost.observe_step(32, 32, 2.0 * decode)  # the outlier
    assert cost.verify_s(32, 1) == pytest.approx(decode, rel=0.01)
    for _ in range(40):  # then only drafting steps: 1.1x the profile, plus a fixed 80 ms
        window, rows = rng.choice([1, 2, 3]), rng.choice([2, 5, 10])
        fed = 32 + window * rows
        seconds = 1.1 * truth.verify_rows_s(32, fed, rows) + 0.08 + rng.gauss(0.0, 0.02)
        cost.observe_step(32, fed, seconds, rows=rows)
    assert cost.verify_rows_s(32, 32 + 2 * 5, 5) - cost.verify_s(32, 1) >= 0.07
    assert cost.best_window(0.5, "ngram", 32, True)[0] == 0


def test_only_a_drafter_on_the_verifier_s_hardware_adds_its_time_to_a_decoupled_step() -> None:
    cost = CostModel.from_profile()
    cost.draft = {"ngram": DraftCost(fixed_s=0.001), "learned": DraftCost(fixed_s=0.004)}
    verify = cost.verify_rows_s(4, 4 + 8, 4)
    both = {"ngram": (4, 2), "learned": (4, 2)}
    assert cost.step_s(4, 12, both, True, 4) == pytest.approx(verify)  # both hide beside the step
    cost.shared_methods = {"learned"}
    assert cost.step_s(4, 12, both, True, 4) == pytest.approx(verify + 0.008)
    assert cost.step_s(4, 12, {"ngram": (4, 2)}, True, 4) == pytest.approx(verify)
    assert cost.step_s(4, 12, both, False, 4) == pytest.approx(verify + 0.008)  # coupled: as before
    slow_ngram = {"ngram": (4, 1000), "learned": (4, 2)}  # a cheap drafter that cannot keep up bounds the step
    assert cost.step_s(4, 12, slow_ngram, True, 4) == pytest.approx(1.0)


def _rows_profile(tmp_path, half: bool) -> CostModel:
    """Batch 32 only: a decode step 64 ms; every row verifying one draft token 89 ms, one row 66,
    half the rows (on this CPU, padded to the longest chunk) 88."""
    profile = {"batch_sizes": [32], "chunk_lens": [1, 2], "forward_s": [[0.064, 0.089]],
               "one_row_s": [[0.064, 0.066]]}
    if half:
        profile["half_rows_s"] = [[0.064, 0.088]]
    path = tmp_path / f"rows_{half}.json"
    path.write_text(json.dumps(profile))
    return CostModel.from_profile(path)


@given(st.integers(1, 32))
def test_a_step_s_cost_by_drafting_rows_runs_through_one_half_and_every_row(rows: int) -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        measured, straight = _rows_profile(Path(folder), True), _rows_profile(Path(folder), False)
    fed = 32 + rows  # one draft token a drafting row
    knots = {1: 0.066, 16: 0.088, 32: 0.089}
    if rows in knots:
        assert measured.verify_rows_s(32, fed, rows) == pytest.approx(knots[rows])
    low, high = (1, 16) if rows <= 16 else (16, 32)
    line = knots[low] + (rows - low) / (high - low) * (knots[high] - knots[low])
    assert measured.verify_rows_s(32, fed, rows) == pytest.approx(line)
    # without the half-rows figure: a straight line from one row to every row (what older profiles say)
    assert straight.verify_rows_s(32, fed, rows) == pytest.approx(0.066 + (rows - 1) / 31 * 0.023)


def test_a_half_rows_table_is_checked_like_the_others(tmp_path) -> None:
    base = {"batch_sizes": [1, 4], "chunk_lens": [1, 2], "forward_s": [[0.01, 0.02], [0.02, 0.04]]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**base, "half_rows_s": [[0.01, 0.02], [0.02, 0.03]]}))
    with pytest.raises(ValueError, match="half_rows_s needs one_row_s"):
        CostModel.from_profile(path)
    path.write_text(json.dumps({**base, "one_row_s": base["forward_s"], "half_rows_s": [[0.01, 0.02]]}))
    with pytest.raises(ValueError, match="half_rows_s is not batch_sizes x chunk_lens"):
        CostModel.from_profile(path)
    path.write_text(json.dumps({**base, "one_row_s": base["forward_s"], "half_rows_s": [[0.01, "x"], [1, 2]]}))
    with pytest.raises(ValueError, match="malformed table"):
        CostModel.from_profile(path)
    # a half-rows figure outside one row's and every row's is brought between them
    path.write_text(json.dumps({**base, "one_row_s": [[0.01, 0.02], [0.02, 0.03]],
                                "half_rows_s": [[0.01, 0.02], [0.02, 0.09]]}))
    steps = CostModel.from_profile(path).at_batch(4)
    assert steps.half_rows == pytest.approx([0.02, 0.04])


def test_a_plan_priced_through_half_the_rows_is_not_taken_where_only_the_straight_line_pays(tmp_path) -> None:
    """16 of 32 rows whose drafts are right 60% of the time. On a straight line from one row drafting
    (66 ms) to every row (89 ms), one-token drafts for all 16 cost 77 ms and buy 8% more tokens a
    second; at what half the rows drafting costs on this CPU (88 ms: every row is padded) they lose."""
    from specactor.policy.bandit import FastestOfN

    profile = {"batch_sizes": [32], "chunk_lens": [1, 2, 4], "forward_s": [[0.064, 0.089, 0.141]],
               "one_row_s": [[0.064, 0.066, 0.072]]}
    entries = [("ngram", 0.6, 1.0)] * 16 + [("ngram", 0.0, 1.0)] * 16
    chosen = {}
    for name, extra in (("straight", {}), ("half", {"half_rows_s": [[0.064, 0.088, 0.120]]})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**profile, **extra}))
        policy = FastestOfN(["ngram"], CostModel.from_profile(path), max_window=4)
        chosen[name] = policy._allocate(policy.cost.at_batch(32), entries)[0]
    assert chosen["straight"][:16] == [1] * 16
    assert not any(chosen["half"])


def test_a_measured_draft_table_prices_each_batch_size_and_learns_a_scale() -> None:
    """llama.cpp's q8_0 copy: one row 6.5 ms, two 15, eight 28: no line through them fits; the
    table is interpolated, extended past its end by its last slope, and scaled by what is seen."""
    from specactor.policy.cost_model import DraftCost

    cost = DraftCost()
    cost.adopt_table({1: 0.0065, 2: 0.015, 8: 0.028})
    assert cost.seconds(1) == pytest.approx(0.0065)
    assert cost.seconds(4) == pytest.approx(0.015 + 2 * 0.013 / 6)
    assert cost.seconds(14) == pytest.approx(0.028 + 6 * 0.013 / 6)
    for _ in range(40):
        cost.observe(2, 4.0, 4 * 0.030)  # it drafts twice as slowly as measured, here
    assert cost.seconds(2) == pytest.approx(0.030, rel=0.02)
    assert cost.seconds(8) == pytest.approx(0.056, rel=0.02)
