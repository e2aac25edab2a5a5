"""DraftActor: one drafting method serving many requests.

The mode is per request (``Track.mode``; the policy may change it).
Decoupled: drafts ahead of the last verdict without waiting, up to the
request's lookahead (:func:`decoupled_lookahead` of its window: enough for the
step in flight and the next), streaming one DraftBatch per drafting round; a verdict that
contradicts the lookahead discards it (rollback) and drafting goes on from the
committed tokens. Coupled: drafts up to ``window`` tokens, then waits for the
verdict on them (the classic draft-then-verify barrier).

Proposals of compute-heavy drafters (a model) run on the actor's worker
thread; verdicts that arrive meanwhile are queued and applied afterwards, so
the drafter's state is only ever touched by one thread at a time. A lookup's
round for a few requests runs on the event loop (the hop to the thread cost
more than the lookup). A lookup drafter keeps the state of a request parked
while the policy has it off (``Untrack.park``), so that tracking it again for
the next shadow period does not index its whole context again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from typing import Any

from specactor import protocol as p
from specactor.actor import Actor
from specactor.drafters.base import DraftState, Drafter
from specactor.speculation import DEFAULT_WINDOW, decoupled_lookahead
from specactor.drafters.registry import make_drafter
from specactor.memory import release_freed_memory
from specactor.weight_update import PendingUpdates


#: a decoupled drafter's rounds that follow each other within this long go to the verifier as one
#: DraftBatch. The cheap drafters draft in rounds of 0.1-0.6 ms, a suffix drafter several per verify
#: step (on an H100 at T=0: 5.7 messages a step from suffix, 2.3 from ngram, three quarters of them
#: within 1 ms of the one before), and every message takes the verifier's event loop some 0.1 ms of
#: the GIL that its host-bound step needs: there its steps without drafts took 10% longer than
#: autoregressive's. A verify step lasts 6 ms or more, so 1 ms of holding costs no draft its step.
COALESCE_S = 0.001
#: the most committed tokens a lookup drafter keeps for requests parked while they are off (beyond it
#: the oldest parked request is finished, as an untracked one always was): a shadow-scored tail was
#: tracked and untracked every few periods, and each Track indexed the whole context again (T=1 on
#: 2 cores: ~15% of the caller's CPU, taken from the verifier's forward)
PARKED_TOKENS = 1 << 18
#: a model copy lacking more than this many tokens of a decoupled request's context is fed them
#: before it drafts (see DraftActor._cold)
COLD_TOKENS = 16
#: a lookup drafter's round for at most this many requests runs on the event loop, not the worker
#: thread: it takes 0.05-0.1 ms a request, and the hop to the thread and back cost ~30 us of CPU
#: and three context switches a round (each taking a core from the verifier on a 2-core machine)
INLINE_REQUESTS = 32


class DraftActor(Actor):
    def __init__(
        self,
        name: str,
        method: str,
        verifier: str = "verifier",
        k: int = 4,
        window: int = DEFAULT_WINDOW,
        model: str | None = None,
        threads: int | None = None,
        drafter_options: dict[str, Any] | None = None,
        policy: str | None = None,
        measure_cost: bool = False,
        **kwargs: Any,
    ) -> None:
        """``policy``: told at once when the drafter becomes ready (it otherwise polls every few steps).
        ``measure_cost``: a model drafter measures (or finds cached) what its proposals cost at each
        batch size and tells the policy (:mod:`specactor.drafters.cost_profile`)."""
        super().__init__(name, **kwargs)
        self.policy, self.measure_cost = policy, measure_cost
        if k < 1 or window < k:
            raise ValueError(f"need 1 <= k <= window (got k={k}, window={window})")
        self.method, self.verifier, self.k, self.window = method, verifier, k, window
        self.coupled: set[str] = set()  # requests drafted in coupled mode
        self.model_name = model
        self.threads = threads
        self.drafter_options = drafter_options or {}
        self.drafter: Drafter | None = None
        self.states: dict[str, DraftState] = {}
        self._parked: OrderedDict[str, DraftState] = OrderedDict()  # off for now (Untrack.park), oldest first
        self._parked_tokens = 0
        self.windows: dict[str, int] = {}
        self._need_draft: set[str] = set()  # coupled: waiting for our draft
        self._stalled: dict[str, int] = {}  # decoupled: nothing to propose at this committed length
        self._queued: list[p.Track | p.VerdictBatch | p.Untrack] = []
        self._unsent: list[p.Draft] = []  # drafted, held for COALESCE_S: sent together
        self._unsent_since = 0.0  # when the first of them was drafted
        self._unsent_s = 0.0  # the drafting time they took
        self._busy = False
        self._wake = asyncio.Event()
        self._updates = PendingUpdates()  # chunks of updates not yet committed
        self._commits: list[tuple[str, p.WeightsCommit]] = []  # applied between drafting rounds
        self._rollouts: list[p.Rollouts] = []  # finished samples, for a drafter that learns from them
        self._idle_rollouts = False  # the verifier went idle after sending some: time to train
        self._stop_training = threading.Event()  # a request came in: cut the idle training round short
        self._cost_table: dict[str, float] = {}  # the measured cost table, as StatsReply values
        self._fed_apart: set[str] = set()  # requests whose feeding apart failed: their proposal feeds them
        self.stats = {"rounds": 0, "drafts": 0, "tokens": 0, "draft_s": 0.0, "rollbacks": 0, "version": 0,
                      "trained": 0}

    async def on_start(self) -> None:
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
            # and on the worker thread, where it drafts: OpenMP's thread count is per thread
            await self.run_blocking(torch.set_num_threads, self.threads)
        self.drafter = await self.run_blocking(make_drafter, self.method, self.model_name, self.drafter_options)
        if hasattr(self.drafter, "load_weights"):  # it takes the target's updates: check their chunks against it
            from specactor.engine.model_registry import resolve_model
            from specactor.engine.config import ModelConfig
            from specactor.engine.model import hf_shapes

            self._updates.expected = hf_shapes(ModelConfig.from_dir(resolve_model(self.model_name)))
        if self.measure_cost and self.method == "model" and self.policy is not None:
            await self._profile_cost()
        self.start_loop(self._drafting_loop())

    async def _profile_cost(self) -> None:
        """Measure (or find cached) what a proposal costs at each batch size and tell the policy
        at once, so that it prices the model copy before the first plan."""
        import torch

        from specactor.drafters.cost_profile import ensure_draft_profile, table_to_stats
        from specactor.engine.model_registry import resolve_model

        threads = getattr(self.drafter, "threads", None) or self.threads or torch.get_num_threads()
        model = str(resolve_model(self.model_name))
        table = await self.run_blocking(lambda: ensure_draft_profile(self.drafter, model, threads, log=self.log))
        self._cost_table = table_to_stats(table)
        if self.policy in self.directory and self.policy not in self.dead_peers:
            await self.send(self.policy, self._stats_reply())

    def on_closed(self) -> None:
        self._stop_training.set()  # a round on the worker thread would outlive the actor by minutes
        self.drafter = None

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, (p.Track, p.VerdictBatch, p.Untrack)):
            if self._busy:  # the drafter is proposing or training on the worker thread: apply afterwards
                self._queued.append(msg)
                if isinstance(msg, p.Track):  # a rollout began: training must not take its time
                    self._stop_training.set()
            else:
                self._apply_message(msg)
        elif isinstance(msg, p.StatsRequest):
            await self.send(sender, self._stats_reply())
        elif isinstance(msg, p.Rollouts):  # training data: taken between drafting rounds
            if len(msg.prompts) != len(msg.outputs):
                raise ValueError(f"Rollouts with {len(msg.prompts)} prompts and {len(msg.outputs)} outputs")
            self._rollouts.append(msg)
            self._idle_rollouts = msg.idle  # the latest word: a rollout may have begun since
            if not msg.idle:  # the verifier admitted requests again: a round must not take their time
                self._stop_training.set()
        elif isinstance(msg, p.WeightsChunk):
            self._updates.add(msg)
        elif isinstance(msg, p.WeightsCommit):
            self._commits.append((sender, msg))
        else:
            raise TypeError(f"DraftActor does not handle {type(msg).__name__}")
        self._wake.set()

    async def on_peer_down(self, name: str, reason: str, restarting: bool = False) -> None:
        """The verifier is gone: forget its requests (a restarted one Tracks them again)."""
        if name != self.verifier:
            return
        for request_id in [*self.states, *self._parked]:
            untrack = p.Untrack(request_id=request_id)
            if self._busy:
                self._queued.append(untrack)
            else:
                self._apply_message(untrack)

    async def _apply_commits(self) -> None:
        """Load committed weight updates (between drafting rounds: never during a proposal).
        Drafts are only proposals, so a drafter may switch weights while requests run."""
        commits, self._commits = self._commits, []
        for sender, commit in commits:
            weights, error = self._updates.take(commit)
            load = getattr(self.drafter, "load_weights", None)
            if not error and load is not None:
                rounds = len(getattr(self.drafter, "reports", []))
                was_ready = self._can_draft()
                self._busy = True  # the drafter is the worker thread's: Track/Untrack wait (as in a proposal)
                try:
                    await self.run_blocking(lambda: load(weights()))
                except Exception as exc:  # a corrupt or half-written checkpoint raises its reader's own errors
                    error = f"{type(exc).__name__}: {exc}"
                finally:
                    self._busy = False
                for report in getattr(self.drafter, "reports", [])[rounds:]:  # a learned drafter retrained
                    self._log_trained(report, commit.version, idle=False)
            weights = None  # drop the staged chunks and the old model, then give their pages back
            await self.run_blocking(release_freed_memory)
            if not error and load is not None:
                self.stats["version"] = commit.version  # the policy version its drafts come from
                await self._tell_policy_if_ready(was_ready)
            await self.send(sender, p.ControlAck(ref=commit.update_id, ok=not error, detail=error,
                                                 version=commit.version))
        self._apply_queued()

    def _take_rollouts(self) -> None:
        """Hand finished samples to a drafter that learns from them (others ignore them)."""
        batches, self._rollouts = self._rollouts, []
        add = getattr(self.drafter, "add_rollout", None)
        if add is None:
            return
        for batch in batches:
            for prompt, output in zip(batch.prompts, batch.outputs):
                add(prompt, output)

    def _can_draft(self) -> bool:
        """The drafter exists and can propose (a learned one: it has trained)."""
        return self.drafter is not None and bool(getattr(self.drafter, "ready", True))

    def _stats_reply(self) -> p.StatsReply:
        return p.StatsReply(name=self.name, values={**self.stats, "tracked": len(self.states),
                                                    "parked": len(self._parked), "ready": int(self._can_draft()),
                                                    **self._cost_table})

    def _log_trained(self, report: Any, version: int, idle: bool) -> None:
        self.stats["trained"] += not report.interrupted
        self.log.info("draft.trained", method=self.method, version=version, idle=idle, **vars(report))

    async def _tell_policy_if_ready(self, was_ready: bool) -> None:
        """A drafter that just became ready joins the next plan, not the one after the next poll."""
        if not was_ready and self._can_draft() and self.policy is not None \
                and self.policy in self.directory and self.policy not in self.dead_peers:
            await self.send(self.policy, self._stats_reply())

    async def _train_while_idle(self) -> None:
        """The verifier ran out of requests: a drafter that learns trains now, on the worker thread,
        until done or until a Track arrives (messages meanwhile queue as during a proposal)."""
        self._idle_rollouts = False
        train = getattr(self.drafter, "train", None)
        if train is None or self.states or not getattr(self.drafter, "has_new_rollouts", False):
            return
        self._stop_training.clear()
        self._busy = True
        was_ready = self._can_draft()
        try:
            report = await self.run_blocking(train, self._stop_training.is_set)
        except Exception as exc:  # the drafter keeps its last student; the actor goes on
            report = None
            self.log.error("draft.failed", method=self.method, error=f"training: {type(exc).__name__}: {exc}")
        finally:
            self._busy = False
        if report is not None:
            self._log_trained(report, self.stats["version"], idle=True)
            await self._tell_policy_if_ready(was_ready)
        self._apply_queued()

    def _apply_queued(self) -> None:
        queued, self._queued = self._queued, []
        for msg in queued:
            try:
                self._apply_message(msg)
            except Exception as exc:
                self.log.error("draft.failed", method=self.method, error=f"{type(exc).__name__}: {exc}")

    def _apply_message(self, msg: p.Track | p.VerdictBatch | p.Untrack) -> None:
        if isinstance(msg, p.Track):
            self._track(msg)
        elif isinstance(msg, p.VerdictBatch):
            self._apply(msg.verdicts)
        else:
            self._untrack(msg.request_id, park=msg.park)

    def _track(self, msg: p.Track) -> None:
        assert self.drafter is not None
        if msg.request_id in self.states:
            raise ValueError(f"request {msg.request_id!r} is already tracked")
        state = self._resume(msg)
        if state is None:
            state = DraftState(msg.request_id, list(msg.context_ids[: msg.prompt_len]),
                               committed=list(msg.context_ids[msg.prompt_len:]), seed=msg.seed,
                               temperature=msg.temperature)
            while True:
                try:
                    self.drafter.start(state)
                    break
                except RuntimeError:  # a model copy's slots are full: parked requests give theirs up
                    if not self._parked:
                        raise
                    self.drafter.finish(self._unpark(next(iter(self._parked))))
        self.states[msg.request_id] = state
        longest = self.window if msg.mode == p.DraftMode.COUPLED else decoupled_lookahead(self.window)
        self.windows[msg.request_id] = max(1, min(msg.window or self.window, longest))
        if msg.mode == p.DraftMode.COUPLED:
            self.coupled.add(msg.request_id)
        self._need_draft.add(msg.request_id)

    def _untrack(self, request_id: str, park: bool = False) -> None:
        self._drop_unsent(request_id)
        state = self.states.pop(request_id, None)
        if state is None and not park:
            state = self._unpark(request_id)  # a parked request untracked for good: finish it
        if state is not None and self.drafter is not None:
            if park:
                self._park(state)
            else:
                self.drafter.finish(state)
        self.windows.pop(request_id, None)
        self._fed_apart.discard(request_id)
        self.coupled.discard(request_id)
        self._need_draft.discard(request_id)
        self._stalled.pop(request_id, None)

    def _apply(self, verdicts: list[p.Verdict]) -> None:
        assert self.drafter is not None
        for verdict in verdicts:
            state = self.states.get(verdict.request_id)
            if state is None:
                if verdict.finished:
                    self._finish_parked(verdict)
                continue
            if not state.observe(verdict.start, verdict.tokens):
                self.stats["rollbacks"] += 1
                self._drop_unsent(verdict.request_id)
            self.drafter.observe(state, verdict.start, verdict.tokens)
            self._need_draft.add(verdict.request_id)
            self._stalled.pop(verdict.request_id, None)
            if verdict.finished:
                self._untrack(verdict.request_id)

    def _park(self, state: DraftState) -> None:
        """Keep the state of a request that goes on without this drafter for now: a lookup's index,
        a model copy's cache (a request the policy turns off and on again is not fed again from
        its prompt: one core of the default model's q8_0 copy feeds ~2 ms a token)."""
        assert self.drafter is not None
        state.lookahead.clear()
        self._parked[state.request_id] = state
        self._parked_tokens += len(state.prompt_ids) + len(state.committed)
        while self._parked_tokens > PARKED_TOKENS and len(self._parked) > 1:
            self.drafter.finish(self._unpark(next(iter(self._parked))))

    def _unpark(self, request_id: str) -> DraftState | None:
        state = self._parked.pop(request_id, None)
        if state is not None:
            self._parked_tokens -= len(state.prompt_ids) + len(state.committed)
        return state

    def _resume(self, msg: p.Track) -> DraftState | None:
        """The parked state of the request ``msg`` Tracks again, caught up with what was committed
        meanwhile; None if none was parked, or if the context does not continue it (then it is
        finished, as an untracked request's state always was)."""
        state = self._unpark(msg.request_id)
        if state is None:
            return None
        assert self.drafter is not None
        known = len(state.prompt_ids) + len(state.committed)
        if msg.prompt_len != len(state.prompt_ids) or len(msg.context_ids) < known \
                or msg.context_ids[:known] != state.prompt_ids + state.committed:
            self.drafter.finish(state)
            return None
        start, new = len(state.committed), list(msg.context_ids[known:])
        state.observe(start, new)
        self.drafter.observe(state, start, new)
        state.seed, state.temperature = msg.seed, msg.temperature
        return state

    def _finish_parked(self, verdict: p.Verdict) -> None:
        """A parked request finished: the verdict holds its whole output (start 0), so that what the
        drafter keeps of finished requests (a suffix drafter's history) has all of it."""
        state = self._unpark(verdict.request_id)
        if state is not None and self.drafter is not None:
            state.observe(verdict.start, verdict.tokens)
            self.drafter.observe(state, verdict.start, verdict.tokens)
            self.drafter.finish(state)

    def _ready(self) -> list[DraftState]:
        """Coupled requests that await their next draft; decoupled ones with room to run ahead."""
        return [
            s for r, s in self.states.items()
            if (r in self._need_draft if r in self.coupled
                else len(s.lookahead) < self.windows[r] and self._stalled.get(r) != len(s.committed))
        ]

    def _cold(self, ready: list[DraftState]) -> list[DraftState]:
        """Decoupled requests whose context a model copy has yet to be fed most of (more than
        COLD_TOKENS): fed apart from drafting, so that their drafts start where the request is."""
        cold = getattr(self.drafter, "cold", None)
        if cold is None:
            return []
        return [s for s in ready if s.request_id not in self.coupled and s.request_id not in self._fed_apart
                and cold(s) > COLD_TOKENS]

    def _propose(self, ready: list[DraftState], k: int) -> list[list[int]]:
        """One batched proposal round; if it fails, each request alone, so that one request the
        drafter cannot serve (a context too long for it) costs only its own drafts. A failing
        drafter slows its requests down, nothing more."""
        assert self.drafter is not None
        try:
            return self.drafter.propose(ready, k)
        except Exception as exc:
            if len(ready) == 1:
                self.log.error("draft.failed", method=self.method, request_id=ready[0].request_id,
                               error=f"{type(exc).__name__}: {exc}")
                return [[]]
        return [self._propose([state], k)[0] for state in ready]

    def _propose_timed(self, ready: list[DraftState], k: int) -> tuple[list[list[int]], float]:
        """:meth:`_propose` and the CPU seconds it took on the thread it ran on."""
        started = time.thread_time()
        proposals = self._propose(ready, k)
        return proposals, time.thread_time() - started

    async def _drafting_loop(self) -> None:
        assert self.drafter is not None
        while True:
            if self._rollouts:
                self._take_rollouts()
            if self._idle_rollouts:
                await self._flush()
                await self._train_while_idle()
            if self._commits:
                await self._flush()
                await self._apply_commits()
            ready = self._ready()
            if not ready:
                self._wake.clear()  # before the flush: a message handled while it sends wakes the wait
                await self._flush()
                await self._wake.wait()
                continue
            cold = self._cold(ready)
            if cold:  # feed them first, then catch up with the verdicts that came meanwhile
                self._busy = True
                try:
                    await self.run_blocking(self.drafter.prefill, cold)  # type: ignore[attr-defined]
                except Exception as exc:  # the proposal then feeds them, and fails request by request
                    self.log.error("draft.failed", method=self.method, request_id=cold[0].request_id,
                                   error=f"{type(exc).__name__}: {exc} (feeding {len(cold)} requests)")
                    self._fed_apart.update(s.request_id for s in cold)
                finally:
                    self._busy = False
                self._apply_queued()
                await asyncio.sleep(0)
                continue
            room = max(self.windows[s.request_id] - len(s.lookahead) for s in ready)
            lookup = getattr(self.drafter, "lookup", False)
            k = room if lookup else min(self.k, room)
            t0 = time.perf_counter()
            if lookup and len(ready) <= INLINE_REQUESTS:
                proposals, cpu_s = self._propose_timed(ready, k)
            else:
                self._busy = True
                try:
                    proposals, cpu_s = await self.run_blocking(self._propose_timed, ready, k)
                finally:
                    self._busy = False
            elapsed = time.perf_counter() - t0
            # what the round cost: a lookup's own CPU time, a model's wall time (its torch threads
            # are not the calling thread's); on 2 cores a lookup of 0.3 ms waited up to 14 ms for a
            # core while the verifier's forward ran, and that wait priced ngram as too dear to shadow
            spent = cpu_s if lookup else elapsed
            drafts = []
            for state, tokens in zip(ready, proposals):
                room = self.windows[state.request_id] - len(state.lookahead)
                tokens = list(tokens[:room])
                start = len(state.committed) + len(state.lookahead)
                state.lookahead.extend(tokens)
                self._need_draft.discard(state.request_id)
                if not tokens:
                    self._stalled[state.request_id] = len(state.committed)
                drafts.append(p.Draft(request_id=state.request_id, method=self.method, start=start, tokens=tokens,
                                      draft_ns=int(spent * 1e9)))
            self.stats["rounds"] += 1
            self.stats["drafts"] += len(drafts)
            self.stats["tokens"] += sum(len(d.tokens) for d in drafts)
            self.stats["draft_s"] += spent
            self._hold(drafts, t0, spent)
            # a coupled request's verifier waits for its draft; a decoupled one's is held while
            # another round like this one would still end within COALESCE_S of the first held
            if any(s.request_id in self.coupled for s in ready) \
                    or time.perf_counter() - self._unsent_since + elapsed >= COALESCE_S:
                await self._flush()
            self._apply_queued()
            await asyncio.sleep(0)  # let verdicts in between rounds

    def _hold(self, drafts: list[p.Draft], started: float, spent: float) -> None:
        """Keep a round's drafts (``spent``: what drafting them cost) for the next DraftBatch; a
        draft that continues one held for the same request joins it (the verifier's book would
        append it all the same)."""
        if not self._unsent:
            self._unsent_since, self._unsent_s = started, 0.0
        self._unsent_s += spent
        last = {d.request_id: d for d in self._unsent}
        for draft in drafts:
            held = last.get(draft.request_id)
            if held is not None and draft.tokens and held.tokens and held.start + len(held.tokens) == draft.start:
                held.tokens.extend(draft.tokens)
                held.draft_ns += draft.draft_ns
            else:
                self._unsent.append(draft)
                last[draft.request_id] = draft

    def _drop_unsent(self, request_id: str) -> None:
        """Forget the held drafts of a request whose lookahead was rolled back or that is no longer
        tracked: they continue a future that did not happen (and a redraft must not join them)."""
        self._unsent = [d for d in self._unsent if d.request_id != request_id]

    async def _flush(self) -> None:
        """Send the held drafts to the verifier, one DraftBatch."""
        if not self._unsent:
            return
        drafts, self._unsent = self._unsent, []
        self.log.info("draft.chunk", method=self.method, requests=len(drafts),
                      tokens=sum(len(d.tokens) for d in drafts), draft_ms=round(self._unsent_s * 1000, 3))
        await self.send(self.verifier, p.DraftBatch(drafter=self.name, drafts=drafts))
