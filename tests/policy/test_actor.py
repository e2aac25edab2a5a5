"""PolicyActor: what it takes from the drafters' stats."""

from __future__ import annotations

from specactor import protocol as p
from specactor.policy.actor import PolicyActor


def test_the_policy_leaves_a_learned_drafter_out_until_its_stats_say_it_is_ready() -> None:
    policy = PolicyActor("policy", ["ngram", "suffix", "learned"])
    assert policy.fon.unready == {"learned"}
    policy._on_drafter_stats(p.StatsReply(name="draft-learned", values={"rounds": 0, "ready": 1}))
    assert policy.fon.unready == set() and policy.fon.replan_soon
    policy._on_drafter_stats(p.StatsReply(name="draft-learned", values={"rounds": 0, "ready": 0}))
    assert policy.fon.unready == {"learned"}
    policy._on_drafter_stats(p.StatsReply(name="draft-ngram", values={"rounds": 3}))  # no flag: unchanged
    assert policy.fon.unready == {"learned"}
