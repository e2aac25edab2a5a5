"""Drafting priced as the step runs it: decoupled, with the lookahead rollbacks discard.

A decoupled drafter hides its drafting behind the verify step, but redrafts its whole lookahead
after every step that cut it; a coupled one drafts only the window, after the verdict, and the
verifier waits for it. On a CPU a verify step is long beside the cheap drafters and decoupled
always wins; where a step is short (a GPU: tests/policy/data/flat_profile.json, every step 5 ms
whatever it verifies) drafting is not free, and at low acceptance most lookahead is discarded.
The policy's allocation used to price every step decoupled with drafting alone, while a
per-request rule made drafts coupled (the verifier then waited for them): replayed on the T=1
rollouts with an H100-shaped profile it was 0.91-0.94x of plain decoding. Now every draft is
decoupled (unless the engine is configured coupled) and priced with the lookahead it redrafts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from specactor.speculation import decoupled_lookahead
from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel, decoupled_work
from specactor.policy.simulation import FixedPolicy, PlainPolicy, SimRequest, Simulator

FLAT = Path(__file__).parent / "data" / "flat_profile.json"
METHODS = ["ngram", "suffix"]


@given(st.floats(0, 1), st.integers(1, 16), st.floats(0, 1))
def test_decoupled_work_lies_between_the_step_s_tokens_and_a_whole_lookahead(p: float, w: int, q: float) -> None:
    work = decoupled_work(p, w, q)
    assert q * (w + 1) + (1 - q) - 1e-9 <= work <= q * decoupled_lookahead(w) + (1 - q) + 1e-9
    assert decoupled_work(min(1.0, p + 0.1), w, q) <= work + 1e-9  # the better the drafts, the less redrafted


def test_the_simulator_charges_a_decoupled_drafter_the_lookahead_a_rollback_discards() -> None:
    """Every draft wrong at window 4, batch 32: decoupled, each step waits for the drafter to redraft
    its 9-token lookahead; coupled, for its 4 tokens after the 5 ms verify step."""
    cost = CostModel.from_profile(FLAT)
    draft = cost.draft_s("ngram", 32)
    assert 9 * draft > 0.005  # the drafter, not the verifier, sets the decoupled pace

    def makespan(decoupled: bool) -> float:
        requests = [SimRequest(f"r{i}", 50, {"ngram": 0.0}) for i in range(32)]
        return Simulator(cost).run(requests, FixedPolicy("ngram", 4, decoupled)).makespan_s

    assert makespan(True) == pytest.approx(50 * 9 * draft)
    assert makespan(False) == pytest.approx(50 * (0.005 + 4 * draft))


def _speedup(acceptance: float, batch: int, lag: int, seed: int = 0) -> float:
    def requests() -> list[SimRequest]:
        return [SimRequest(f"r{i}", 256, {m: acceptance for m in METHODS}) for i in range(batch)]

    plain = Simulator(CostModel.from_profile(FLAT), seed=seed, plan_every=4).run(requests(), PlainPolicy())
    ours = Simulator(CostModel.from_profile(FLAT), seed=seed, plan_every=4, lag=lag).run(
        requests(), FastestOfN(METHODS, CostModel.from_profile(FLAT), seed=seed))
    return plain.makespan_s / ours.makespan_s


@pytest.mark.parametrize("lag", [0, 2])
def test_where_a_step_is_short_beside_drafting_drafts_at_t1_acceptance_still_pay(lag: int) -> None:
    """35% a token (the cheap drafters at T=1), batch 32, verification free: before, the drafts ran
    coupled at a cost the allocation never priced (0.90-0.95x); priced, they pay."""
    assert _speedup(0.35, 32, lag) > 1.2


@pytest.mark.parametrize("batch", [1, 32])
def test_where_a_step_is_short_beside_drafting_drafts_that_never_pay_cost_nothing(batch: int) -> None:
    assert _speedup(0.0, batch, lag=2) >= 0.99


@pytest.mark.parametrize("profile, method, accepted", [(None, "model", [4, 4, 1]), (FLAT, "ngram", [1, 0, 0])])
def test_the_policy_drafts_decoupled_whatever_the_drafter_costs(profile: Path | None, method: str,
                                                                accepted: list[int]) -> None:
    """The verifier never waits for a decoupled drafter, so a slow one is priced by the lookahead
    it redrafts, not switched to coupled: the rule that did (drafting over 10% of a verify step
    and p**w < 0.2) made the cheap drafters coupled at T=1 on a GPU's cost shape, which put the
    replays under the floor, and live a coupled model drafter (~20 ms a token on this CPU) ran
    0.65x where a decoupled one ran 0.95x."""
    policy = FastestOfN(["suffix", method], CostModel.from_profile(profile), seed=0)
    for i in range(8):
        policy.add_request(f"r{i}")
        for k in range(24):
            policy.observe(f"r{i}", method, 4, accepted[k % 3])
            policy.observe(f"r{i}", "suffix", 4, 0)
    plan = policy.plan(8)
    assert any(c.window for c in plan.values()) and all(c.decoupled for c in plan.values())
