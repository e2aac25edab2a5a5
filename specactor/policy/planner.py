"""The Fastest-of-N plan: for every running request, which methods draft and how far.

:class:`Planner` is the planning half of :class:`specactor.policy.bandit.FastestOfN`
(the other half keeps the posteriors; its module docstring describes the policy as
a whole). A plan is made in three passes over the batch: each request ranks the
methods by its Thompson draw (:meth:`Planner._rank_methods`); the batch's windows
are the ones that maximise its predicted tokens per second at the cautious means,
with a few requests exploring their draws where the credit of step time allows
(:meth:`Planner._batch_windows`); and each request's :class:`Choice` is written,
off requests shadow-scored in the tail (:meth:`Planner._choices`). Racers are added
last for the slowest tail requests.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from specactor.policy.bandit_state import SHADOW_CHANGE, SHADOW_EVIDENCE, SHADOW_WAIT, Acceptance, Choice, \
    RequestState
from specactor.policy.cost_model import (StepCosts, expected_progress, iteration_s, progress_by_window,
                                         race_progress, useful_window)
from specactor.policy.drafting_tally import drafting_seconds
from specactor.policy.makespan import ClosedBatch
from specactor.policy.window_sweep import WindowSweep
from specactor.speculation import decoupled_lookahead


#: a request's pick: (request id, method, p to exploit, draw, draft rate, why)
Picked = tuple[str, str, float, float, float, str]


#: an exploration of a model copy verifies up to this many of its tokens (see Planner._explore_window)
COPY_EXPLORE_WINDOW = 4
#: a drafter's measured feeding time times this is what an exploration waits for: feeding long contexts
#: beside a running verifier took 1.2-1.5x the profile's figure (prompt of 128 tokens, alone)
FEED_MARGIN = 1.5


@dataclass
class BatchWindows:
    """The batch's windows, request by request in plan order, and what they were chosen from."""

    windows: list[int]  # what each request verifies (0: off)
    exploit: list[int]  # what the cautious means alone would have given it
    explorers: set[int]  # requests exploring their draws (an exploration awaiting its draft joins later)
    speed: float  # the batch's predicted tokens/s with these windows
    plain: float  # ... and without speculation
    held: bool  # the means would speculate, but the batch would not be done sooner


class Planner:
    """Plans for :class:`~specactor.policy.bandit.FastestOfN`, whose settings and state it reads."""

    def default_choice(self, batch: int) -> Choice:
        """For requests not seen yet: the best method by the global estimates, as if every
        request of the batch took it (off unless that beats plain decoding by ``min_gain``)."""
        steps = self.cost.at_batch(batch)
        plain = 1.0 / (steps.decode * self.cost.lent_ratio) if steps.decode > 0 else 0.0
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
        self.step_now = step if step is not None else int(self.rounds * self.round_steps)
        steps = self.cost.at_batch(batch)
        methods = [m for m in self.methods if m not in self.unready]
        if not methods:
            self.replan_soon = False
            for rid in self.requests:
                self.primary[rid] = ""
            return {rid: Choice([], 0, self.decoupled, "off: no drafter is ready yet") for rid in self.requests}
        free = [m for m in methods if self.is_free(m, batch)]
        ranked, picked = self._rank_methods(steps, methods, free)
        windows = self._batch_windows(steps, picked, before)
        plan = self._choices(batch, picked, free, windows)
        self.replan_soon = bool(windows.explorers)  # awaiting ones too: plan again as soon as their drafts are in
        self.promising = any(self._period_right(self.requests[rid], m, SHADOW_EVIDENCE)
                             for rid in self.shadowed for m in plan[rid].methods)
        if self.racing and self.peak_requests and len(self.requests) <= self.racing_below * self.peak_requests:
            self._add_racers(plan, ranked, batch)
        return plan

    def _rank_methods(self, steps: StepCosts, methods: list[str], free: list[str]
                      ) -> tuple[dict[str, list[tuple[float, str, int]]], list[Picked]]:
        """Each request's methods ranked by its draw (ranked: request id -> (speed, method, window),
        best first), and the method it takes (picked, in request order): the best, unless a switch
        from the one it has is not worth its cost."""
        ranked: dict[str, list[tuple[float, str, int]]] = {}
        picked: list[Picked] = []
        for rid, req in self.requests.items():
            if self.primary.get(rid) == "" and rid not in self.shadowed:
                # off: nothing new is learnt of it, so its own evidence fades towards the global
                # estimate; or a request that was unlucky early would stay off, and finish last
                for arm in [*req.arms.values(), *req.runs.values(), *req.fresh.values()]:
                    arm.successes *= self.decay
                    arm.failures *= self.decay
            # the draw ranks the methods (Thompson), but a free method is scored on every speculating
            # step whichever method leads, so it needs no exploring: its mean ranks it. Whether and
            # how far to speculate is the batch's call (_batch_windows).
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
        return ranked, picked

    def _batch_windows(self, steps: StepCosts, picked: list[Picked], before: float) -> BatchWindows:
        """The batch's windows: the ones that maximise its tokens/s at the cautious means
        (exploitation), then a few requests the means leave off trying their draws where the
        credit of step time affords it (exploration). ``before``: the rounds before this plan."""
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
            # a short draft measures acceptance as well as a long one, and costs less should it be wrong;
            # but a model copy's first draft comes after it fed the context, many steps on: one step
            # with one token of evidence then left it at p ~ 0.5 for 30 steps at 96% acceptance
            explore = [self._explore_window(picked[i][1], w) if i in explorers else w
                       for i, w in enumerate(explore)]
            while explorers:  # the explorers' windows by their draws, everyone else's as exploitation has them
                windows = [explore[i] if i in explorers else exploit[i] for i in range(len(picked))]
                # what the step would cost more than the exploiting one, should the draws be wrong (over
                # the steps an exploration lasts; a model copy's, one: its first verified window decides)
                # while its drafts are wrong, a copy on cores of its own redrafts there, not on the
                # verifier's: its rows are priced at their draws)
                copies = frozenset(i for i in explorers if self.cost.feeds_context(picked[i][1])
                                   and picked[i][1] not in self.cost.shared_methods)
                lasting = 1 if copies == explorers else self.exploration_steps
                extra = (self._step_s(steps, picked, windows, copies) / exploit_s - 1.0) * lasting
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
        return BatchWindows(list(windows), list(exploit), explorers, speed, plain, held)

    def _choices(self, batch: int, picked: list[Picked], free: list[str], windows: BatchWindows
                 ) -> dict[str, Choice]:
        """Each request's Choice from the batch's windows: explorations recorded (and one awaiting
        its first draft kept), off requests shadow-scored in the tail, free methods riding along."""
        plan: dict[str, Choice] = {}
        explorers = windows.explorers
        shadowing = self.shadow and bool(free) and bool(self.peak_requests) \
            and len(self.requests) <= self.shadow_below * self.peak_requests
        self.shadowed = set()
        for i, (rid, method, sure, drawn, q, why) in enumerate(picked):
            req = self.requests[rid]
            window = windows.windows[i]
            awaiting = req.exploring[1] and req.drafts_seen == req.explore_seen and req.steps < req.explore_deadline \
                and req.exploring[0] not in self.unready
            if i in explorers:
                gap = req.explore_gap or self.hold_rounds
                req.explore_at = self.rounds + gap
                req.explore_gap = min(2 * gap, self.max_explore_gap)
                req.exploring, req.explore_seen = (method, window), req.drafts_seen
                # a model drafter feeds the request's context first, after what it is feeding already
                fed_at = max(self.feed_done.get(method, 0), self.step_now) \
                    + self._feed_steps(method, req.prompt_len + req.committed, batch)
                self.feed_done[method] = fed_at
                req.explore_deadline = req.steps + self.explore_steps + fed_at - self.step_now
                why = "explore"
            elif not window and awaiting:  # its exploration's drafts are on their way: let them arrive
                (method, window), why = req.exploring, "explore (awaiting its first draft)"
                sure = drawn = req.arms.get(method, Acceptance()).mean
                explorers.add(i)
            else:
                req.exploring = ("", 0)
                if windows.exploit[i]:
                    req.explore_gap = self.hold_rounds  # the mean pays: a later exploration starts afresh
            previous = self.primary.get(rid)
            if window and previous and previous != method:
                req.hold_until = self.rounds + self.hold_rounds
            if not window:
                why_off = "the batch would not finish sooner (every request may run to its limit)" if windows.held \
                    else f"speculation does not pay at batch {batch}"
                choice = Choice([], 0, self.decoupled, f"off: {why_off} "
                                                       f"(best {method} p={sure:.2f}; plain {windows.plain:.1f} tok/s)")
                if shadowing and self._shadow_period(req, free):
                    choice.methods = list(free)
                    choice.reason += f"; shadow-scoring {','.join(free)}"
                    self.shadowed.add(rid)
            else:
                req.shadow_gap = 0  # speculating: once off again, it is shadowed soon
                p = drawn if i in explorers else sure
                choice = Choice([method], window, self.decoupled,
                                f"{why}: {method} w={window} p={p:.2f}: batch {windows.speed:.1f} tok/s "
                                f"(plain {windows.plain:.1f})")
                riders = [m for m in free if m != method]
                choice.methods += riders
                if riders:
                    choice.reason += f" (+{','.join(riders)} free)"
            self.primary[rid] = method if window else ""
            plan[rid] = choice
        return plan

    def _explore_window(self, method: str, drawn: int) -> int:
        """The window an exploration of ``method`` verifies, its draw's window ``drawn`` at most
        ``explore_window``; COPY_EXPLORE_WINDOW for a drafter that feeds contexts first (a model
        copy: right nearly always or nearly never, the same for every request, and its first
        draft comes many steps on: one token of evidence a step kept it at p ~ 0.5 for 30 steps
        at 96% acceptance). The credit of step time shortens either."""
        if self.cost.feeds_context(method):
            return max(COPY_EXPLORE_WINDOW, self.explore_window)
        return min(drawn, self.explore_window)

    def _feed_steps(self, method: str, tokens: int, batch: int) -> int:
        """Steps a method's drafter takes to feed ``tokens`` of context before its first drafts (a
        model drafter feeds prompt and output first: the default model's q8_0 copy on one core,
        ~2 ms a token, ~20 steps for a 200-token prompt), which an exploration waits for besides
        its own steps."""
        feed_s = FEED_MARGIN * self.cost.first_draft_s(method, tokens)
        return math.ceil(feed_s / max(self.cost.verify_s(batch, 1), 1e-4)) if feed_s > 0 else 0

    def is_quiet(self, plan: dict[str, Choice]) -> bool:
        """Whether the next plan may come ``DORMANT_SLOWDOWN`` times later: nothing in ``plan``
        drafts, and no shadowed request is :attr:`promising`. Shadowing alone does not count: at
        T=1 on 2 cores, planning every 4 steps through a tail where shadow scores turned nothing on
        was a quarter of the caller's CPU, which the verifier's forward lost (0.97x of autoregressive
        against 1.00x); a period whose scores come right makes the next plan come at once."""
        return not self.promising and not any(choice.window for choice in plan.values())

    def _shadow_period(self, req: RequestState, free: list[str]) -> bool:
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

    def _forget_another_text(self, req: RequestState, free: list[str]) -> None:
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

    def _period_right(self, req: RequestState, method: str, scores: int) -> bool:
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
        where a decoupled one ran 0.95x. A decoupled drafter on the
        verifier's own hardware (``shared``) adds its time to the step's all the same."""
        return iteration_s(verify, decoupled, shared) if self.decoupled else iteration_s(verify, added=coupled)

    def _step_s(self, steps: StepCosts, picked: list[Picked],
                windows: list[int], drawn: frozenset[int] = frozenset()) -> float:
        """Predicted seconds of the step where request i of ``picked`` drafts ``windows[i]`` (at
        its cautious acceptance; at its draw for i in ``drawn``)."""
        fed, rows = float(steps.batch), 0.0
        drafting = []
        for i, ((_, method, sure, draw, q, _), w) in enumerate(zip(picked, windows)):
            if w:
                fed, rows = fed + q * w, rows + q
                drafting.append((method, draw if i in drawn else sure, w, q))
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

        plain = speed() / self.cost.lent_ratio  # all off: on the cores a model drafter lends, if any
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

    def _closed_batch(self, picked: list[Picked]) -> ClosedBatch | None:
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
