"""The closed batch's clock (specactor/policy/makespan.py) and the policy's check that a plan brings
the batch's end nearer, not only its tokens per second."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.makespan import Row, finish_s
from specactor.policy.simulation import PlainPolicy, SimRequest, Simulator


def _linear() -> CostModel:
    """A step costs 10 ms plus 2 ms a row (a CPU's shape), and twice that per row fed 2 tokens."""
    return CostModel([1, 64], [1, 2], [[0.012, 0.014], [0.138, 0.266]])


def _flat() -> CostModel:
    """A GPU's shape (the 32B H200 profile's): 30 ms a step at any batch, 38 ms as soon as rows
    verify a 1-token draft, 40 ms for 2."""
    return CostModel([1, 64], [1, 2, 3], [[0.030, 0.038, 0.040], [0.0307, 0.0385, 0.041]])


def test_a_batch_is_done_when_its_last_row_is_and_shrinks_on_the_way() -> None:
    cost = _linear()
    got = finish_s(cost, [Row(20), Row(10)])
    assert got == pytest.approx(10 * cost.verify_rows_s(2, 2, 0) + 10 * cost.verify_rows_s(1, 1, 0))
    # twice the progress for the short row: it is done after 5 steps, fed 2 tokens a step until then
    fast = finish_s(cost, [Row(20), Row(10, progress=2.0, fed=2.0, drafting=1.0)])
    assert fast == pytest.approx(5 * cost.verify_rows_s(2, 3, 1) + 15 * cost.verify_rows_s(1, 1, 0))


@st.composite
def _row(draw) -> Row:
    """A row as a plan makes one: a draft rate q and window w feed 1 + q*w tokens a step, of which
    up to all are committed."""
    q = draw(st.sampled_from([0.0, 0.3, 1.0]))
    w = draw(st.integers(1, 8)) if q else 0
    return Row(draw(st.integers(1, 800)), draw(st.floats(1.0, 1.0 + q * w)), 1.0 + q * w, q)


rows = st.lists(_row(), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(st.lists(_row(), min_size=33, max_size=300), st.sampled_from(["linear", "flat"]))
def test_a_large_batch_priced_in_stretches_is_priced_nearly_as_row_by_row(batch: list[Row], shape: str) -> None:
    """Beyond 32 rows, the steps while the first ones finish are interpolated between one batch size
    in every n/32; the last 32 rows' steps are priced one by one."""
    cost = _linear() if shape == "linear" else _flat()
    assert finish_s(cost, batch) == pytest.approx(finish_s(cost, batch, stretches=len(batch)), rel=0.01)


@settings(max_examples=150, deadline=None)
@given(rows, st.randoms(use_true_random=False), st.sampled_from(["linear", "flat"]))
def test_the_batch_cannot_end_before_its_slowest_row_could_alone(batch: list[Row], rng, shape: str) -> None:
    cost = _linear() if shape == "linear" else _flat()
    got = finish_s(cost, batch)
    assert got >= max(r.left / r.progress for r in batch) * cost.verify_rows_s(1, 1, 0) * (1 - 1e-9)
    shuffled = list(batch)
    rng.shuffle(shuffled)
    assert finish_s(cost, shuffled) == pytest.approx(got)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 800), st.floats(0.0, 1.0)), min_size=1, max_size=40),
       st.sampled_from([0, 1, 4, 8]), st.data(), st.sampled_from(["linear", "flat"]))
def test_more_progress_for_a_row_never_makes_the_batch_later(lefts: list[tuple[int, float]], window: int, data,
                                                             shape: str) -> None:
    """Rows of one draft configuration (the step model spreads a step's tokens over its rows, so
    rows that leave with fewer tokens than the others' mean would raise the mean; not tested here)."""
    cost = _linear() if shape == "linear" else _flat()
    batch = [Row(left, 1.0 + share * window, 1.0 + window, 1.0 if window else 0.0) for left, share in lefts]
    i = data.draw(st.integers(0, len(batch) - 1))
    row = batch[i]
    faster = [*batch[:i], Row(row.left, (row.progress + row.fed) / 2, row.fed, row.drafting), *batch[i + 1:]]
    assert finish_s(cost, faster) <= finish_s(cost, batch) * (1 + 1e-9)


def _policy(acceptance: list[float], cost: CostModel, left: int | None, greedy: bool = False) -> FastestOfN:
    """A policy that has seen 40 four-token drafts of every request at its acceptance (and explores
    nothing), each request ``left`` tokens from its limit (None: not told)."""
    fon = FastestOfN(["ngram"], cost, max_window=4, explore_start=0.0, explore_budget=0.0, shadow=False,
                     racing=False)
    for i, p in enumerate(acceptance):
        rid = f"r{i}"
        fon.add_request(rid)
        fon.observe_commit(rid, 100)
        for d in range(40):
            right = 0
            while right < 4 and (d * 7919 + right * 104729) % 1000 < p * 1000:  # deterministic, rate p
                right += 1
            fon.observe(rid, "ngram", 4, right)
        if left is not None:
            fon.observe_limit(rid, left, greedy)
    return fon


def test_a_plan_that_leaves_a_request_behind_does_not_run_where_every_request_may_run_to_its_limit() -> None:
    """31 requests whose drafts are right half the time, one whose drafts never are. On a GPU's
    flat step the 31 pay for the step's extra cost in tokens per second, but if every request may
    run to its limit the batch ends when the undrafted one does: no sooner, and dearer."""
    cost = _flat()
    acceptance = [0.5] * 31 + [0.0]
    unknown = _policy(acceptance, cost, left=None).plan(32)
    assert sum(bool(c.window) for c in unknown.values()) >= 31  # tokens per second alone: it speculates
    greedy = _policy(acceptance, cost, left=500, greedy=True).plan(32)
    assert sum(bool(c.window) for c in greedy.values()) >= 31  # a greedy batch keeps that objective
    sampled = _policy(acceptance, cost, left=500).plan(32)
    assert not any(c.window for c in sampled.values())
    assert all("would not finish sooner" in c.reason for c in sampled.values())
    # while requests wait for a slot the batch is not closed: one that ends early lets the next in
    queued = _policy(acceptance, cost, left=500)
    queued.waiting = 8
    assert sum(bool(c.window) for c in queued.plan(32).values()) >= 31
    # where every request gains, the batch's end comes nearer: it speculates
    every = _policy([0.8] * 32, cost, left=500).plan(32)
    assert all(c.window for c in every.values())


def test_on_a_flat_step_the_closed_batch_check_keeps_a_sampled_rollout_from_losing_time() -> None:
    """The shape of the T=1 replays on a 32B GPU profile: most samples end early and draft well,
    the few that run to the limit draft badly. By tokens per second the policy drafts the whole
    batch while it is large and loses; told the limits, it does not."""
    cost = _flat()

    def requests(limit: int | None) -> list[SimRequest]:
        short = [SimRequest(f"s{i}", 120 + 10 * i, {"ngram": 0.6}, limit=limit) for i in range(26)]
        long = [SimRequest(f"l{i}", 400, {"ngram": 0.05}, limit=limit) for i in range(6)]
        return short + long

    def makespan(policy, limit: int | None) -> float:
        return Simulator(cost, seed=1, plan_every=4, lag=2).run(requests(limit), policy).makespan_s

    plain = makespan(PlainPolicy(), None)
    unaware = makespan(FastestOfN(["ngram"], cost, max_window=4), None)
    told = makespan(FastestOfN(["ngram"], cost, max_window=4), 400)
    assert unaware > 1.02 * plain  # the loss exists
    assert told <= 1.01 * plain
