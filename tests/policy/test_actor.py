"""PolicyActor: what it takes from the drafters' stats."""

from __future__ import annotations

from specactor import protocol as p
from specactor.policy.actor import DORMANT_SLOWDOWN, PolicyActor
from specactor.policy.bandit_state import Choice


def test_the_policy_leaves_a_learned_drafter_out_until_its_stats_say_it_is_ready() -> None:
    policy = PolicyActor("policy", ["ngram", "suffix", "learned"])
    assert policy.fon.unready == {"learned"}
    policy._on_drafter_stats(p.StatsReply(name="draft-learned", values={"rounds": 0, "ready": 1}))
    assert policy.fon.unready == set() and policy.fon.replan_soon
    policy._on_drafter_stats(p.StatsReply(name="draft-learned", values={"rounds": 0, "ready": 0}))
    assert policy.fon.unready == {"learned"}
    policy._on_drafter_stats(p.StatsReply(name="draft-ngram", values={"rounds": 3}))  # no flag: unchanged
    assert policy.fon.unready == {"learned"}


def _planned_steps(monkeypatch, plan_s: float, step_ns: int, steps: int = 80, batch: int = 8,
                   arrivals: bool = False, choice: Choice | None = None,
                   scores: dict[str, list[int]] | None = None) -> tuple[list[int], PolicyActor]:
    """The steps at which the policy planned (and the policy), fed ``steps`` verdict batches of
    ``step_ns`` each while a plan takes ``plan_s`` of CPU time (its clock is patched: nothing sleeps);
    ``arrivals``: a new request joins at every step (more prompts than slots); ``choice``: what
    every plan gives every request (default: the bandit's own plan; one with methods and no window
    shadow-scores them); ``scores``: every verdict's scores from step 20 on."""
    import asyncio

    import specactor.policy.actor as policy_actor

    policy = PolicyActor("policy", ["ngram", "suffix"])
    planned: list[int] = []
    real_plan = policy.fon.plan
    clock = [0.0]

    def plan(batch: int, step: int | None = None):
        planned.append(step)
        clock[0] += plan_s
        if choice is None:
            return real_plan(batch, step=step)
        if choice.methods and not choice.window:
            policy.fon.shadowed = set(policy.fon.requests)
        policy.fon.replan_soon = False  # as the bandit's plan does where it explores nothing
        return {rid: choice for rid in policy.fon.requests}

    async def send(peer, msg, **kwargs) -> bool:
        return True

    monkeypatch.setattr(policy.fon, "plan", plan)
    monkeypatch.setattr(policy, "send", send)
    monkeypatch.setattr(policy_actor.time, "thread_time", lambda: clock[0])

    async def feed() -> None:
        for step in range(1, steps + 1):
            verdicts = [p.Verdict(request_id=f"r{i}", start=10 + step, tokens=[5], accepted=0, drafted=0,
                                  scores=scores if scores and step >= 20 else {})
                        for i in range(batch)]
            if arrivals:  # its prompt is prefilled in this step
                verdicts.append(p.Verdict(request_id=f"new{step}", start=0, tokens=[5], accepted=0, drafted=0))
            ids = [v.request_id for v in verdicts]
            await policy._on_verdicts(p.VerdictBatch(step=step, verdicts=verdicts, step_ns=step_ns,
                                                     batch_size=len(ids)))
    asyncio.run(feed())
    return planned, policy


def test_plans_are_spaced_so_planning_takes_at_most_a_quarter_of_the_time_between_them(monkeypatch) -> None:
    """A plan of 20 ms against steps of 5 ms (a large batch on a GPU) may come every 16 steps at
    most, explorations' follow-up plans included, and an exploration is charged for the 16 steps
    it then lasts; a plan of 0.1 ms against the same steps plans as often as before the spacing
    (every 4 steps, and after every step that explored)."""
    from specactor.policy.actor import PLAN_SHARE

    slow, policy = _planned_steps(monkeypatch, 0.020, 5_000_000)
    gaps = [b - a for a, b in zip(slow[1:], slow[2:])]  # after the first plan (new requests) and its timing
    assert policy.plan_gap == 16 and gaps and min(gaps) >= 0.020 / (PLAN_SHARE * 0.005), slow
    assert policy.fon.exploration_steps == 16
    fast, policy = _planned_steps(monkeypatch, 0.0001, 5_000_000)
    assert policy.plan_gap == 1 and policy.fon.exploration_steps == 1
    assert len(fast) >= 80 // 4 and len(fast) > 3 * len(slow), (fast, slow)


def test_requests_arriving_at_every_step_do_not_break_the_spacing(monkeypatch) -> None:
    """With more prompts than slots a request joins at nearly every step; each used to trigger a
    plan at once. They draft by the default choice until the next plan."""
    slow, policy = _planned_steps(monkeypatch, 0.020, 5_000_000, arrivals=True)
    assert policy.plan_gap == 16 and min(b - a for a, b in zip(slow[1:], slow[2:])) >= 16, slow
    fast, _ = _planned_steps(monkeypatch, 0.0001, 5_000_000, arrivals=True)
    assert fast == list(range(1, 81))  # fast plans: every arrival is planned at once, as before


def test_the_policy_plans_less_often_while_every_request_is_off_until_shadow_scores_come_right(monkeypatch) -> None:
    """Every request off: nothing changes between plans, so it plans 4x less often; shadow-scored
    too (window 0, a free method drafting) while the scores are wrong (at T=1 on 2 cores, plans
    every 4 steps through such a tail were a quarter of the caller's CPU). Scores that come right
    are news a plan must act on (a T=0 tail that began repeating itself waited up to 16 steps for
    the next plan): the next plan comes after the next step, and the rest every 4 steps."""
    off, _ = _planned_steps(monkeypatch, 0.0001, 50_000_000, choice=Choice([], 0, True))
    assert {b - a for a, b in zip(off[1:], off[2:])} == {4 * DORMANT_SLOWDOWN}, off
    wrong, policy = _planned_steps(monkeypatch, 0.0001, 50_000_000, choice=Choice(["ngram"], 0, True),
                                   scores={"ngram": [3, 0]})
    assert {b - a for a, b in zip(wrong[1:], wrong[2:])} == {4 * DORMANT_SLOWDOWN}, wrong
    assert not policy.fon.promising
    right, policy = _planned_steps(monkeypatch, 0.0001, 50_000_000, choice=Choice(["ngram"], 0, True),
                                   scores={"ngram": [1, 1]})
    # scores from step 20; the 4th right one (step 23) brings a plan at once, the rest come every 4 steps
    assert policy.fon.promising and right[:3] == [1, 16, 23], right
    assert {b - a for a, b in zip(right[3:], right[4:])} == {4} and right[3] == 24, right


def test_the_policy_is_told_how_many_tokens_each_request_may_still_generate() -> None:
    """From every verdict: max_tokens less the output after the step, and whether it is greedy
    (the closed-batch check's inputs); -1 where the verdict does not say."""
    import asyncio

    policy = PolicyActor("policy", ["ngram", "suffix"])

    async def send(peer, msg, **kwargs) -> bool:  # the plan its new requests bring goes nowhere
        return True

    policy.send = send
    verdicts = [p.Verdict(request_id="a", start=40, tokens=[5, 6, 7], accepted=2, drafted=2, max_tokens=100),
                p.Verdict(request_id="b", start=0, tokens=[5], accepted=0, drafted=0, max_tokens=64, greedy=True),
                p.Verdict(request_id="c", start=3, tokens=[5], accepted=0, drafted=0)]
    asyncio.run(policy._on_verdicts(p.VerdictBatch(step=1, verdicts=verdicts, step_ns=0, batch_size=3, waiting=4)))
    assert policy.fon.waiting == 4  # requests still waiting for a slot: the batch is not closed
    requests = policy.fon.requests
    assert (requests["a"].left, requests["a"].greedy) == (57, False)
    assert (requests["b"].left, requests["b"].greedy) == (63, True)
    assert requests["c"].left == -1
