"""The policy simulator: its planning cadence is the PolicyActor's."""

from __future__ import annotations

import pytest

from specactor.policy.bandit import Choice
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
