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

Methods that cost almost nothing to run (prompt lookup, suffix matching) ride
along on every speculating request: the verifier verifies the longest draft
and scores the others, so their acceptance is known at no cost. Switches, and
turning speculation back on, are held for a few rounds: a switch costs the new
drafter a Track, and exploration must not keep a compute-bound batch drafting.

Tail racing: once requests have finished and drafters have room, the slowest
requests (lowest expected progress per step) get the next-best methods as well;
the verifier verifies all candidates in one forward as a token tree and keeps
the longest accepted.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from specactor.policy.cost_model import CostModel, expected_progress, race_progress


SCHEMES = ("thompson", "ucb", "greedy")


@dataclass
class Acceptance:
    """Discounted Beta counts of per-token acceptance."""

    successes: float = 0.0
    failures: float = 0.0

    def observe(self, drafted: int, accepted: int, decay: float) -> None:
        if drafted <= 0:
            return
        self.successes = self.successes * decay + accepted
        self.failures = self.failures * decay + (1 if accepted < drafted else 0)

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


@dataclass
class _Request:
    arms: dict[str, Acceptance] = field(default_factory=dict)
    committed: int = 0
    steps: int = 0
    hold_until: int = 0  # plan round before which the primary method is not switched
    draft_rates: dict[str, float] = field(default_factory=dict)  # share of steps with a draft, per method


class FastestOfN:
    """The decision logic, free of messaging: the PolicyActor and the simulator share it."""

    def __init__(self, methods: list[str], cost: CostModel, *, max_window: int = 8, decoupled: bool = True,
                 decay: float = 0.9, prior_weight: float = 2.0, racing: bool = True, max_racers: int = 3,
                 racing_below: float = 0.5, scheme: str = "thompson", switch_margin: float = 0.1,
                 hold_rounds: int = 8, seed: int = 0) -> None:
        if not methods:
            raise ValueError("FastestOfN needs at least one drafting method")
        if scheme not in SCHEMES:
            raise ValueError(f"unknown bandit scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        self.scheme = scheme
        self.rounds = 0
        self.switch_margin = switch_margin
        self.hold_rounds = hold_rounds
        self.primary: dict[str, str] = {}  # request id -> method chosen last time (switching has a cost)
        self.methods = list(methods)
        self.cost = cost
        self.max_window = max_window
        self.decoupled = decoupled
        self.decay = decay
        self.prior_weight = prior_weight
        self.racing = racing
        self.max_racers = max(1, max_racers)
        self.racing_below = racing_below
        self.rng = random.Random(seed)
        self.global_arms = {m: Acceptance() for m in methods}
        self.requests: dict[str, _Request] = {}
        self.peak_requests = 0

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
        self.global_arms[method].observe(drafted, accepted, 0.995)
        req = self.requests.get(request_id)
        if req is not None:
            req.arms.setdefault(method, Acceptance()).observe(drafted, accepted, self.decay)

    def observe_offer(self, request_id: str, method: str, offered: bool) -> None:
        """Whether ``method``, drafting for the request, had a draft for this step."""
        req = self.requests.get(request_id)
        if req is not None:
            rate = req.draft_rates.get(method, 1.0)
            req.draft_rates[method] = rate + (1 - self.decay) * (float(offered) - rate)

    def observe_commit(self, request_id: str, tokens: int) -> None:
        req = self.requests.get(request_id)
        if req is not None:
            req.committed += tokens
            req.steps += 1

    # ------------------------------------------------------------------ choosing

    def _posterior(self, req: _Request, method: str) -> tuple[float, float]:
        """Beta(a, b) for ``method`` on ``req``: own discounted counts + global prior."""
        glob = self.global_arms[method]
        prior_mean = (glob.successes + 1) / (glob.weight + 2)  # never certain, even from one draft
        own = req.arms.get(method, Acceptance())
        a = own.successes + self.prior_weight * prior_mean + 0.5
        b = own.failures + self.prior_weight * (1 - prior_mean) + 0.5
        return a, b

    def estimate(self, request_id: str, method: str) -> float:
        a, b = self._posterior(self.requests.get(request_id, _Request()), method)
        return a / (a + b)

    def _sample(self, req: _Request, method: str) -> float:
        """The acceptance the choice is made on: a posterior draw, an optimistic bound, or the mean."""
        a, b = self._posterior(req, method)
        if self.scheme == "thompson":
            return self.rng.betavariate(a, b)
        mean = a / (a + b)
        if self.scheme == "ucb":
            return min(1.0, mean + math.sqrt(2 * math.log(self.rounds + 2) / (a + b)))
        return mean

    def _score(self, p: float, method: str, batch: int, q: float = 1.0) -> tuple[int, float, bool]:
        """Best (window, tokens/s, decoupled) for ``method`` at acceptance ``p``.

        Decoupled unless drafting costs real time and most of the lookahead
        would be thrown away (the whole window survives with probability p**w):
        then coupled mode, which drafts only after each verdict, spends less
        of the drafter that the other requests share.
        """
        window, speed = self.cost.best_window(p, method, batch, self.decoupled, self.max_window, q)
        if self.decoupled and window and p ** window < 0.2 and \
                window * self.cost.draft_s(method, batch) > 0.1 * self.cost.verify_s(batch, window + 1):
            window, speed = self.cost.best_window(p, method, batch, False, self.max_window, q)
            return window, speed, False
        return window, speed, self.decoupled

    def _choice(self, method: str, window: int, speed: float, decoupled: bool, batch: int, why: str) -> Choice:
        if window == 0:
            base = self.cost.tokens_per_s(0.0, 0, method, batch, self.decoupled)
            return Choice([], 0, self.decoupled, f"off: no method pays at batch {batch} (best {method} "
                                                 f"{speed:.1f} tok/s = plain decoding {base:.1f})")
        return Choice([method], window, decoupled, f"{why}: {method} w={window} predicts {speed:.1f} tok/s")

    def default_choice(self, batch: int) -> Choice:
        """For requests not seen yet: the best method by the global estimates."""
        best = max(((self._score((a.successes + 1) / (a.weight + 2), m, batch), m)
                    for m, a in self.global_arms.items()), key=lambda x: x[0][1])
        (window, speed, decoupled), method = best
        return self._choice(method, window, speed, decoupled, batch, "cold start, best so far")

    def is_free(self, method: str, batch: int) -> bool:
        """A method whose drafting costs under 5% of a decode step rides along on every
        speculating request: the verifier takes its draft when it is the longest, and
        scores it either way (full information for the bandit at no cost)."""
        return self.cost.draft_s(method, batch) * self.max_window < 0.15 * self.cost.verify_s(batch, 1)

    def plan(self, batch: int | None = None) -> dict[str, Choice]:
        """A choice for every request (batch = how many are running; default all known)."""
        batch = batch or len(self.requests) or 1
        self.rounds += 1
        free = [m for m in self.methods if self.is_free(m, batch)]
        plan: dict[str, Choice] = {}
        ranked: dict[str, list[tuple[float, str, int]]] = {}
        for rid, req in self.requests.items():
            options = []
            for method in self.methods:
                # the draw ranks the methods; the window follows the posterior mean, so it does not
                # flap, unless the mean says "off" and the draw says "on": then it explores
                q = req.draft_rates.get(method, 1.0)
                drawn_window, speed, drawn_decoupled = self._score(self._sample(req, method), method, batch, q)
                a, b = self._posterior(req, method)
                window, mean_speed, decoupled = self._score(a / (a + b), method, batch, q)
                if not window:
                    window, decoupled = drawn_window, drawn_decoupled
                options.append((speed, method, window, decoupled, mean_speed))
            options.sort(key=lambda o: o[0], reverse=True)
            ranked[rid] = [(o[0], o[1], o[2]) for o in options]
            speed, method, window, decoupled, mean_speed = options[0]
            why = "cold start" if not req.arms else "bandit"
            previous = self.primary.get(rid)
            if previous == "":
                # speculation was off: turning it back on is a switch too, held and with a margin,
                # or exploration draws would keep a large, compute-bound batch speculating
                plain = self.cost.tokens_per_s(0.0, 0, method, batch, self.decoupled)
                if window and (self.rounds < req.hold_until or speed < plain * (1 + self.switch_margin)):
                    window = 0
                elif window:
                    why = "back on"
                    req.hold_until = self.rounds + self.hold_rounds
            elif previous and not window:
                req.hold_until = self.rounds + self.hold_rounds
            elif previous is not None and previous != method:
                kept = next(o for o in options if o[1] == previous)
                # a switch costs the new drafter a Track (a model drafter prefills): hold a choice
                # for a few rounds, and switch only for a clearly better draw
                if kept[2] and (self.rounds < req.hold_until or kept[0] * (1 + self.switch_margin) >= speed):
                    speed, method, window, decoupled, mean_speed = kept
                else:
                    why = f"switch from {previous}"
                    req.hold_until = self.rounds + self.hold_rounds
            choice = self._choice(method, window, speed, decoupled, batch, why)
            self.primary[rid] = method if window else ""
            if window:
                riders = [m for m in free if m != method]
                choice.methods += riders
                if riders:
                    choice.reason += f" (+{','.join(riders)} free)"
            plan[rid] = choice
        if self.racing and self.peak_requests and len(self.requests) <= self.racing_below * self.peak_requests:
            self._add_racers(plan, ranked, batch)
        return plan

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
        drafting: dict[str, tuple[int, int]] = {}
        progress: dict[str, float] = {}
        for rid, choice in plan.items():
            progress[rid], tokens = self._progress(rid, choice)
            fed += tokens
            for m in choice.methods:
                n, w = drafting.get(m, (0, 0))
                drafting[m] = (n + 1, max(w, choice.window))
        total = sum(progress.values())
        step = self.cost.step_s(batch, fed, drafting, self.decoupled)
        left = f"{len(self.requests)} of {self.peak_requests} left"
        for rid in sorted(plan, key=progress.__getitem__):
            choice = plan[rid]
            if not choice.methods:
                continue
            trials = []
            if len(choice.methods) > 1 and not choice.race:
                trials.append((Choice(list(choice.methods), choice.window, choice.decoupled, choice.reason, True),
                               None))
            for _, method, window in ranked[rid][1:]:
                n, _ = drafting.get(method, (0, 0))
                if window and n < capacity and method not in choice.methods \
                        and len(choice.methods) < self.max_racers:
                    trials.append((Choice(choice.methods + [method], max(choice.window, window), choice.decoupled,
                                          choice.reason, True), method))
                    break
            for trial, added in trials:
                gain_progress, trial_fed = self._progress(rid, trial)
                _, old_fed = self._progress(rid, choice)
                trial_drafting = dict(drafting)
                if added is not None:
                    n, w = drafting.get(added, (0, 0))
                    trial_drafting[added] = (n + 1, max(w, trial.window))
                new_fed = fed - old_fed + trial_fed
                new_step = self.cost.step_s(batch, new_fed, trial_drafting, self.decoupled)
                new_total = total - progress[rid] + gain_progress
                if new_total / new_step <= total / step:
                    continue
                trial.reason += f"; tail: racing {'+'.join(trial.methods)} ({left})"
                plan[rid] = choice = trial
                drafting, fed, step, total = trial_drafting, new_fed, new_step, new_total
                progress[rid] = gain_progress
