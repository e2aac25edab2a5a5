"""PolicyActor: Fastest-of-N steering of the drafters from the verifier's verdicts.

It gets every VerdictBatch the verifier produces, feeds the bandit (accepted
of drafted per request and method, racing scores included) and the cost model
(measured step times; drafting times polled from the drafters' stats), then
re-plans: per request, the method(s), window and coupled/decoupled mode that
maximise predicted tokens per second, or no speculation where none pays.
Only changes are sent, all of one step in one AssignmentBatch, each one an
event with its reason. The verifier applies them between steps and tells the
drafters to Track or Untrack.

It plans every ``plan_every`` steps, and never so often that planning (its CPU
time) takes more than ``PLAN_SHARE`` of the time between plans (new requests and the
follow-up of an exploration wait too): a plan's cost grows with the batch
(tens of milliseconds at batch 256), a GPU step can be a few milliseconds, and
the cheap drafters share the policy's event loop. The step time it compares
with is the forward's, which on a GPU leaves out the sampler and bookkeeping
(about half a graphed step): the spacing errs on the side of planning less.
"""

from __future__ import annotations

import math
import time
from typing import Any

from specactor import protocol as p
from specactor.actor import Actor
from specactor.speculation import DEFAULT_WINDOW, DRAFT_PREFILL_STATS
from specactor.speculation import LEARNING_METHODS
from specactor.policy.bandit import FastestOfN
from specactor.policy.bandit_state import DORMANT_SLOWDOWN, Choice
from specactor.policy.cost_model import CostModel, table_from_stats

#: the most of the wall time between two plans that planning may take
PLAN_SHARE = 0.25
#: weight of the newest plan (or step) in the running estimate of a plan's (a step's) seconds
TIMING_WEIGHT = 0.3


def _running(estimate: float, seconds: float) -> float:
    """A running estimate of seconds updated by one more (the first taken as it is)."""
    return estimate + (TIMING_WEIGHT if estimate else 1.0) * (seconds - estimate)


class PolicyActor(Actor):
    def __init__(self, name: str, methods: list[str], verifier: str = "verifier", max_window: int = DEFAULT_WINDOW,
                 profile: str | None = None, racing: bool = True, scheme: str = "thompson", seed: int = 0,
                 stats_every: int = 8, plan_every: int = 4, shared_methods: tuple[str, ...] | list[str] = (),
                 **kwargs: Any) -> None:
        """``profile``: the cost profile's path (the coordinator passes this machine's, see
        :func:`specactor.engine.profiling.resolve_profile`), or None / "packaged" for the packaged one;
        ``shared_methods``: drafters computing on the verifier's own hardware
        (:attr:`specactor.config.EngineConfig.drafters_on_verifier`)."""
        super().__init__(name, **kwargs)
        self.verifier = verifier
        self.methods = list(methods)
        self.cost = CostModel.from_profile(profile)
        self.cost.shared_methods = set(shared_methods)
        self.fon = FastestOfN(self.methods, self.cost, max_window=max_window, racing=racing, scheme=scheme,
                              round_steps=plan_every, seed=seed)
        # a learned drafter proposes nothing until it has trained: leave it out until its stats say ready
        self.fon.unready = {m for m in self.methods if m in LEARNING_METHODS}
        self.current: dict[str, Choice] = {}
        self.default: Choice | None = None
        self.stats_every = stats_every
        self.plan_every = plan_every  # planning costs ~0.2 ms a request: not every step
        self._quiet = False  # the last plan drafted nothing and shadowed nothing promising (FastestOfN.is_quiet)
        self.plan_s = 0.0  # a plan's seconds, running estimate
        self.step_s = 0.0  # a verify step's seconds, running estimate
        self.plan_gap = 1  # fewest steps between plans for planning to stay within PLAN_SHARE
        self._since_plan = 0
        self._drafter_totals: dict[str, dict[str, float]] = {}
        self.counters = {"steps": 0, "assignments": 0, "switches": 0, "off": 0, "racing": 0}

    async def on_start(self) -> None:
        self.log.info("policy.profile", path=self.cost.source, seconds=0.0, cached=self.cost.source != "packaged")
        for method in self.methods:  # a model drafter's measured costs, before the first plan
            if f"draft-{method}" in self.directory and f"draft-{method}" not in self.dead_peers:
                await self.send(f"draft-{method}", p.StatsRequest())
        await self._send_default(batch=1)

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.VerdictBatch):
            await self._on_verdicts(msg)
        elif isinstance(msg, p.StatsReply):
            self._on_drafter_stats(msg)
        elif isinstance(msg, p.Untrack):  # aborted: no final verdict will say it finished
            self.fon.remove_request(msg.request_id)
            self.current.pop(msg.request_id, None)
        elif isinstance(msg, p.StatsRequest):
            await self.send(sender, p.StatsReply(name=self.name, values=dict(self.counters)))
        else:
            raise TypeError(f"PolicyActor does not handle {type(msg).__name__}")

    async def on_peer_up(self, name: str) -> None:
        """A restarted verifier knows no assignment: send every request's again at the next plan."""
        if name == self.verifier:
            self.current.clear()
            self.default = None

    # ------------------------------------------------------------------ learning

    async def _on_verdicts(self, batch: p.VerdictBatch) -> None:
        fon = self.fon
        fon.waiting = batch.waiting
        fed = rows = 0
        new = prefill = False
        for v in batch.verdicts:
            new |= v.request_id not in fon.requests and not v.finished
            fon.add_request(v.request_id)
            if v.scores:
                for method, (drafted, accepted) in v.scores.items():
                    fon.observe(v.request_id, method, drafted, accepted)
            elif v.method:
                fon.observe(v.request_id, v.method, v.drafted, v.accepted)
            assigned = self.current.get(v.request_id)
            # not the prefill step (no drafts there), nor a shadowed request's: its drafter drafts on every
            # SHADOW_STRIDE steps' verdicts, so a step without its draft says nothing of the method
            if assigned is not None and v.start > 0 and assigned.window:
                offered = set(v.scores) if v.scores else {v.method}
                for method in assigned.methods:
                    fon.observe_offer(v.request_id, method, method in offered)
            fon.observe_commit(v.request_id, len(v.tokens), v.tokens)
            fon.observe_limit(v.request_id, v.max_tokens - v.start - len(v.tokens) if v.max_tokens else -1, v.greedy,
                              v.prompt_len)
            fed += 1 + v.drafted
            rows += v.drafted > 0
            prefill |= v.start == 0  # a prompt was fed: the step's time is not a verify step's
        if batch.step_ns and batch.batch_size and not prefill:
            if batch.lent:  # on a model drafter's idle cores too: what plain decoding costs then
                self.cost.observe_lent_step(batch.batch_size, batch.step_ns / 1e9)
            else:
                self.cost.observe_step(batch.batch_size, fed, batch.step_ns / 1e9, rows=rows)
        # the forward's time (a GPU step's sampler and bookkeeping are not in it), prefills included:
        # they pass between plans too, and with more prompts than slots most steps have one
        if batch.step_ns:
            self.step_s = _running(self.step_s, batch.step_ns / 1e9)
        for v in batch.verdicts:
            if v.finished:
                fon.remove_request(v.request_id)
                self.current.pop(v.request_id, None)
        self.counters["steps"] += 1
        # while every request is off (nothing drafts, nothing explores, no shadow scores come right) a
        # plan rarely changes and the drafters' timings hardly move: plan and ask 4x less often, so
        # that where speculation cannot pay the policy costs next to nothing
        slow = DORMANT_SLOWDOWN if self._quiet and not self.fon.promising else 1
        if self.counters["steps"] % (self.stats_every * slow) == 0:
            for method in self.methods:
                if f"draft-{method}" in self.directory and f"draft-{method}" not in self.dead_peers:
                    await self.send(f"draft-{method}", p.StatsRequest())
        self._since_plan += 1
        every = max(self.plan_every * slow, self.plan_gap)
        # new requests meanwhile draft by the default choice (policy.default); with a large batch
        # and more prompts than slots, some arrive at nearly every step
        if self._since_plan >= self.plan_gap and (new or self.fon.replan_soon or self.counters["steps"] % every == 0):
            await self._replan(batch.batch_size, batch.step)

    def _on_drafter_stats(self, reply: p.StatsReply) -> None:
        """Turn the growth of a drafter's counters into a timing sample for the cost model."""
        method = reply.name.removeprefix("draft-")
        now = reply.values
        ready = now.get("ready")
        if ready is not None and method in self.methods and bool(ready) == (method in self.fon.unready):
            if ready:
                self.fon.unready.discard(method)
            else:
                self.fon.unready.add(method)
            self.fon.replan_soon = True
            self.log.info("policy.ready", method=method, ready=bool(ready))
        table = table_from_stats(now)
        if table and method in self.methods \
                and self.cost.adopt_draft_table(method, table, float(now.get(DRAFT_PREFILL_STATS, 0.0))):
            self.fon.replan_soon = True
            self.log.info("policy.draft_cost", method=method, ms_by_batch={b: round(1000 * s, 2)
                                                                          for b, s in table.items()})
        before = self._drafter_totals.get(method)
        self._drafter_totals[method] = dict(now)
        if before is None:
            return
        rounds = now.get("rounds", 0) - before.get("rounds", 0)
        drafts = now.get("drafts", 0) - before.get("drafts", 0)
        tokens = now.get("tokens", 0) - before.get("tokens", 0)
        seconds = now.get("draft_s", 0) - before.get("draft_s", 0)
        if rounds > 0 and drafts > 0 and tokens > 0:
            self.cost.observe_draft(method, round(drafts / rounds), tokens / drafts, seconds / rounds)

    # ------------------------------------------------------------------ deciding

    async def _replan(self, batch: int, step: int) -> None:
        # the plan's CPU time, not its wall time: on a machine whose cores the verifier keeps busy
        # (2 CPU cores) a 3 ms plan can take 30 ms of wall time, and spacing plans by that changed
        # what the policy did (T=0 on the 2-core VM: racing and explorations fell, 2.0x -> 1.6x)
        started = time.thread_time()
        plan = self.fon.plan(max(batch, 1), step=step)
        self._timed_plan(time.thread_time() - started, batch)
        changes = []
        for rid, choice in plan.items():
            old = self.current.get(rid)
            if choice.same_as(old) or (old is not None and set(old.methods) == set(choice.methods)
                                       and min(old.window, choice.window) >= 3
                                       and (old.decoupled, old.race) == (choice.decoupled, choice.race)
                                       and abs(old.window - choice.window) <= 1):
                continue  # the same drafters with a long window one token off: not worth a message
                # (from 1 to 2 tokens is not: it buys up to half as much again)
            if old is not None and old.methods[:1] != choice.methods[:1]:
                self.counters["switches"] += 1
            self.current[rid] = choice
            self.counters["assignments"] += 1
            self.counters["off"] += not choice.methods
            self.counters["racing"] += choice.race
            changes.append(self._message(rid, choice))
            self.log.info("policy.assign", request_id=rid, step=step, methods=choice.methods,
                          window=choice.window, mode="decoupled" if choice.decoupled else "coupled",
                          reason=choice.reason)
        self._quiet = self.fon.is_quiet(plan)
        if changes:
            await self.send(self.verifier, p.AssignmentBatch(assignments=changes))
        if step % self.stats_every == 0:
            await self._send_default(batch)

    def _timed_plan(self, seconds: float, batch: int) -> None:
        """Space the plans so that planning (its CPU seconds) takes at most PLAN_SHARE of the time
        between them."""
        self._since_plan = 0
        self.plan_s = _running(self.plan_s, seconds)
        gap = max(1, math.ceil(self.plan_s / (PLAN_SHARE * self.step_s))) if self.step_s > 0 else 1
        if max(gap, self.plan_every) != max(self.plan_gap, self.plan_every):  # the plans' spacing changes
            self.log.info("policy.plan_gap", steps=max(gap, self.plan_every), plan_ms=round(1e3 * self.plan_s, 2),
                          step_ms=round(1e3 * self.step_s, 2), batch=batch)
        self.plan_gap = gap
        self.fon.exploration_steps = gap  # an exploration lasts until the next plan: that many steps

    async def _send_default(self, batch: int) -> None:
        """The cold-start choice for requests yet to arrive: the best method so far."""
        choice = self.fon.default_choice(batch)
        if choice.same_as(self.default):
            return
        self.default = choice
        self.log.info("policy.default", methods=choice.methods, window=choice.window, reason=choice.reason)
        await self.send(self.verifier, self._message("*", choice))

    @staticmethod
    def _message(request_id: str, choice: Choice) -> p.Assignment:
        return p.Assignment(request_id=request_id, methods=list(choice.methods), window=choice.window,
                            mode=p.DraftMode.DECOUPLED if choice.decoupled else p.DraftMode.COUPLED,
                            reason=choice.reason, race=choice.race)
