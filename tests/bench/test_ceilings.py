"""The bench's ceilings on synthetic data (no model): the acceptance estimate, the
calibration, the phase split, and the order of the bounds."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specactor.bench.ceilings import (NO_DRAFT, Acceptance, Config, accepted_per_draft, acceptance_from_counts,
                                      best_config, ceilings, from_samples, pool_acceptance, simulate,
                                      uniform_drafter)
from specactor.bench.measure import RunRecord, phase_split
from specactor.policy.cost_model import CostModel, DraftCost
from specactor.policy.simulation import accepted_length

BATCHES = [1, 4, 16, 64]
CHUNKS = [1, 2, 4, 8, 16]


def roofline(batch: int, chunk: float) -> float:
    """A verify step that is memory-bound (flat) at small batch x chunk and compute-bound beyond."""
    return 0.02 + 0.0004 * batch * chunk


def cost_model(draft_scale: float = 1.0) -> CostModel:
    return CostModel(BATCHES, CHUNKS, [[roofline(b, c) for c in CHUNKS] for b in BATCHES],
                     draft={"ngram": DraftCost(2e-5 * draft_scale, 5e-4 * draft_scale),
                            "suffix": DraftCost(5e-5 * draft_scale, 1e-3 * draft_scale)})


ACCEPTANCE = st.builds(Acceptance, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
REQUESTS = st.lists(st.tuples(st.integers(1, 120), st.dictionaries(st.sampled_from(["ngram", "suffix"]), ACCEPTANCE)),
                    min_size=1, max_size=10)


# ---------------------------------------------------------------------------- acceptance


@settings(max_examples=200, deadline=None)
@given(p=st.floats(0.01, 0.99), window=st.integers(1, 8), steps=st.integers(1, 10_000))
def test_acceptance_estimate_inverts_the_truncated_geometric_mean(p: float, window: int, steps: int) -> None:
    accepted = accepted_per_draft(p, window) * steps  # the exact mean over `steps` drafts
    assert acceptance_from_counts(window * steps, accepted, steps) == pytest.approx(p, abs=1e-9)


def test_acceptance_estimate_edges() -> None:
    assert acceptance_from_counts(0, 0, 0) == 0.0  # never drafted: no evidence, no gain
    assert acceptance_from_counts(40, 0, 10) == 0.0
    assert acceptance_from_counts(40, 40, 10) == 1.0
    assert accepted_per_draft(1.0, 4) == 4.0 and accepted_per_draft(0.5, 0) == 0.0
    assert accepted_per_draft(0.5, 2) == pytest.approx(0.5 + 0.25)


def test_acceptance_estimate_recovers_p_from_sampled_drafts() -> None:
    """What the engine counts: draws of the truncated geometric law, windows of several sizes."""
    rng = random.Random(7)
    for p in (0.2, 0.6, 0.9):
        windows = [rng.choice([2, 4, 4, 8]) for _ in range(20_000)]
        accepted = sum(accepted_length(rng, p, w) for w in windows)
        # a mean window stands for mixed windows, so only roughly
        assert acceptance_from_counts(sum(windows), accepted, len(windows)) == pytest.approx(p, abs=0.03)


def test_pool_acceptance_sums_counts_over_runs_and_keeps_the_best_draft_rate() -> None:
    specactor = {"verify_steps": 100, "per_method": {"ngram": {"drafted": 40, "accepted": 10, "steps": 10},
                                                     "suffix": {"drafted": 0, "accepted": 0, "steps": 0}}}
    coupled = {"verify_steps": 50, "per_method": {"ngram": {"drafted": 160, "accepted": 40, "steps": 40}}}
    pooled = pool_acceptance([specactor, coupled, {"tokens": 5}])
    assert set(pooled) == {"ngram"}  # a method that never drafted is no evidence
    assert pooled["ngram"].p == pytest.approx(acceptance_from_counts(200, 50, 50))
    assert pooled["ngram"].rate == pytest.approx(0.8)  # 40 of coupled's 50 steps, not 10 of specactor's 100


# ---------------------------------------------------------------------------- phases and calibration


@settings(max_examples=200, deadline=None)
@given(finishes=st.lists(st.floats(0.0, 100.0), max_size=40), extra=st.floats(0.0, 10.0))
def test_phase_split_sums_to_the_makespan(finishes: list[float], extra: float) -> None:
    makespan = max(finishes, default=0.0) + extra
    phase1, phase2 = phase_split(finishes, makespan)
    assert phase1 + phase2 == pytest.approx(makespan) and phase1 >= 0 and phase2 >= 0
    if finishes:
        assert phase1 == sorted(finishes)[math.ceil(len(finishes) / 2) - 1]  # half of the samples done
    record = RunRecord("m", 1.0, 0, makespan_s=makespan, finishes=[(t, 1) for t in finishes])
    assert sum(record.phases) == pytest.approx(makespan)
    summary = record.summary()
    assert summary["phase1_s"] + summary["phase2_s"] == pytest.approx(summary["makespan_s"], abs=2e-3)


def test_phase_split_of_eight_samples_is_at_the_fourth_finish() -> None:
    assert phase_split([float(t) for t in range(8, 0, -1)], 9.0) == (4.0, 5.0)


def test_autoregressive_simulation_shrinks_the_batch_and_calibrates_to_the_measured_time() -> None:
    cost = cost_model()
    run = simulate([3, 1, 2], lambda i, b: NO_DRAFT, cost)
    expected = roofline(3, 1) + roofline(2, 1) + roofline(1, 1)
    assert run.makespan_s == pytest.approx(expected)
    assert run.finish_s == pytest.approx([expected, roofline(3, 1), roofline(3, 1) + roofline(2, 1)])
    out = ceilings([3, 1, 2], [{}] * 3, cost, measured_autoregressive_s=2 * expected)
    assert out["scale"] == pytest.approx(2.0)
    assert out["autoregressive"]["makespan_s"] == pytest.approx(2 * expected)  # the measured time
    assert out["simulated_autoregressive_s"] == pytest.approx(expected)


# ---------------------------------------------------------------------------- bounds


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=12), rate=st.floats(0.0, 1.0),
       batch=st.integers(1, 64))
def test_with_acceptance_zero_the_oracle_is_autoregressive(lengths: list[int], rate: float, batch: int) -> None:
    cost = cost_model()
    zero = {"ngram": Acceptance(0.0, rate), "suffix": Acceptance(0.0, 1.0)}
    assert best_config(zero, batch, cost) == NO_DRAFT
    out = ceilings(lengths, [zero] * len(lengths), cost, measured_autoregressive_s=10.0)
    assert out["oracle"]["speedup"] == 1.0
    assert out["oracle"]["makespan_s"] == pytest.approx(10.0)
    assert out["zero_cost"]["speedup"] == 1.0  # free drafting with nothing accepted gains nothing


@settings(max_examples=40, deadline=None)
@given(requests=REQUESTS, measured=st.floats(0.1, 1000.0), draft_scale=st.sampled_from([0.0, 1.0, 100.0]))
def test_bounds_are_ordered_perfect_zero_cost_oracle_one(requests: list[tuple[int, dict]], measured: float,
                                                         draft_scale: float) -> None:
    lengths = [n for n, _ in requests]
    out = ceilings(lengths, [acc for _, acc in requests], cost_model(draft_scale), measured)
    speedups = [out[k]["speedup"] for k in ("perfect", "zero_cost", "oracle")]
    assert speedups[0] >= speedups[1] >= speedups[2] >= 1.0
    for key in ("autoregressive", "oracle", "zero_cost", "perfect"):
        figures = out[key]
        assert figures["phase1_s"] + figures["phase2_s"] == pytest.approx(figures["makespan_s"])
        assert figures["makespan_s"] == pytest.approx(measured / figures["speedup"])


def test_a_well_predicted_request_alone_gains_what_the_cost_model_says() -> None:
    """One request at batch 1 (memory-bound): the oracle drafts, and the perfect drafter gets the
    best window's (w+1) tokens per step of V(1, 1+w)."""
    cost = cost_model()
    out = ceilings([450], [{"ngram": Acceptance(0.8, 1.0)}], cost, measured_autoregressive_s=1.0)
    choice = best_config({"ngram": Acceptance(0.8, 1.0)}, 1, cost)
    assert choice.method == "ngram" and choice.window > 0
    assert out["oracle"]["plan"] == "oracle" and out["oracle"]["speedup"] > 1.5
    best_w = max(range(9), key=lambda w: (w + 1) / roofline(1, 1 + w))
    assert 450 % (best_w + 1) == 0  # no partial last step
    assert out["perfect"]["speedup"] == pytest.approx((best_w + 1) * roofline(1, 1) / roofline(1, 1 + best_w))


def test_the_bounds_use_the_run_s_window_not_a_fixed_one() -> None:
    """A run whose drafts may be 16 tokens long must be judged against bounds that may use 16: on
    a memory-bound batch of 1 the perfect drafter then gains more than with windows up to 8."""
    runs = {"autoregressive": {"a": {"tokens": 510, "finish_reason": "length", "verify_steps": 510}}}
    narrow = from_samples(runs, cost_model(), measured_autoregressive_s=10.0, max_window=8)
    wide = from_samples(runs, cost_model(), measured_autoregressive_s=10.0, max_window=16)
    assert (narrow["max_window"], wide["max_window"]) == (8, 16)
    best = {w: max(range(w + 1), key=lambda v: (v + 1) / roofline(1, 1 + v)) for w in (8, 16)}
    assert best[16] > best[8]
    assert wide["perfect"]["speedup"] > narrow["perfect"]["speedup"] * 1.1


def test_expected_progress_of_a_choice_counts_steps_without_a_draft() -> None:
    assert Config("ngram", 4, 1.0, 0.5).progress == pytest.approx(1 + 0.5 * 4)
    assert Config("ngram", 4, 1.0, 0.5).fed == pytest.approx(3.0)
    assert NO_DRAFT.progress == 1.0 and NO_DRAFT.fed == 1.0


def test_from_samples_pools_every_mode_that_drafted() -> None:
    def sample(tokens: int, per_method: dict | None = None) -> dict:
        return {"tokens": tokens, "finish_reason": "stop", "verify_steps": tokens, "per_method": per_method or {}}

    runs = {"autoregressive": {"a": sample(50), "b": sample(200)},
            "specactor": {"a": sample(50, {"ngram": {"drafted": 80, "accepted": 60, "steps": 20}}),
                          "b": sample(200, {"suffix": {"drafted": 400, "accepted": 100, "steps": 100}})},
            "transformers": {"a": {"tokens": 50, "finish_reason": "stop"}}}
    out = from_samples(runs, cost_model(), measured_autoregressive_s=20.0)
    assert out["acceptance_from"] == ["specactor"]
    assert out["methods"]["ngram"]["requests"] == 1 and out["methods"]["suffix"]["requests"] == 1
    assert out["methods"]["ngram"]["mean_rate"] == pytest.approx(20 / 50)
    assert out["autoregressive"]["makespan_s"] == pytest.approx(20.0)
    assert out["perfect"]["speedup"] >= out["zero_cost"]["speedup"] >= out["oracle"]["speedup"] >= 1.0


def test_a_profile_that_prices_drafting_rows_keeps_the_bounds_ordered() -> None:
    """A cost model whose profile also holds one-row figures (a few drafting rows cost less than
    the same tokens over every row): the simulation hands it the expected drafting rows."""
    if "one_row_s" not in CostModel.__dataclass_fields__:
        pytest.skip("this cost model has no one-row table")
    cost = cost_model()
    cost.one_row_s = [[roofline(b, 1) + 0.0004 * (c - 1) for c in CHUNKS] for b in BATCHES]
    rng = random.Random(3)
    lengths = [rng.randint(5, 150) for _ in range(12)]
    acceptance = [{"ngram": Acceptance(rng.random(), rng.random())} for _ in lengths]
    out = ceilings(lengths, acceptance, cost, measured_autoregressive_s=5.0)
    assert out["perfect"]["speedup"] >= out["zero_cost"]["speedup"] >= out["oracle"]["speedup"] >= 1.0
    assert out["autoregressive"]["makespan_s"] == pytest.approx(5.0)


# ---------------------------------------------------------------------------- what a drafter must be


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=12), p=st.floats(0.0, 1.0),
       more=st.floats(0.0, 0.5), per_token_s=st.sampled_from([0.0, 1e-3, 1e-2]))
# found by this test: at p=1 the longest window wins on tokens per second, and while a
# request's last step still drafted a whole window past its end a perfect drafter came out slower
@example(lengths=[1, 10], p=0.875, more=0.5, per_token_s=1e-2)
@example(lengths=[32, 200, 64], p=0.996, more=0.5, per_token_s=1e-2)
def test_a_hypothetical_drafter_gains_more_with_acceptance_and_less_with_cost(
        lengths: list[int], p: float, more: float, per_token_s: float) -> None:
    """The what-if behind "the acceptance a drafter would need": never below autoregressive (the
    oracle may decline), nothing at p = 0, more with a better drafter, less with a dearer one.
    (1% slack: the simulation commits whole steps.)"""
    cost = cost_model()
    draft = DraftCost(per_row_s=per_token_s, fixed_s=per_token_s / 2)
    speed, tail = uniform_drafter(lengths, cost, p, draft, max_window=16)
    assert speed >= 1.0 and tail > 0
    assert uniform_drafter(lengths, cost, 0.0, draft)[0] == 1.0
    assert uniform_drafter(lengths, cost, min(1.0, p + more), draft, max_window=16)[0] >= speed * 0.99
    dearer = DraftCost(per_row_s=per_token_s * 10 + 1e-3, fixed_s=per_token_s / 2)
    assert uniform_drafter(lengths, cost, p, dearer, max_window=16)[0] <= speed * 1.01


def test_a_free_drafter_that_is_always_right_is_the_perfect_bound() -> None:
    lengths = [40, 90, 90, 200, 510]
    free = uniform_drafter(lengths, cost_model(), 1.0, max_window=16)[0]
    bounds = ceilings(lengths, [{}] * len(lengths), cost_model(), 10.0, max_window=16)
    assert free == pytest.approx(bounds["perfect"]["speedup"], rel=1e-9)
    assert free > 2.0  # the roofline's batch-1 tail is memory-bound: long windows pay there
