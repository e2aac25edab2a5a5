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
from collections import Counter
from dataclasses import dataclass, field

from specactor.speculation import decoupled_lookahead
from specactor.policy.cost_model import (CostModel, StepCosts, expected_progress, iteration_s,
                                         progress_by_window, race_progress, useful_window)
from specactor.policy.drafting_tally import DraftingTally, drafting_seconds
from specactor.policy.makespan import ClosedBatch
from specactor.policy.window_sweep import WindowSweep


SCHEMES = ("thompson", "ucb", "greedy")
#: committed tokens that, with the method and the draft's length, make drafts in a round one experiment
SAME_CONTEXT = 8
#: a free method's scores in a shadow period that judge it (right ``shadow_keep`` of them: it goes on)
SHADOW_EVIDENCE = 4
#: a shadow period without SHADOW_EVIDENCE scores yet (its drafts still on their way) is extended, up to this many periods
SHADOW_WAIT = 4
#: scores of a kept period that mark a change of text (its older misses are dropped); with 4, chance
#: runs at T=1 turned requests on that did not pay (32B GPU shape, held-out T=1: 0.96x -> 0.94x)
SHADOW_CHANGE = 8
#: while every request is off and no shadow-scored one looks like turning on (:meth:`FastestOfN.is_quiet`)
#: the PolicyActor plans, and asks the drafters for timings, this many times less often; the simulator
#: does the same
DORMANT_SLOWDOWN = 4
#: how the acceptance a choice is made on depends on the request's past drafts (see the module docstring)
ACCEPTANCE_MODELS = ("geometric", "markov")


@dataclass
class Acceptance:
    """Discounted Beta counts of per-token acceptance.

    A draft of which ``accepted`` tokens were right and the next one wrong is ``accepted``
    successes and one failure (the tokens after it are unknown): the geometric likelihood, to
    which the Beta is conjugate. Old evidence is discounted per token checked, not per draft:
    a shadowed request's draft is scored one committed token a step, and discounting per
    observation capped what 100% acceptance could show at ~10 tokens of evidence (the
    posterior then sat near 0.7 below a modest global estimate, and a tail that repeated
    itself exactly stayed off), while a verified 8-token draft counted 8."""

    successes: float = 0.0
    failures: float = 0.0

    def observe(self, drafted: int, accepted: int, decay: float) -> None:
        """``decay``: the weight left to old evidence per token checked."""
        if drafted <= 0:
            return
        failed = 1 if accepted < drafted else 0
        kept = decay ** (accepted + failed)
        self.successes = self.successes * kept + accepted
        self.failures = self.failures * kept + failed

    def revise(self, old: tuple[float, float], new: tuple[float, float]) -> None:
        """Replace counts ``old`` (successes, failures) added earlier by ``new``."""
        self.successes += new[0] - old[0]
        self.failures += new[1] - old[1]

    @property
    def mean(self) -> float:
        n = self.successes + self.failures
        return self.successes / n if n > 0 else 0.5

    @property
    def weight(self) -> float:
        return self.successes + self.failures


@dataclass
class Choice:
    """What one request does next."""

    methods: list[str]  # first = primary, then free riders and racers; empty = no speculation
    window: int
    decoupled: bool
    reason: str = ""
    race: bool = False  # verify every method's draft (token tree) instead of the longest one

    def same_as(self, other: "Choice | None") -> bool:
        return other is not None and (self.methods, self.window, self.decoupled, self.race) == (
            other.methods, other.window, other.decoupled, other.race)


def is_dormant(plan: dict[str, Choice]) -> bool:
    """Whether nothing in ``plan`` drafts or is shadow-scored: a plan rarely changes then, so it may
    come less often (for a policy that keeps no shadow periods; :meth:`FastestOfN.is_quiet` is the
    Fastest-of-N policy's own rule)."""
    return not any(choice.window or choice.methods for choice in plan.values())


@dataclass
class _Request:
    arms: dict[str, Acceptance] = field(default_factory=dict)
    # the markov model's evidence, per method: drafts after one right to its end, and after any other
    runs: dict[str, Acceptance] = field(default_factory=dict)
    fresh: dict[str, Acceptance] = field(default_factory=dict)
    in_run: dict[str, bool] = field(default_factory=dict)  # per method: its last scored draft was right to its end
    scored_at: dict[str, int] = field(default_factory=dict)  # per method: committed tokens when it was scored last
    committed: int = 0
    recent: tuple[int, ...] | None = None  # its last SAME_CONTEXT committed tokens (None: never told them)
    steps: int = 0
    hold_until: int = 0  # plan round before which the primary method is not switched
    draft_rates: dict[str, float] = field(default_factory=dict)  # share of steps with a draft, per method
    explore_at: int = 0  # plan round from which the request may explore again
    explore_gap: int = 0  # rounds to wait after its next exploration (doubles while they find nothing)
    drafts_seen: int = 0  # verified drafts of any method
    exploring: tuple[str, int] = ("", 0)  # (method, window) of an exploration still awaiting its first draft
    explore_seen: int = 0  # drafts_seen when it began
    explore_deadline: int = 0  # steps by which it gives up waiting
    shadow_to: float = 0.0  # plan round at which its current shadow period ends
    shadow_from: float = 0.0  # plan round from which its next one may start
    shadow_gap: int = 0  # rounds between the end of the next period and the one after (0: not yet set)
    shadow_start: float = 0.0  # plan round at which its current shadow period began
    period: dict[str, list[float]] = field(default_factory=dict)  # per method: [right, checked] this shadow period
    left: int = -1  # output tokens it may still generate (its max_tokens less its output; -1: not known)
    greedy: bool = False  # decoded at temperature 0


class FastestOfN:
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
        self.requests: dict[str, _Request] = {}
        self.peak_requests = 0
        # this round's drafts by (method, recent tokens, length, markov state): members, their summed counts
        self.round_drafts: dict[tuple, list[float]] = {}

    # ------------------------------------------------------------------ bookkeeping

    def add_request(self, request_id: str) -> None:
        self.requests.setdefault(request_id, _Request())
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
        """Whether ``method``, drafting for the request, had a draft for this step."""
        req = self.requests.get(request_id)
        if req is not None:
            rate = req.draft_rates.get(method, 1.0)
            req.draft_rates[method] = rate + (1 - self.decay) * (float(offered) - rate)

    def observe_limit(self, request_id: str, left: int, greedy: bool) -> None:
        """The request may still generate ``left`` output tokens (its max_tokens less its output so
        far; negative: not known) and is decoded greedily or not: what the closed-batch check needs
        (:meth:`_closed_batch`)."""
        req = self.requests.get(request_id)
        if req is not None:
            req.left, req.greedy = left, greedy

    def observe_commit(self, request_id: str, tokens: int, ids: list[int] | None = None) -> None:
        """The step committed ``tokens`` tokens for the request (``ids``: which, where known)."""
        req = self.requests.get(request_id)
        if req is not None:
            req.committed += tokens
            req.steps += 1
            if ids is not None:
                req.recent = ((req.recent or ()) + tuple(ids))[-SAME_CONTEXT:]

    # ------------------------------------------------------------------ choosing

    def _posterior(self, req: _Request, method: str) -> tuple[float, float]:
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
        a, b = self._posterior(self.requests.get(request_id, _Request()), method)
        return a / (a + b)

    def _exploit_p(self, req: _Request, method: str) -> float:
        """The acceptance the batch's windows are chosen on: the posterior mean less ``caution``
        standard deviations (the best of several noisy means is biased up, and a step that
        speculates where it does not pay costs every request); 0 while nothing at all is known
        of the method (the prior's 0.5 is a guess: only explorers act on it)."""
        if not req.arms.get(method, Acceptance()).weight and self.global_arms[method].weight < 1:
            return 0.0
        a, b = self._posterior(req, method)
        n = a + b
        return max(0.0, a / n - self.caution * math.sqrt(a * b / (n * n * (n + 1))))

    def _sample(self, req: _Request, method: str) -> float:
        """The acceptance the choice is made on: a posterior draw, an optimistic bound, or the mean."""
        a, b = self._posterior(req, method)
        if self.scheme == "thompson":
            return self.rng.betavariate(a, b)
        mean = a / (a + b)
        if self.scheme == "ucb":
            return min(1.0, mean + math.sqrt(2 * math.log(self.rounds + 2) / (a + b)))
        return mean

    def default_choice(self, batch: int) -> Choice:
        """For requests not seen yet: the best method by the global estimates, as if every
        request of the batch took it (off unless that beats plain decoding by ``min_gain``)."""
        steps = self.cost.at_batch(batch)
        plain = 1.0 / steps.decode if steps.decode > 0 else 0.0
        best = (0, plain, self.methods[0], 0.0)
        for method, arm in self.global_arms.items():
            if arm.weight < 1 or method in self.unready:  # nothing known yet (the first explorers will tell), or not ready
                continue
            p = (arm.successes + 1) / (arm.weight + 2)
            window, speed = self._rank(steps, p, method, 1.0)
            if window and speed > best[1]:
                best = (window, speed, method, p)
        window, speed, method, p = best
        if not window or speed < plain * (1 + self.min_gain):
            return Choice([], 0, self.decoupled, f"off: cold start, no method pays at batch {batch} "
                                                 f"(plain {plain:.1f} tok/s)")
        return Choice([method], window, self.decoupled,
                      f"cold start, best so far: {method} w={window} p={p:.2f} predicts {speed:.1f} tok/s "
                      f"(plain {plain:.1f})")

    def is_free(self, method: str, batch: int) -> bool:
        """A method whose drafting costs under 5% of a decode step rides along on every
        speculating request: the verifier takes its draft when it is the longest, and
        scores it either way (full information for the bandit at no cost)."""
        return self.cost.draft_s(method, batch) * self.max_window < 0.15 * self.cost.verify_s(batch, 1)

    def plan(self, batch: int | None = None, step: int | None = None) -> dict[str, Choice]:
        """A choice for every request (batch = how many are running; default all known; step =
        the verifier's step count, by which rounds pass while the caller plans rarely)."""
        batch = batch or len(self.requests) or 1
        before = self.rounds
        self.round_drafts.clear()
        self.rounds = max(self.rounds + 1, step / self.round_steps) if step is not None else self.rounds + 1
        steps = self.cost.at_batch(batch)
        methods = [m for m in self.methods if m not in self.unready]
        if not methods:
            self.replan_soon = False
            for rid in self.requests:
                self.primary[rid] = ""
            return {rid: Choice([], 0, self.decoupled, "off: no drafter is ready yet") for rid in self.requests}
        free = [m for m in methods if self.is_free(m, batch)]
        ranked: dict[str, list[tuple[float, str, int]]] = {}
        picked: list[tuple[str, str, float, float, float, str]] = []  # rid, method, p to exploit, draw, q, why
        for rid, req in self.requests.items():
            if self.primary.get(rid) == "" and rid not in self.shadowed:
                # off: nothing new is learnt of it, so its own evidence fades towards the global
                # estimate; or a request that was unlucky early would stay off, and finish last
                for arm in [*req.arms.values(), *req.runs.values(), *req.fresh.values()]:
                    arm.successes *= self.decay
                    arm.failures *= self.decay
            # the draw ranks the methods (Thompson), but a free method is scored on every speculating
            # step whichever method leads, so it needs no exploring: its mean ranks it. Whether and
            # how far to speculate is the batch's call, below.
            options = []
            for method in methods:
                q = req.draft_rates.get(method, 1.0)
                a, b = self._posterior(req, method)
                drawn = self._sample(req, method)
                window, speed = self._rank(steps, a / (a + b) if method in free else drawn, method, q)
                options.append((speed, method, window, self._exploit_p(req, method), drawn, q))
            options.sort(key=lambda o: o[0], reverse=True)
            ranked[rid] = [(o[0], o[1], o[2]) for o in options]
            best = options[0]
            why = "cold start" if not req.arms else "bandit"
            previous = self.primary.get(rid)
            if previous and previous != best[1]:
                kept = next((o for o in options if o[1] == previous), None)  # None: no longer ready
                # a switch costs the new drafter a Track (a model drafter prefills): hold a choice
                # for a few rounds, and switch only for a clearly better draw
                if kept is not None and kept[2] and (self.rounds < req.hold_until
                                                     or kept[0] * (1 + self.switch_margin) >= best[0]):
                    best = kept
                else:
                    why = f"switch from {previous}"
            picked.append((rid, best[1], best[3], best[4], best[5], why))

        # exploitation: the windows that maximise the batch's tokens/s at the cautious means
        exploit, exploit_speed, plain = self._allocate(steps, [(m, sure, q) for _, m, sure, _, q, _ in picked])
        closed = self._closed_batch(picked)
        held = closed is not None and any(exploit) \
            and not closed.sooner(exploit, [sure for _, _, sure, *_ in picked])
        if held:  # more tokens a second, but the batch would not be done sooner
            exploit, exploit_speed = [0] * len(picked), plain
        # exploration: a few requests the means leave off try their draw, if the batch's step can afford it
        eligible = [i for i, (rid, _, sure, drawn, _, _) in enumerate(picked)
                    if not exploit[i] and drawn > sure and self.rounds >= self.requests[rid].explore_at]
        windows, speed = exploit, exploit_speed
        explorers: set[int] = set()
        if not self.replan_soon:  # credit grows with the regular plans, not the follow-ups of explorations
            self.explore_credit = min(1.0, self.explore_credit + self.explore_budget * (self.rounds - before))
        if eligible:
            # a few at a time; but while a method is barely known, every request may (one step's
            # evidence then serves them all, and a large batch may need many rows to pay at all)
            cold = [i for i in eligible if self.global_arms[picked[i][1]].weight < self.pool_weight]
            warm = [i for i in eligible if i not in cold]
            cap = max(1, int(self.explore_share * len(picked)))
            chosen = set(cold) | set(self.rng.sample(warm, min(cap, len(warm))))
            entries = [(m, drawn if i in chosen else sure, q) for i, (_, m, sure, drawn, q, _) in enumerate(picked)]
            explore, explore_speed, _ = self._allocate(steps, entries)
            explorers = {i for i in chosen if explore[i]}
            if explorers and closed is not None and not closed.sooner(explore, [p for _, p, _ in entries]):
                # even should the draws be right the batch would not end sooner: nothing to learn
                explorers = set()
            exploit_s = self._step_s(steps, picked, exploit)
            # a short draft measures acceptance as well as a long one, and costs less should it be wrong
            explore = [min(w, self.explore_window) if i in explorers else w for i, w in enumerate(explore)]
            while explorers:  # the explorers' windows by their draws, everyone else's as exploitation has them
                windows = [explore[i] if i in explorers else exploit[i] for i in range(len(picked))]
                # what the step would cost more than the exploiting one, should the draws be wrong
                extra = (self._step_s(steps, picked, windows) / exploit_s - 1.0) * self.exploration_steps
                if extra <= self.explore_credit:
                    self.explore_credit -= max(extra, 0.0)
                    speed = explore_speed
                    break
                # over the credit: shorter windows first (a short draft still measures acceptance),
                # then fewer explorers, the least hopeful draw first
                longest = max(explorers, key=lambda i: explore[i])
                if explore[longest] > 1:
                    explore[longest] -= 1
                else:
                    explorers.discard(min(explorers, key=lambda i: picked[i][3]))
            else:
                windows = exploit
        self.replan_soon = bool(explorers)

        plan: dict[str, Choice] = {}
        windows = list(windows)
        shadowing = self.shadow and bool(free) and bool(self.peak_requests) \
            and len(self.requests) <= self.shadow_below * self.peak_requests
        self.shadowed = set()
        for i, (rid, method, sure, drawn, q, why) in enumerate(picked):
            req = self.requests[rid]
            window = windows[i]
            awaiting = req.exploring[1] and req.drafts_seen == req.explore_seen and req.steps < req.explore_deadline \
                and req.exploring[0] not in self.unready
            if i in explorers:
                gap = req.explore_gap or self.hold_rounds
                req.explore_at = self.rounds + gap
                req.explore_gap = min(2 * gap, self.max_explore_gap)
                req.exploring, req.explore_seen = (method, window), req.drafts_seen
                req.explore_deadline = req.steps + self.explore_steps
                why = "explore"
            elif not window and awaiting:  # its exploration's drafts are on their way: let them arrive
                (method, window), why = req.exploring, "explore (awaiting its first draft)"
                sure = drawn = req.arms.get(method, Acceptance()).mean
                explorers.add(i)
            else:
                req.exploring = ("", 0)
                if exploit[i]:
                    req.explore_gap = self.hold_rounds  # the mean pays: a later exploration starts afresh
            previous = self.primary.get(rid)
            if window and previous and previous != method:
                req.hold_until = self.rounds + self.hold_rounds
            if not window:
                why_off = "the batch would not finish sooner (every request may run to its limit)" if held \
                    else f"speculation does not pay at batch {batch}"
                choice = Choice([], 0, self.decoupled, f"off: {why_off} "
                                                       f"(best {method} p={sure:.2f}; plain {plain:.1f} tok/s)")
                if shadowing and self._shadow_period(req, free):
                    choice.methods = list(free)
                    choice.reason += f"; shadow-scoring {','.join(free)}"
                    self.shadowed.add(rid)
            else:
                req.shadow_gap = 0  # speculating: once off again, it is shadowed soon
                p = drawn if i in explorers else sure
                choice = Choice([method], window, self.decoupled,
                                f"{why}: {method} w={window} p={p:.2f}: batch {speed:.1f} tok/s "
                                f"(plain {plain:.1f})")
                riders = [m for m in free if m != method]
                choice.methods += riders
                if riders:
                    choice.reason += f" (+{','.join(riders)} free)"
            self.primary[rid] = method if window else ""
            plan[rid] = choice
        self.replan_soon = bool(explorers)  # awaiting ones too: plan again as soon as their drafts are in
        self.promising = any(self._period_right(self.requests[rid], m, SHADOW_EVIDENCE)
                             for rid in self.shadowed for m in plan[rid].methods)
        if self.racing and self.peak_requests and len(self.requests) <= self.racing_below * self.peak_requests:
            self._add_racers(plan, ranked, batch)
        return plan

    def is_quiet(self, plan: dict[str, Choice]) -> bool:
        """Whether the next plan may come ``DORMANT_SLOWDOWN`` times later: nothing in ``plan``
        drafts, and no shadowed request is :attr:`promising`. Shadowing alone does not count: at
        T=1 on 2 cores, planning every 4 steps through a tail where shadow scores turned nothing on
        was a quarter of the caller's CPU, which the verifier's forward lost (0.97x of autoregressive
        against 1.00x); a period whose scores come right makes the next plan come at once."""
        return not self.promising and not any(choice.window for choice in plan.values())

    def _shadow_period(self, req: _Request, free: list[str]) -> bool:
        """Whether an off request is shadowed now: periods of ``shadow_rounds`` rounds, the gaps
        between them doubling while it stays off. A period is judged by its own scores once a free
        method has ``SHADOW_EVIDENCE`` of them: one right nearly always (``shadow_keep``) goes on,
        since one committed token a step is all a request that is off can show, and a period's
        worth does not move its posterior enough to turn it on (a T=0 tail that repeated itself
        exactly stayed off at batch 12 for 50 steps); once a period has ``SHADOW_CHANGE`` such
        scores, the method's older misses are dropped (:meth:`_forget_another_text`). A period
        with fewer scores than ``SHADOW_EVIDENCE`` (live, drafts come 3-8 steps after the plan; and a
        plan that explores is followed by one a step later, each a round) is extended, up to
        ``SHADOW_WAIT`` periods in all: extended only until its first score, periods whose scores
        began in their last steps were judged on one or two, and the repeating tail waited out a
        16-step gap (drafted from step 150-154 against 99-134)."""
        self._forget_another_text(req, free)
        if self.rounds < req.shadow_to:
            return True
        if req.shadow_to and not any(req.period.get(m, (0, 0))[1] >= SHADOW_EVIDENCE for m in free) \
                and self.rounds < req.shadow_start + SHADOW_WAIT * self.shadow_rounds:
            req.shadow_to = self.rounds + self.shadow_rounds  # its scores are on their way
            return True
        kept = [m for m in free if self._period_right(req, m, SHADOW_EVIDENCE)]
        if req.shadow_to and kept:
            gap = self.shadow_gap
        elif self.rounds >= req.shadow_from:
            gap = req.shadow_gap or self.shadow_gap
        else:
            return False
        req.shadow_start, req.shadow_to = self.rounds, self.rounds + self.shadow_rounds
        req.shadow_from = req.shadow_to + gap
        req.shadow_gap = self.shadow_gap if kept else min(2 * gap, self.max_shadow_gap)
        req.period.clear()
        return True

    def _forget_another_text(self, req: _Request, free: list[str]) -> None:
        """Drop a method's older misses once the current shadow period has ``SHADOW_CHANGE`` scores
        of it, right ``shadow_keep`` of them: the request's text changed (it began repeating itself),
        and the misses were another text's. At once, not at the period's end: a period's first
        scores come a few steps after it began, and each step off costs the repeating rows their
        drafts."""
        for m in free:
            arm = req.arms.get(m)
            if arm is not None and self._period_right(req, m, SHADOW_CHANGE):
                right, checked = req.period[m]
                arm.failures = min(arm.failures, checked - right)

    def _period_right(self, req: _Request, method: str, scores: int) -> bool:
        """The current shadow period has at least ``scores`` of ``method``'s scores, and
        ``shadow_keep`` of them were right."""
        right, checked = req.period.get(method, (0.0, 0.0))
        return checked >= scores and right >= self.shadow_keep * checked

    def _rank(self, steps: StepCosts, p: float, method: str, q: float) -> tuple[int, float]:
        """A method's best (window, tokens/s) for one request at acceptance ``p``, every row alike:
        what the methods of a request are ranked by."""
        return steps.best_window(p, self.cost.draft_s(method, steps.batch), q, self.max_window,
                                 self.decoupled and method not in self.cost.shared_methods)

    def _drafting_s(self, rows: list[tuple[str, float, int, float]]) -> tuple[float, float, float]:
        """(coupled, decoupled, shared) drafting seconds of a step whose drafting rows are (method,
        p, window, draft rate): :func:`specactor.policy.drafting_tally.drafting_seconds`."""
        return drafting_seconds(self.cost, rows)

    def _latency(self, verify: float, coupled: float, decoupled: float, shared: float) -> float:
        """Seconds of a step. Decoupled (the default), the verifier never waits for a
        drafter: drafting hides behind the verify step unless the drafter, redrafting what
        rollbacks discard, cannot keep up, and then the step makes what a step that long would (live
        it verifies the shorter drafts that are ready). Coupled (an engine configured so), the
        verifier waits for the drafts: their time adds to the step. Choosing coupled per step was
        tried: the replays on GPU shapes never took it, and live a coupled model drafter ran 0.65x
        where a decoupled one ran 0.95x (bench/RESULTS.md, issue 4). A decoupled drafter on the
        verifier's own hardware (``shared``) adds its time to the step's all the same."""
        return iteration_s(verify, decoupled, shared) if self.decoupled else iteration_s(verify, added=coupled)

    def _step_s(self, steps: StepCosts, picked: list[tuple[str, str, float, float, float, str]],
                windows: list[int]) -> float:
        """Predicted seconds of the step where request i of ``picked`` drafts ``windows[i]`` (at
        its cautious acceptance)."""
        fed, rows = float(steps.batch), 0.0
        drafting = []
        for (_, method, sure, _, q, _), w in zip(picked, windows):
            if w:
                fed, rows = fed + q * w, rows + q
                drafting.append((method, sure, w, q))
        return self._latency(steps.verify(fed, rows), *self._drafting_s(drafting))

    def _plan_step_s(self, plan: dict[str, Choice], batch: int, fed: float | None = None) -> float:
        """Seconds of the step a plan makes: every method of a speculating request
        drafts its window, at the request's cautious acceptance for that method; ``fed``: the
        tokens verified, where the caller knows better than the primary method's window."""
        rows, drafting = 0.0, []
        verified = float(batch)
        for rid, choice in plan.items():
            req = self.requests.get(rid)
            if not choice.window or req is None:
                continue
            q = req.draft_rates.get(choice.methods[0], 1.0)
            verified, rows = verified + q * choice.window, rows + q
            drafting += [(m, self._exploit_p(req, m), choice.window, req.draft_rates.get(m, 1.0)) for m in choice.methods]
        verify = self.cost.verify_rows_s(batch, verified if fed is None else fed, rows)
        return self._latency(verify, *self._drafting_s(drafting))

    def _allocate(self, steps: StepCosts,
                  entries: list[tuple[str, float, float]]) -> tuple[list[int], float, float]:
        """Windows (0 = off) for requests ``(method, acceptance, draft rate)`` that maximise the
        batch's predicted tokens per second, every request's draft tokens fed to one step;
        returns (windows, that speed, plain decoding's speed). All off unless speculation beats
        plain decoding by ``min_gain``.

        A step's cost is not additive (the first drafting row pays a fixed cost alone), so the
        search first tries, for each window w, the k requests of highest acceptance speculating
        with w (every k), then refines each request's window with the others fixed.
        """
        n, batch, top = len(entries), steps.batch, self.max_window
        windows = [0] * n
        if n == 0:
            return windows, 0.0, 0.0
        gains = [[q * (e - 1.0) for e in progress_by_window(p, top)] for _, p, q in entries]
        # drafting time matters only for methods whose drafting can outlast a verify step (decoupled,
        # its whole lookahead redrafted) or add more than 1% to it (coupled, or on the verifier's hardware)
        def costly_method(m: str) -> bool:
            if self.decoupled and m not in self.cost.shared_methods:
                return self.cost.draft_s(m, batch) * decoupled_lookahead(top) > steps.decode
            return self.cost.draft_s(m, batch) * top > 0.01 * steps.decode

        costly = {m for m, _, _ in entries if costly_method(m)}
        # the costly rows' drafting time, kept as windows move (recomputing it from every row made
        # a plan O(rows^2): 0.8 s at batch 256 on a 7B GPU profile)
        tally = self.tally_class(self.cost, entries, costly, top) if costly else None
        base_fed = float(max(batch, n))
        state = {"progress": float(n), "fed": base_fed, "rows": 0.0}

        def speed() -> float:
            verify = steps.verify(state["fed"], state["rows"])
            latency = verify if tally is None else self._latency(verify, *tally.seconds())
            return state["progress"] / latency if latency > 0 else 0.0

        def setw(i: int, w: int) -> None:
            old, q = windows[i], entries[i][2]
            state["progress"] += gains[i][w] - gains[i][old]
            state["fed"] += q * (w - old)
            state["rows"] += q * ((w > 0) - (old > 0))
            windows[i] = w
            if tally is not None:
                tally.move(i, old, w)

        plain = speed()
        order = sorted(range(n), key=lambda i: (-entries[i][1], -entries[i][2]))
        useful = [useful_window(entries[i][1], top) for i in order]  # non-increasing along order
        best_speed, best_w, best_k = plain, 0, 0
        sweep = WindowSweep(steps, self.cost, entries, order, gains, costly, base_fed, self.decoupled) \
            if self.vectorized_sweep else None
        for w in range(1, top + 1):
            # only requests whose w-th draft token has a real chance (see useful_window): the rest
            # would pay w tokens for what a shorter window buys them, tried at that window
            reach = sum(u >= w for u in useful)
            if not reach:
                break
            if sweep is not None:  # every k at once (numpy): the same speeds as one at a time
                for k, s in enumerate(sweep.speeds(w, reach), 1):
                    if s > best_speed * (1 + 1e-12):
                        best_speed, best_w, best_k = s, w, k
                continue
            for k, i in enumerate(order[:reach], 1):
                setw(i, w)
                s = speed()
                if s > best_speed * (1 + 1e-12):
                    best_speed, best_w, best_k = s, w, k
            for i in order[:reach]:
                setw(i, 0)
        for i in order[:best_k]:
            setw(i, best_w)
        for i in order:  # one pass of coordinate ascent: each request's own window, the others fixed
            current = windows[i]
            for w in sorted({0, max(current - 1, 0), min(current + 1, top), best_w or 1}):
                if w == current:
                    continue
                setw(i, w)
                s = speed()
                if s > best_speed * (1 + 1e-12):
                    best_speed, current = s, w
                setw(i, current)
        if best_speed < plain * (1 + self.min_gain):
            return [0] * n, plain, plain
        return list(windows), best_speed, plain

    def _closed_batch(self, picked: list[tuple[str, str, float, float, float, str]]) -> ClosedBatch | None:
        """The check that a plan brings the batch's end nearer, every request assumed to run to its
        limit (:class:`specactor.policy.makespan.ClosedBatch`); None where that cannot be judged (the
        check is off, a request's limit is not known) or need not be: a batch with a greedy request
        keeps the tokens-per-second objective alone (a greedy sample that runs long repeats itself,
        and drafts predict it: the allocation finds it), and so does one with requests waiting for a
        slot (the batch is not closed yet: a request that finishes early lets the next one in, and
        tokens per second are the rollout's speed)."""
        if not self.closed_batch or self.waiting:
            return None
        lefts = []
        for rid, *_ in picked:
            req = self.requests[rid]
            if req.left < 0 or req.greedy:
                return None
            lefts.append(max(1, req.left))
        return ClosedBatch(self.cost, lefts, [q for _, _, _, _, q, _ in picked], self.min_gain)

    def _progress(self, rid: str, choice: Choice) -> tuple[float, int]:
        """Expected progress per step and tokens fed for one request's choice."""
        if not choice.methods:
            return 1.0, 1
        ps = [self.estimate(rid, m) for m in choice.methods]
        if choice.race:
            return race_progress(ps, choice.window), 1 + choice.window * len(choice.methods)
        return expected_progress(ps[0], choice.window), 1 + choice.window  # one draft verified

    def _add_racers(self, plan: dict[str, Choice], ranked: dict[str, list[tuple[float, str, int]]],
                    batch: int) -> None:
        """Tail: the slowest requests get their methods raced (every draft verified as a
        token tree) and their next-best method added, on drafters with room, wherever
        the cost model says the step's throughput rises."""
        capacity = max(1, self.peak_requests)  # requests each drafter served at the peak
        fed = 0
        serving = Counter(m for choice in plan.values() for m in choice.methods)  # requests per drafter
        progress: dict[str, float] = {}
        for rid, choice in plan.items():
            progress[rid], tokens = self._progress(rid, choice)
            fed += tokens
        total = sum(progress.values())
        step = self._plan_step_s(plan, batch, fed)
        left = f"{len(self.requests)} of {self.peak_requests} left"
        for rid in sorted(plan, key=progress.__getitem__):
            choice = plan[rid]
            if not choice.window:  # off (or only shadowed): nothing to race
                continue
            trials = []
            if len(choice.methods) > 1 and not choice.race:
                trials.append((Choice(list(choice.methods), choice.window, choice.decoupled, choice.reason, True),
                               None))
            for _, method, window in ranked[rid][1:]:
                if window and serving[method] < capacity and method not in choice.methods \
                        and len(choice.methods) < self.max_racers:
                    trials.append((Choice(choice.methods + [method], max(choice.window, window), choice.decoupled,
                                          choice.reason, True), method))
                    break
            for trial, added in trials:
                gain_progress, trial_fed = self._progress(rid, trial)
                _, old_fed = self._progress(rid, choice)
                new_fed = fed - old_fed + trial_fed
                new_step = self._plan_step_s({**plan, rid: trial}, batch, new_fed)
                new_total = total - progress[rid] + gain_progress
                if new_total / new_step <= (1 + self.min_gain) * total / step:  # racing must pay, as speculating must
                    continue
                trial.reason += f"; tail: racing {'+'.join(trial.methods)} ({left})"
                plan[rid] = choice = trial
                fed, step, total = new_fed, new_step, new_total
                if added is not None:
                    serving[added] += 1
                progress[rid] = gain_progress
