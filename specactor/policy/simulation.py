"""A deterministic rollout simulator for testing and benchmarking policies fast.

Requests have a length and a true per-token acceptance per method (optionally
changing half-way); drafters have the cost model's drafting time; a verify
step costs what the simulator's own cost model (the "true" clock: pass a
different instance, or another profile, from the policy's) says for the tokens
it is fed and the rows that verify drafts. A policy with a ``cost`` model of its
own has it corrected online from the true step times, as the PolicyActor does;
``plan_every`` re-plans every that many steps (and after a step where the
policy says ``replan_soon``), as the PolicyActor does, and ``dormant`` times
less often while the last plan was quiet (every request off, no shadow period
looking right: ``FastestOfN.is_quiet``; for other policies, none shadow-scored),
the PolicyActor's cadence then. A policy is anything with ``add_request /
remove_request / observe / observe_commit / plan(batch)`` (``FastestOfN``, or
the fixed and random baselines below). The
simulator draws accepted lengths from the truncated geometric law the cost
model assumes, with its own seeded generator, so two policies run on the same
seed see the same workload. A request with several methods commits the best
of their drafts when racing (all verified, at the cost of their tokens), and
the longest draft's otherwise, the primary's on a tie (the others are only
scored: full information), as the verifier does. Drafting runs beside the
verify step when every request's drafts are decoupled, after it otherwise; a
decoupled drafter drafts, for each request, its whole lookahead again after a
step that cut it, the tokens the step used after one that kept it, and one
lookup where it had no draft.

A request is anything with ``request_id``, ``length``, ``draft``, ``commit`` and ``tokens``, and
optionally ``limit`` and ``greedy``, which the policy is told as the verifier tells it (its
max_tokens; None: not told) (:class:`SimRequest` here; :class:`specactor.bench.replay_workload.ReplayRequest`
replays a finished rollout's own tokens through the real drafters, whose
acceptance is not geometric).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from specactor.speculation import SHADOW_STRIDE, decoupled_lookahead
from specactor.policy.bandit_state import Choice, is_dormant
from specactor.policy.cost_model import CostModel


@dataclass
class SimRequest:
    request_id: str
    length: int
    acceptance: dict[str, float]
    #: from this many committed tokens on, ``acceptance_after`` holds
    switch_at: int | None = None
    acceptance_after: dict[str, float] = field(default_factory=dict)
    #: the most tokens it may have, as the policy is told (its max_tokens; None: not told); ``length``
    #: is how many it does have, which the policy is never told
    limit: int | None = None
    greedy: bool = False

    def p(self, method: str, committed: int) -> float:
        if self.switch_at is not None and committed >= self.switch_at:
            return self.acceptance_after.get(method, 0.0)
        return self.acceptance.get(method, 0.0)

    def draft(self, method: str, committed: int, window: int, rng: random.Random) -> tuple[int, int]:
        """(drafted, accepted) of ``method``'s draft of ``window`` tokens after ``committed`` tokens."""
        return window, accepted_length(rng, self.p(method, committed), window)

    def commit(self, committed: int, tokens: int) -> None:
        """The step committed ``tokens`` after ``committed``: nothing to remember here."""

    def tokens(self, start: int, count: int) -> list[int] | None:
        """Its draws have no text: the policy is told none."""
        return None


class Request(Protocol):
    request_id: str
    length: int

    def draft(self, method: str, committed: int, window: int, rng: random.Random) -> tuple[int, int]: ...
    def commit(self, committed: int, tokens: int) -> None: ...
    def tokens(self, start: int, count: int) -> list[int] | None: ...


class Policy(Protocol):
    def add_request(self, request_id: str) -> None: ...
    def remove_request(self, request_id: str) -> None: ...
    def observe(self, request_id: str, method: str, drafted: int, accepted: int) -> None: ...
    def observe_commit(self, request_id: str, tokens: int, ids: list[int] | None = None) -> None: ...
    def plan(self, batch: int | None = None, step: int | None = None) -> dict[str, Choice]: ...


class _Baseline:
    def __init__(self) -> None:
        self.requests: set[str] = set()

    def add_request(self, request_id: str) -> None:
        self.requests.add(request_id)

    def remove_request(self, request_id: str) -> None:
        self.requests.discard(request_id)

    def observe(self, request_id: str, method: str, drafted: int, accepted: int) -> None:
        pass

    def observe_commit(self, request_id: str, tokens: int, ids: list[int] | None = None) -> None:
        pass


class PlainPolicy(_Baseline):
    """No speculation at all: the autoregressive baseline."""

    def plan(self, batch: int | None = None, step: int | None = None) -> dict[str, Choice]:
        return {}


class FixedPolicy(_Baseline):
    """One method with one window for every request (the coupled baselines)."""

    def __init__(self, method: str, window: int = 4, decoupled: bool = True) -> None:
        super().__init__()
        self.choice = (method, window, decoupled)

    def plan(self, batch: int | None = None, step: int | None = None) -> dict[str, Choice]:
        method, window, decoupled = self.choice
        return {r: Choice([method], window, decoupled, "fixed") for r in self.requests}


class RandomPolicy(_Baseline):
    """A uniformly random method per request and step."""

    def __init__(self, methods: list[str], window: int = 4, seed: int = 0) -> None:
        super().__init__()
        self.methods, self.window, self.rng = methods, window, random.Random(seed)

    def plan(self, batch: int | None = None, step: int | None = None) -> dict[str, Choice]:
        return {r: Choice([self.rng.choice(self.methods)], self.window, True, "random") for r in self.requests}


@dataclass
class SimResult:
    makespan_s: float
    steps: int
    tokens: int
    #: (step, request id, primary method) for every request at every step
    choices: list[tuple[int, str, str]]
    finish_s: dict[str, float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.makespan_s if self.makespan_s else 0.0


def accepted_length(rng: random.Random, p: float, window: int) -> int:
    """Draw from the truncated geometric law: P(a) = p^a (1-p) for a < w."""
    a = 0
    while a < window and rng.random() < p:
        a += 1
    return a


def _drafted_ahead(last: str | None, window: int) -> int:
    """Tokens a decoupled drafter drafts for a request this step, by what the last verdict left of
    its lookahead: the whole lookahead after a cut (or before its first draft), the ``window + 1``
    the step used after a draft right to its end, one lookup after a step it had no draft for
    (:func:`specactor.policy.cost_model.decoupled_work` is the policy's expectation of this)."""
    if not window:
        return 0
    return {"kept": window + 1, "none": 1}.get(last or "", decoupled_lookahead(window))


class Simulator:
    def __init__(self, cost: CostModel, seed: int = 0, plan_every: int = 1, lag: int = 0,
                 reported: float = 1.0, dormant: int = 1) -> None:
        """``lag``: steps before a plan takes effect. Live it is about 2: the verifier steps on while
        the policy plans, applies the plan between steps, and the drafters' first drafts reach
        the step after that. ``reported``: the share of a step's time its report tells the policy
        (1: the truth; a graphed GPU step timed by the host's clock told its launch only, ~0.03).
        ``dormant``: how many times less often it plans while the last plan was quiet (live: the
        PolicyActor's ``DORMANT_SLOWDOWN``)."""
        self.cost = cost
        self.seed = seed
        self.plan_every = max(1, plan_every)
        self.lag = max(0, lag)
        self.reported = reported
        self.dormant = max(1, dormant)

    def run(self, requests: list[Request], policy: Policy, max_steps: int = 100_000) -> SimResult:
        rng = random.Random(self.seed)
        committed = {r.request_id: 0 for r in requests}
        by_id = {r.request_id: r for r in requests}
        # (limit, greedy) of the requests whose limit the policy is told, as the verifier tells it
        limits = {r.request_id: (r.limit, getattr(r, "greedy", False)) for r in requests if getattr(r, "limit", None)}
        tell = getattr(policy, "observe_limit", None) if limits else None
        for r in requests:
            policy.add_request(r.request_id)
            if tell is not None and r.request_id in limits:
                tell(r.request_id, *limits[r.request_id])
        learner = getattr(policy, "cost", None)
        learner = learner if isinstance(learner, CostModel) and learner is not self.cost else None
        offer = getattr(policy, "observe_offer", None)
        clock, steps, choices, finish = 0.0, 0, [], {}
        plan: dict[str, Choice] = {}
        pending: list[tuple[int, dict[str, Choice]]] = []  # (step it takes effect, plan)
        lookahead: dict[tuple[str, str], str] = {}  # (request, method) -> what its last draft's verdict left
        shadow_run: dict[tuple[str, str], bool] = {}  # (request, method) shadowed: its last score was right
        every = self.plan_every
        while committed and steps < max_steps:
            batch = len(committed)
            if steps % every == 0 or getattr(policy, "replan_soon", False):
                made = policy.plan(batch, step=steps)
                pending.append((steps + self.lag, made))
                quiet = policy.is_quiet(made) if hasattr(policy, "is_quiet") else is_dormant(made)
                every = self.plan_every * (self.dormant if quiet else 1)
            while pending and pending[0][0] <= steps:
                plan = {**plan, **pending.pop(0)[1]}
            now = {rid: plan.get(rid) or Choice([], 0, True) for rid in committed}
            # every method's draft, scored against what the request commits; a shadowed request (window 0)
            # has one committed token score its drafts' first, on the steps where it has a draft: live,
            # its drafter drafts on every SHADOW_STRIDE steps' verdicts, and a draft that stays right
            # is scored on each step until the next (a skipped step is None: no score at all)
            drafts = {rid: [by_id[rid].draft(m, committed[rid], choice.window or 1, rng)
                            if choice.window or steps % SHADOW_STRIDE == 0 or shadow_run.get((rid, m)) else None
                            for m in choice.methods]
                      for rid, choice in now.items()}
            fed = rows = 0
            coupled: dict[str, tuple[int, int]] = {}  # method -> (requests, longest window)
            ahead: dict[str, tuple[int, int]] = {}  # method -> (requests, most a decoupled drafter drafts)
            decoupled = True
            for rid, choice in now.items():
                decoupled &= choice.decoupled
                if choice.window:  # racing verifies every draft; otherwise the verifier takes the longest
                    lengths = [d for d, _ in drafts[rid]]
                    verified = sum(lengths) if choice.race else max(lengths, default=0)
                    fed += verified
                    rows += verified > 0
                fed += 1
                for m in choice.methods:
                    n, w = coupled.get(m, (0, 0))
                    coupled[m] = (n + 1, max(w, choice.window))
                    n, w = ahead.get(m, (0, 0))
                    ahead[m] = (n + 1, max(w, _drafted_ahead(lookahead.get((rid, m)), choice.window)))
            step = self.cost.step_s(batch, fed, ahead if decoupled else coupled, decoupled, rows)
            clock += step
            steps += 1
            if learner is not None:
                learner.observe_step(batch, fed, self.reported * self.cost.verify_rows_s(batch, fed, rows), rows=rows)
            for rid, choice in now.items():
                req, done = by_id[rid], committed[rid]
                choices.append((steps, rid, choice.methods[0] if choice.methods and choice.window else ""))
                best, longest = 0, 0
                for m, draft in zip(choice.methods, drafts[rid]):
                    if draft is None:
                        continue
                    drafted, accepted = draft
                    if choice.window:
                        lookahead[(rid, m)] = "none" if not drafted else "kept" if accepted >= drafted else "cut"
                    else:
                        shadow_run[(rid, m)] = 0 < drafted <= accepted
                    if offer is not None and choice.window:  # live, shadowed steps say nothing of the rate
                        offer(rid, m, drafted > 0)
                    policy.observe(rid, m, drafted, accepted)
                    if choice.window and (choice.race or drafted > longest):
                        best = max(best, accepted) if choice.race else accepted
                        longest = max(longest, drafted)
                gained = min(best + 1, req.length - done)
                req.commit(done, gained)
                committed[rid] = done + gained
                policy.observe_commit(rid, gained, req.tokens(done, gained))
                if tell is not None and rid in limits:
                    limit, greedy = limits[rid]
                    tell(rid, limit - committed[rid], greedy)
                if committed[rid] >= req.length:
                    del committed[rid]
                    finish[rid] = clock
                    policy.remove_request(rid)
        return SimResult(clock, steps, sum(r.length for r in requests), choices, finish)
