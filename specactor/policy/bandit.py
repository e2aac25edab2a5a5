"""Fastest-of-N: per-request drafter choice by Thompson sampling on the cost model.

Arms are the drafting methods; an arm's reward is the request's predicted
tokens per second with that method (cost model: its acceptance, its drafting
time, the verify time at the current batch), so a slow drafter must earn its
cost with acceptance. Per-token acceptance has a Beta posterior per (request,
method): accepted draft tokens are successes, rejected positions failures,
discounted so that a request whose best method changes half-way is followed.
A new request starts from the running global estimate of each method (prior
pseudo-counts), so it begins on the best method so far.

Three ways to turn the posterior into a choice are built in (``scheme``):
Thompson sampling (the default), UCB on the mean, and greedy on the mean;
``bench/policy_sim.py`` compares their regret and makespan in simulation and
RESULTS.md records why the default is what it is.

Whether and how far each request speculates is decided for the batch as a
whole: a request's draft tokens make the *batch's* step longer, so they must
buy more tokens than the whole batch would make in the time they add. The
windows (0 = off) are the ones that maximise the step's predicted tokens per
second, ``sum(progress) / step_s(batch, fed, rows)``, with everyone's tokens
fed (:meth:`FastestOfN._allocate`); an allocation that does not beat plain
decoding by ``min_gain`` is not taken, so where speculation cannot pay it is
off. That allocation uses a cautious acceptance: the posterior mean less
``caution`` standard deviations, the posterior pooling up to ``pool_weight``
observations of the method's global estimate (a request with little evidence
of its own is like the others). While nothing at all is known of a method,
only explorers use it. A rollout batch is done when its last sample is: where
every request's limit is known and none is greedy, the allocation must also
bring the batch's end nearer, every request assumed to run to its limit
(:mod:`specactor.policy.makespan`; an exploration too, at its draws), or
every request is off. A request that is off learns nothing: its own evidence
fades towards the global estimate, or one unlucky early on would stay off.

Exploration is the Thompson draw: a few requests (``explore_share`` of the
batch; all of them while the method is barely known, as one step's evidence
then serves every request) whose cautious mean says "off" may use their draw
instead, when the batch allocation says the draw would pay; so a draw must pay
for the step's extra cost (at large batch, all of it) to turn anything on. Its
worst case (the draw was wrong: the extra time bought nothing) is bounded
twice over: explorations are paid from a credit of step time that grows by
``explore_budget`` of a step per round (a plan, or ``round_steps`` steps when
the caller plans less often: a policy that plans rarely while nothing pays
must not starve its explorations), half a step's worth to start with, for the
cold start, shortening windows and dropping explorers to fit; and a
request that explored waits ``hold_rounds`` rounds before it may again, twice
as long after each exploration that the mean did not confirm. An exploration
lasts one step: the plan after it comes at once (``replan_soon``), or, where
the caller spaces its plans (a plan slower than a few steps), until the next
plan, and its cost is charged for each of those ``exploration_steps``.

Shadowing: in the tail (at most ``shadow_below`` of the peak requests left),
a request that is off keeps its free methods drafting with window 0: nothing
is verified, but the verifier scores their drafts against what each step
commits. A request's acceptance can change as it goes (greedy code falls into
repeating itself: ngram accepted 0 of its drafts early and 100% in the tail of
the T=0 bench), and evidence for a request that is off otherwise only comes
from explorations, which a global estimate near 0 never draws. Shadow drafting
is not free on a 2-core machine (the drafters' CPU slows the verifier's
forward: 17k shadow tokens drafted over a T=1 tail that verified 47), so a
request is shadowed in periods of ``shadow_rounds`` rounds, the gap between
them doubling from ``shadow_gap`` rounds up to ``max_shadow_gap`` while it
stays off; a period in which a free method was right at least ``shadow_keep``
of the time goes on, until the request is turned on or the scores fall.
Shadowing alone leaves a plan quiet (:meth:`FastestOfN.is_quiet`: the caller may
plan less often); a period whose scores come right is :attr:`promising` and asks
for a plan at once.

Methods that cost almost nothing to run (prompt lookup, suffix matching) ride
along on every speculating request: the verifier verifies the longest draft
and scores the others, so their acceptance is known at no cost. Switches are
held for a few rounds: a switch costs the new drafter a Track.

Acceptance is not geometric: a drafter that was right to the end of its last draft is in a
run (code repeating itself, a sibling's output being followed) and its next draft is right far
more often than after a miss (replayed suffix drafts at T=0: 85% of their tokens against 20%;
T=1: 42% against 21%; ``bench/drafter_steps.py``). With ``acceptance="markov"`` the posterior that
ranks methods and sizes windows is the one for the request's state, per method: evidence from
drafts that followed a draft right to its end, or from the others, each pooled with the global
estimate for that state. ``"geometric"`` keeps one posterior per method, whatever came before.

Drafts that are one experiment: requests in lockstep on the same text draft the same tokens and
get the same verdict (vLLM prefills a batch's prompts in one step, samples of code open alike, and
at T=0 a prompt's siblings are one sample). Counted as n drafts they weigh n times in the global
estimate: live on vLLM, 28 copies of one wrong 1-token draft put ngram's estimate at 0 and kept a
batch of 32 off. So within a plan round, drafts of one method with the same length after the same
last ``SAME_CONTEXT`` committed tokens are one draft to the global estimate, their mean (each
request's own evidence counts them all). The key needs the committed tokens (``observe_commit``'s
``ids``); a caller that does not pass them gets every draft counted.

Tail racing: once requests have finished and drafters have room, the slowest
requests (lowest expected progress per step) get the next-best methods as well;
the verifier verifies all candidates in one forward as a token tree and keeps
the longest accepted.
"""
from __future__ import annotations

import math
import random

from specactor.policy.bandit_state import (ACCEPTANCE_MODELS, SAME_CONTEXT, SCHEMES, SHADOW_EVIDENCE, Acceptance, RequestState)
from specactor.policy.cost_model import CostModel
from specactor.policy.drafting_tally import DraftingTally
from specactor.policy.planner import Planner


class FastestOfN(Planner):
    """The decision logic, free of messaging: the PolicyActor and the simulator share it."""

    #: how the window search keeps a step's drafting time (:mod:`specactor.policy.drafting_tally`)
    tally_class: type[DraftingTally] = DraftingTally
    #: its first phase scores every batch prefix of a window at once (:mod:`specactor.policy.window_sweep`);
    #: False: one allocation at a time (the reference, for tests and ``bench/policy_plan_time.py``)
    vectorized_sweep: bool = True

    def __init__(self, methods: list[str], cost: CostModel, *, max_window: int = 8, decoupled: bool = True,
                 decay: float = 0.9, token_decay: float = 0.975, prior_weight: float = 2.0, racing: bool = True, max_racers: int = 3,
                 racing_below: float = 0.5, scheme: str = "thompson", switch_margin: float = 0.1,
                 hold_rounds: int = 8, min_gain: float = 0.03, caution: float = 1.0, pool_weight: float = 8.0,
                 explore_share: float = 0.125, explore_budget: float = 0.01, explore_start: float = 0.5,
                 max_explore_gap: int = 256, explore_steps: int = 8, explore_window: int = 1,
                 round_steps: int = 4, shadow: bool = True, shadow_below: float = 0.5, shadow_rounds: int = 2,
                 shadow_gap: int = 4, max_shadow_gap: int = 16, shadow_keep: float = 0.8,
                 closed_batch: bool = True, acceptance: str = "geometric", seed: int = 0) -> None:
        if not methods:
            raise ValueError("FastestOfN needs at least one drafting method")
        if scheme not in SCHEMES:
            raise ValueError(f"unknown bandit scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        if acceptance not in ACCEPTANCE_MODELS:
            raise ValueError(f"unknown acceptance model {acceptance!r}; choose one of {', '.join(ACCEPTANCE_MODELS)}")
        self.markov = acceptance == "markov"
        self.scheme = scheme
        self.rounds = 0.0  # plans made, or steps / round_steps where that is more (rounds time holds and gaps)
        self.round_steps = max(1, round_steps)
        self.switch_margin = switch_margin
        self.hold_rounds = hold_rounds
        self.min_gain = min_gain  # speculation must beat plain decoding by this share, or it is off
        self.caution = caution  # posterior standard deviations below the mean that exploitation assumes
        self.pool_weight = pool_weight  # how strongly exploitation shrinks a request towards the global estimate
        self.explore_share = explore_share
        self.explore_budget = explore_budget
        self.explore_credit = explore_start  # steps' worth of extra time explorations may still cost
        self.replan_soon = False  # the last plan explored: plan again after the next step
        # steps an exploration lasts: 1 where the next plan comes after the next step; the policy
        # actor sets it higher where it spaces its plans (an exploration's cost is charged that often)
        self.exploration_steps = 1
        self.max_explore_gap = max_explore_gap
        # live, a choice takes a few steps to reach the drafter and its drafts the verifier (the
        # verifier does not wait for the policy): an exploration holds until its first draft is
        # verified, or this many steps, or it would be switched off before it learnt anything
        self.feed_done: dict[str, int] = {}  # per method: the step by which its drafter has fed what explorers gave it
        self.step_now = 0  # the verifier's step at the last plan
        self.explore_steps = explore_steps
        self.explore_window = explore_window
        self.primary: dict[str, str] = {}  # request id -> method chosen last time (switching has a cost)
        self.methods = list(methods)
        self.unready: set[str] = set()  # methods whose drafter can propose nothing yet: never planned
        self.cost = cost
        self.max_window = max_window
        self.decoupled = decoupled
        self.decay = decay  # per plan: offer rates, and the fading of a request that is off
        self.token_decay = token_decay  # per token checked: a request's acceptance evidence (~40 tokens)
        self.prior_weight = prior_weight
        self.racing = racing
        self.max_racers = max(1, max_racers)
        self.racing_below = racing_below
        self.shadow, self.shadow_below = shadow, shadow_below
        self.shadow_rounds, self.shadow_gap, self.max_shadow_gap = shadow_rounds, shadow_gap, max_shadow_gap
        self.shadow_keep = shadow_keep
        # a plan must also bring the batch's end nearer, every sampled request assumed to run to its
        # limit (:mod:`specactor.policy.makespan`), where every request's limit is known
        self.closed_batch = closed_batch
        self.waiting = 0  # requests accepted but not yet running (the verifier's last step said)
        self.shadowed: set[str] = set()  # requests off but scored (the last plan's)
        # a shadowed request's period has SHADOW_EVIDENCE scores, nearly all right: it may turn on
        # soon, so plans come at the usual cadence (False: shadowing alone does not hurry them)
        self.promising = False
        self.rng = random.Random(seed)
        self.global_arms = {m: Acceptance() for m in methods}
        self.global_runs = {m: Acceptance() for m in methods}
        self.global_fresh = {m: Acceptance() for m in methods}
        self.requests: dict[str, RequestState] = {}
        self.peak_requests = 0
        # this round's drafts by (method, recent tokens, length, markov state): members, their summed counts
        self.round_drafts: dict[tuple, list[float]] = {}

    # ------------------------------------------------------------------ bookkeeping

    def add_request(self, request_id: str) -> None:
        self.requests.setdefault(request_id, RequestState())
        self.peak_requests = max(self.peak_requests, len(self.requests))

    def remove_request(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.primary.pop(request_id, None)

    def observe(self, request_id: str, method: str, drafted: int, accepted: int) -> None:
        """A draft of ``method`` for ``request_id`` had ``accepted`` of ``drafted`` tokens right."""
        if method not in self.global_arms or drafted <= 0:
            return
        req = self.requests.get(request_id)
        in_run = req is not None and req.in_run.get(method, False)
        states = [self.global_arms[method]]
        if self.markov:
            states.append((self.global_runs if in_run else self.global_fresh)[method])
        self._observe_global(states, (method, req.recent if req else None, drafted, in_run), drafted, accepted)
        if req is not None:
            req.arms.setdefault(method, Acceptance()).observe(drafted, accepted, self.token_decay)
            req.drafts_seen += 1
            if request_id in self.shadowed:
                tally = req.period.setdefault(method, [0.0, 0.0])
                tally[0] += accepted
                tally[1] += accepted + (accepted < drafted)
                if not self.promising and self._period_right(req, method, SHADOW_EVIDENCE):
                    self.promising = self.replan_soon = True  # news a plan must act on
            if self.markov:
                (req.runs if in_run else req.fresh).setdefault(method, Acceptance()).observe(
                    drafted, accepted, self.token_decay)
                req.in_run[method] = accepted >= drafted
                req.scored_at[method] = req.committed

    def _observe_global(self, arms: list[Acceptance], key: tuple, drafted: int, accepted: int) -> None:
        """Count a draft in the global estimates, once with the round's others of the same key (their
        mean: see the module docstring); every draft alone where the request's tokens are unknown."""
        group = self.round_drafts.get(key) if key[1] is not None else None
        if group is None:
            for arm in arms:
                arm.observe(drafted, accepted, 0.999)
            if key[1] is not None:
                self.round_drafts[key] = [1, accepted, float(accepted < drafted)]
            return
        n, successes, failures = group
        group[:] = [n + 1, successes + accepted, failures + (accepted < drafted)]
        for arm in arms:
            arm.revise((successes / n, failures / n), (group[1] / (n + 1), group[2] / (n + 1)))

    def observe_offer(self, request_id: str, method: str, offered: bool) -> None:
        """Whether ``method``, drafting for the request, had a draft for this step. A model copy's
        steps before its first draft for the request say nothing of its rate (it is feeding the
        request's context: 20 steps and more, which drove its rate to 0.2 and its window to 1)."""
        req = self.requests.get(request_id)
        if req is not None and (offered or method in req.draft_rates or not self.cost.feeds_context(method)):
            rate = req.draft_rates.get(method, 1.0)
            req.draft_rates[method] = rate + (1 - self.decay) * (float(offered) - rate)

    def observe_limit(self, request_id: str, left: int, greedy: bool, prompt_len: int = 0) -> None:
        """The request may still generate ``left`` output tokens (its max_tokens less its output so
        far; negative: not known) and is decoded greedily or not: what the closed-batch check needs
        (:meth:`_closed_batch`); its prompt is ``prompt_len`` tokens (0: not told)."""
        req = self.requests.get(request_id)
        if req is not None:
            req.left, req.greedy = left, greedy
            req.prompt_len = prompt_len or req.prompt_len

    def observe_commit(self, request_id: str, tokens: int, ids: list[int] | None = None) -> None:
        """The step committed ``tokens`` tokens for the request (``ids``: which, where known)."""
        req = self.requests.get(request_id)
        if req is not None:
            req.committed += tokens
            req.steps += 1
            if ids is not None:
                req.recent = ((req.recent or ()) + tuple(ids))[-SAME_CONTEXT:]

    # ------------------------------------------------------------------ choosing

    def _posterior(self, req: RequestState, method: str) -> tuple[float, float]:
        """Beta(a, b) for ``method`` on ``req``: own discounted counts + global prior, worth
        ``prior_weight`` observations, and up to ``pool_weight`` as the global estimate firms up
        (a request with little evidence of its own is like the others)."""
        glob = self.global_arms[method]
        prior_mean = (glob.successes + 1) / (glob.weight + 2)  # never certain, even from one draft
        own = req.arms.get(method, Acceptance())
        if self.markov and req.committed - req.scored_at.get(method, -1_000_000) <= self.max_window + 1:
            # the request's state's evidence, its prior the state's global estimate (a state is
            # news of the text where the request is: one from before a gap of undrafted steps is stale)
            in_run = req.in_run.get(method, False)
            state = (self.global_runs if in_run else self.global_fresh)[method]
            # which leans on the estimate over both states until the state's own has a few drafts' worth
            prior_mean = (state.successes + self.prior_weight * prior_mean) / (state.weight + self.prior_weight)
            glob, own = state, (req.runs if in_run else req.fresh).get(method, Acceptance())
        weight = max(self.prior_weight, min(self.pool_weight, glob.weight))
        a = own.successes + weight * prior_mean + 0.5
        b = own.failures + weight * (1 - prior_mean) + 0.5
        return a, b

    def estimate(self, request_id: str, method: str) -> float:
        a, b = self._posterior(self.requests.get(request_id, RequestState()), method)
        return a / (a + b)

    def _exploit_p(self, req: RequestState, method: str) -> float:
        """The acceptance the batch's windows are chosen on: the posterior mean less ``caution``
        standard deviations (the best of several noisy means is biased up, and a step that
        speculates where it does not pay costs every request); 0 while nothing at all is known
        of the method (the prior's 0.5 is a guess: only explorers act on it)."""
        if not req.arms.get(method, Acceptance()).weight and self.global_arms[method].weight < 1:
            return 0.0
        a, b = self._posterior(req, method)
        n = a + b
        return max(0.0, a / n - self.caution * math.sqrt(a * b / (n * n * (n + 1))))

    def _sample(self, req: RequestState, method: str) -> float:
        """The acceptance the choice is made on: a posterior draw, an optimistic bound, or the mean."""
        a, b = self._posterior(req, method)
        if self.scheme == "thompson":
            return self.rng.betavariate(a, b)
        mean = a / (a + b)
        if self.scheme == "ucb":
            return min(1.0, mean + math.sqrt(2 * math.log(self.rounds + 2) / (a + b)))
        return mean
