"""The policy simulator: its planning cadence is the PolicyActor's."""

from __future__ import annotations

import pytest

from specactor.policy.bandit_state import Choice
from specactor.policy.cost_model import CostModel
from specactor.policy.simulation import FixedPolicy, SimRequest, Simulator


class _Recording(FixedPolicy):
    """One choice for every request, and the steps at which it was asked for a plan."""

    def __init__(self, choice: Choice) -> None:
        super().__init__("ngram", choice.window)
        self.fixed, self.planned = choice, []

    def plan(self, batch: int | None = None, step: int | None = None) -> dict[str, Choice]:
        self.planned.append(step)
        return {r: self.fixed for r in self.requests}


@pytest.mark.parametrize("choice, gap", [(Choice([], 0, True), 16), (Choice(["ngram"], 0, True), 4),
                                         (Choice(["ngram"], 2, True), 4)])
def test_the_simulator_plans_less_often_while_every_request_is_off_as_live(choice: Choice, gap: int) -> None:
    """Live, the policy plans 4x less often while every request is off and none is shadow-scored;
    a replay that planned every 4 steps whatever the plan could not reproduce the lock-outs
    that cadence caused."""
    policy = _Recording(choice)
    Simulator(CostModel.from_profile(), plan_every=4, dormant=4).run(
        [SimRequest(f"r{i}", 100, {"ngram": 0.5}) for i in range(4)], policy)
    assert {b - a for a, b in zip(policy.planned, policy.planned[1:])} == {gap}, policy.planned


class _Quiet(_Recording):
    """A policy with its own rule for a quiet plan (as FastestOfN has): the simulator asks it."""

    def __init__(self, choice: Choice, quiet: bool) -> None:
        super().__init__(choice)
        self.quiet = quiet

    def is_quiet(self, plan: dict[str, Choice]) -> bool:
        return self.quiet


@pytest.mark.parametrize("quiet, gap", [(True, 16), (False, 4)])
def test_the_simulator_asks_a_policy_with_its_own_rule_whether_a_plan_is_quiet(quiet: bool, gap: int) -> None:
    """FastestOfN counts a plan that only shadow-scores as quiet until a period's scores come
    right; the simulator must follow the policy's rule, or replays plan 4x as often as live."""
    policy = _Quiet(Choice(["ngram"], 0, True), quiet)
    Simulator(CostModel.from_profile(), plan_every=4, dormant=4).run(
        [SimRequest(f"r{i}", 100, {"ngram": 0.5}) for i in range(4)], policy)
    assert {b - a for a, b in zip(policy.planned, policy.planned[1:])} == {gap}, policy.planned


class _Scored(_Recording):
    """Records the steps on which each request was scored."""

    def __init__(self, choice: Choice) -> None:
        super().__init__(choice)
        self.scored: dict[str, list[int]] = {}
        self.commits: dict[str, int] = {}

    def observe(self, request_id: str, method: str, drafted: int, accepted: int) -> None:
        self.scored.setdefault(request_id, []).append(self.commits.get(request_id, 0))

    def observe_commit(self, request_id: str, tokens: int, ids: list[int] | None = None) -> None:
        self.commits[request_id] = self.commits.get(request_id, 0) + tokens


def test_the_simulator_scores_a_shadowed_request_as_live_every_stride_or_while_its_drafts_stay_right() -> None:
    """Live, a shadow-scoring drafter hears of its requests every SHADOW_STRIDE steps and drafts far
    enough to cover them: a request it drafts right for is scored on every step, one it drafts
    wrong for about once a stride. A replay scoring every step would see 4x the misses live has."""
    from specactor.speculation import SHADOW_STRIDE

    policy = _Scored(Choice(["ngram"], 0, True))
    Simulator(CostModel.from_profile(), plan_every=4).run(
        [SimRequest("right", 80, {"ngram": 1.0}), SimRequest("wrong", 80, {"ngram": 0.0})], policy)
    assert len(policy.scored["right"]) >= 78  # every step after the first stride boundary
    assert len(policy.scored["wrong"]) == pytest.approx(80 / SHADOW_STRIDE, abs=1)
