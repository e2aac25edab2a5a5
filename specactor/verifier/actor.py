"""VerifyActor: owns the target model and the authoritative state of every request.

Its step loop takes the freshest usable draft of each running request, verifies
all of them in one batched forward (on the actor's worker thread, so drafts and
requests keep arriving meanwhile), commits, sends one VerdictBatch per drafter
and a RequestResult per finished request. In decoupled mode it never waits for
a drafter. Requests assigned in coupled mode make it wait until each of them
has its draft (the barrier the paper removes), at most ``barrier_timeout_s``,
and never for a drafter that is down.

Assignments (from the coordinator, or the PolicyActor as it learns) say which
methods draft for a request, with which window, coupled or decoupled, racing
or not. The verifier owns the committed tokens, so it is the one that tells a
newly assigned drafter to Track the request from its current context (once
the request runs: a request waiting for a slot costs a drafter nothing), and a
dropped one to Untrack it. ``request_id="*"`` sets the assignment of requests
that arrive later (the policy's cold-start choice).

Everything the forward touches (the engine) is changed only between steps, on
the event loop: requests, aborts, assignments and weight commits wait in an
inbox until the step ends. Drafts are recorded in the draft book as they
arrive (the book is not read by the forward; the next step takes the freshest).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from typing import Any

from specactor import protocol as p
from specactor.actor import Actor
from specactor.memory import release_freed_memory
from specactor.backends import EngineSettings, load_engine
from specactor.config import BACKENDS
from specactor.speculation import DEFAULT_WINDOW, MODEL_METHODS, decoupled_lookahead, shadow_lookahead
from specactor.seeds import sample_seed
from specactor.engine.sequence import Sequence
from specactor.verifier.verdict_fanout import VerdictFanout
from specactor.verifier.verify_loop import Verifier
from specactor.weight_update import PendingUpdates, checked_update, commit_problem


class VerifyActor(VerdictFanout, Actor):
    def __init__(
        self,
        name: str,
        model: str | None = None,
        mode: str = "decoupled",
        window: int = DEFAULT_WINDOW,
        max_batch: int = 32,
        max_len: int = 1024,
        threads: int | None = None,
        lend_threads: int = 0,
        barrier_timeout_s: float = 2.0,
        policy: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        default_seed: int = 0,
        learners: list[str] | None = None,
        profile: bool = False,
        progress_every_s: float = 1.0,
        backend: str = "torch",
        share_prompts: bool = True,
        cuda_graphs: bool = True,
        inline_steps: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend  # torch: specactor's engine; vllm: vLLM's (specactor.vllm_backend)
        self.share_prompts = share_prompts  # a group's samples prefill their prompt once (our engine)
        self.cuda_graphs = cuda_graphs  # on a GPU, steps replay CUDA graphs (our engine)
        # decode and verify steps on the event loop's own thread (None: where they replay CUDA graphs;
        # EngineConfig.inline_steps says why)
        self.inline_steps = inline_steps
        if mode not in ("coupled", "decoupled", "off"):
            raise ValueError(f"mode must be coupled, decoupled or off, got {mode!r}")
        self.model_name, self.mode, self.window = model, mode, window
        self.max_batch, self.max_len, self.threads = max_batch, max_len, threads
        # a model drafter's own cores, which the forward takes while no request drafts with it (on a
        # 2-core CPU split 1+1, the verifier's plain step takes 24 ms on one core and 19 on two)
        self.lend_threads = lend_threads
        self._lent_step = False  # the last step ran on lent threads
        self.barrier_timeout_s = barrier_timeout_s
        self.device, self.dtype, self.default_seed = device, dtype, default_seed
        self._threads, self._bfloat16 = 0, False
        self.verifier: Verifier | None = None
        self.reply_to: dict[str, str] = {}
        self.drafters: dict[str, list[str]] = {}  # request id -> drafter actors tracking it
        self._lookahead: dict[str, int] = {}  # request id -> how far ahead its drafters were told to draft
        # request id -> drafters told to park it (Untrack.park) and not tracking it again since: they
        # get its whole output when it finishes
        self._parked: dict[str, set[str]] = {}
        self.assignments: dict[str, p.Assignment] = {}  # request id ("*": default) -> its assignment
        # assigned requests still waiting for a slot: their drafters are told to Track them once they
        # run, so a drafter holds state (a model drafter: a KV-cache slot) only for running requests
        self._not_running: dict[str, p.Assignment] = {}
        self.coupled: set[str] = set()  # requests whose drafts the step waits for
        self.policy = policy  # actor that gets every VerdictBatch, if any
        self.learners = list(learners or [])  # drafters that train on finished samples (p.Rollouts)
        self._learners_told_idle = False  # the last Rollouts said idle: the next request must say busy
        self.profile = profile  # measure this machine's cost profile before serving, if none is cached
        self._inbox: list[tuple[str, p.Message]] = []
        self._wake = asyncio.Event()
        self.version = 0  # policy version of the weights; every result carries it
        self.paused = False
        self._updates = PendingUpdates()  # chunks of updates not yet committed
        self._update: tuple[str, p.WeightsCommit] | None = None  # committed, waiting for running requests
        self._held: list[tuple[str, p.Message]] = []  # requests that arrived during an update
        self._finished_ids: OrderedDict[str, None] = OrderedDict()  # the last FINISHED_IDS to finish
        self._steps_since_trim = 0
        self._policy_forget: list[str] = []  # finished in a VerdictBatch the policy's full inbox dropped
        self._policy_held: list[p.VerdictBatch] = []  # quiet steps' verdicts, sent to the policy together
        # drafter -> verdicts of steps in which it drafted only for shadow-scored requests, sent together
        # every SHADOW_STRIDE steps (or before anything else it is sent)
        self._drafter_held: dict[str, list[p.Verdict]] = {}
        # committed tokens go to each request's reply_to every progress_every_s (p.Progress), so that a
        # restarted verifier resumes requests where this one left them, instead of from their prompts
        self.progress_every_s = progress_every_s
        self._reported: dict[str, int] = {}  # request id (asking for progress) -> output tokens its reply_to has
        self._last_progress = time.perf_counter()
        self.stats: dict[str, float] = {"steps": 0, "tokens": 0, "drafted": 0, "accepted": 0, "busy_s": 0.0,
                                        "waited_s": 0.0, "dropped_to_policy": 0}

    async def on_start(self) -> None:
        def load() -> Verifier:
            from specactor.engine.model_registry import resolve_model

            settings = EngineSettings(
                backend=self.backend, max_batch=self.max_batch, max_len=self.max_len, window=self.window,
                device=self.device, dtype=self.dtype, threads=self.threads, share_prompts=self.share_prompts,
                cuda_graphs=self.cuda_graphs, profile=self.profile)
            loaded = load_engine(resolve_model(self.model_name), settings, self.log)
            self._threads, self._bfloat16 = loaded.threads, loaded.bfloat16  # reported in stats
            return Verifier(loaded.engine, default_window=self.window if self.mode != "off" else 0)

        self.verifier = await self.run_blocking(load)
        if self.backend != "torch":  # vLLM's step schedules and prefills inside itself: it keeps the thread
            self.inline_steps = False
        elif self.inline_steps is None:
            self.inline_steps = self.verifier.engine.replays_graphs
        self._updates.expected = self.verifier.engine.model.hf_shapes()  # chunks are checked before allocation
        self.start_loop(self._step_loop())

    def on_closed(self) -> None:
        self.verifier = None

    async def on_peer_down(self, name: str, reason: str, restarting: bool = False) -> None:
        # Requests keep going without that drafter: drop it from the barrier.
        for request_id, names in self.drafters.items():
            if name in names:
                names.remove(name)
        for parked in self._parked.values():  # a restarted drafter has nothing parked
            parked.discard(name)
        self._drafter_held.pop(name, None)
        self._wake.set()

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.DraftBatch):
            assert self.verifier is not None
            for d in msg.drafts:
                self.verifier.add_draft(d.request_id, d.method, d.start, d.tokens)
        elif isinstance(msg, (p.GenerateRequest, p.AbortRequest, p.Assignment, p.AssignmentBatch, p.WeightsCommit,
                              p.Pause, p.Resume)):
            self._inbox.append((sender, msg))
        elif isinstance(msg, p.GenerateBatch):  # all in the inbox at once: the next step admits them together
            self._inbox.extend((sender, request) for request in msg.requests)
        elif isinstance(msg, p.WeightsChunk):
            self._updates.add(msg)
        elif isinstance(msg, p.StatsRequest):
            values = {**self.stats, "version": self.version, "paused": int(self.paused),
                      "requests": len(self.verifier.sequences) if self.verifier else 0, "held": len(self._held),
                      "threads": self._threads, "bfloat16": int(self._bfloat16), "pid": os.getpid(),
                      "inline_steps": int(bool(self.inline_steps))}
            await self.send(sender, p.StatsReply(name=self.name, values=values))
        else:
            raise TypeError(f"VerifyActor does not handle {type(msg).__name__}")
        self._wake.set()

    async def _take_inbox(self) -> None:
        """Apply queued requests, assignments and aborts (between steps only)."""
        assert self.verifier is not None
        inbox, self._inbox = self._inbox, []
        for sender, msg in inbox:
            if isinstance(msg, p.Assignment):
                await self._assign(msg, sender)
            elif isinstance(msg, p.AssignmentBatch):
                for one in msg.assignments:
                    await self._assign(one, sender)
            elif isinstance(msg, p.GenerateRequest):
                if self._learners_told_idle:  # they may be training: a rollout begins, stop
                    self._learners_told_idle = False
                    await self._to_learners(p.Rollouts(prompts=[], outputs=[], idle=False))
                if self._update is not None:  # starts on the new weights
                    self._held.append((sender, msg))
                else:
                    await self._admit(sender, msg)
            elif isinstance(msg, p.AbortRequest):
                await self._abort(msg.request_id, msg.reason)
            elif isinstance(msg, p.WeightsCommit):
                await self._commit(sender, msg)
            elif isinstance(msg, (p.Pause, p.Resume)):
                self.paused = isinstance(msg, p.Pause)
                await self.send(sender, p.ControlAck(ref=msg.ref, ok=True, version=self.version))

    async def _abort(self, request_id: str, reason: str) -> None:
        assert self.verifier is not None
        seq = self.verifier.abort(request_id)
        if seq is not None:
            await self._result(seq, error=reason)
            return
        for i, (held_sender, held) in enumerate(self._held):
            if isinstance(held, p.GenerateRequest) and held.request_id == request_id:
                del self._held[i]
                await self.send(held.reply_to or held_sender, p.RequestResult(
                    request_id=request_id, prompt_ids=list(held.prompt_ids), token_ids=[], logprobs=[],
                    finish_reason=p.FinishReason.ABORT, error=reason, policy_version=self.version))
                return

    async def _commit(self, sender: str, msg: p.WeightsCommit) -> None:
        """Start a weight update: abort or drain the running requests, hold new ones."""
        assert self.verifier is not None
        problem = ""
        if self._update is not None:
            problem = f"update {self._update[1].update_id!r} is still being applied"
        else:
            problem = commit_problem(msg.in_flight, msg.version, self.version)
        if problem:
            self._updates.take(msg)  # forget its chunks
            await self.send(sender, p.ControlAck(ref=msg.update_id, ok=False, detail=problem, version=self.version))
            return
        self._update = (sender, msg)
        if msg.in_flight == "abort":
            for request_id in list(self.verifier.sequences):
                await self._abort(request_id, f"aborted for the weight update to version {msg.version}")

    async def _apply_update(self) -> None:
        """Every running request has finished: load the new weights, then admit the held requests."""
        assert self.verifier is not None and self._update is not None
        sender, commit = self._update
        weights, error = self._updates.take(commit)
        model = self.verifier.engine.model

        def load() -> None:
            state = weights()
            checked_update(model, state)  # before anything changes: a bad update leaves the weights as they were
            model.load_hf_state_dict(state)

        if not error:
            try:
                await self.run_blocking(load)
            except Exception as exc:  # a corrupt or half-written checkpoint raises its reader's own errors
                error = f"{type(exc).__name__}: {exc}"
        weights = None  # drop the staged chunks (hundreds of MB), then give their pages back
        await self.run_blocking(release_freed_memory)
        if not error:
            self.version = commit.version
        self._update = None
        self.log.info("verify.weights", version=self.version, update_id=commit.update_id, ok=not error,
                      error=error, held=len(self._held))
        await self.send(sender, p.ControlAck(ref=commit.update_id, ok=not error, detail=error, version=self.version))
        self._inbox[:0], self._held = self._held, []

    async def _admit(self, sender: str, msg: p.GenerateRequest) -> None:
        assert self.verifier is not None
        self._finished_ids.pop(msg.request_id, None)  # an RL loop reuses ids from one step to the next
        reply_to = msg.reply_to or sender
        # the coordinator always sets the seed; a request sent straight to this actor follows the same rule
        seed = msg.params.seed if msg.params.seed is not None else sample_seed(None, msg.request_id, 0,
                                                                              self.default_seed)
        seq = Sequence(msg.request_id, list(msg.prompt_ids), msg.params, seed=seed,
                       output_ids=list(msg.resume_ids), logprobs=list(msg.resume_logprobs))
        try:
            self.verifier.add(seq, window=self.window if self.mode != "off" else 0)
        except ValueError as exc:
            self.assignments.pop(msg.request_id, None)
            await self.send(reply_to, p.RequestResult(
                request_id=msg.request_id, prompt_ids=list(msg.prompt_ids), token_ids=[], logprobs=[],
                finish_reason=p.FinishReason.ERROR, error=str(exc), policy_version=self.version))
            return
        self.reply_to[msg.request_id] = reply_to
        if msg.progress:
            self._reported[msg.request_id] = len(seq.output_ids)
        if seq.output_ids:
            self.log.info("request.resumed", request_id=msg.request_id, tokens=len(seq.output_ids))
        assignment = self.assignments.get(msg.request_id) or self.assignments.get("*")
        if assignment is not None and self.mode != "off":
            self._not_running[msg.request_id] = assignment  # the engine queues it: Tracked once it runs

    async def _assign(self, msg: p.Assignment, sender: str = "") -> None:
        """Record an assignment; apply it now if the request is running. The policy's for a
        request that has just finished (it planned while the request did) is dropped, or it
        would stay forever."""
        assert self.verifier is not None
        if sender == self.policy and msg.request_id in self._finished_ids:
            return
        self.assignments[msg.request_id] = msg
        if msg.request_id in self.verifier.sequences and self.mode != "off":
            if any(seq.request_id == msg.request_id for seq in self.verifier.engine.running):
                await self._realize(msg.request_id, msg)
            else:
                self._not_running[msg.request_id] = msg

    async def _realize_running(self) -> None:
        """Track the requests the last step started running with their assigned drafters."""
        if not self._not_running:
            return
        assert self.verifier is not None
        for seq in self.verifier.engine.running:
            assignment = self._not_running.pop(seq.request_id, None)
            if assignment is not None:
                await self._realize(seq.request_id, assignment)

    async def _realize(self, request_id: str, msg: p.Assignment) -> None:
        """Make the drafters of ``request_id`` those of ``msg``: Track the new ones
        from the committed context, Untrack the dropped ones."""
        assert self.verifier is not None
        seq = self.verifier.sequences[request_id]
        mode = msg.mode
        wanted = [f"draft-{m}" for m in msg.methods
                  if f"draft-{m}" in self.directory and f"draft-{m}" not in self.dead_peers]
        old = self.drafters.get(request_id, [])
        old_mode = p.DraftMode.COUPLED if request_id in self.coupled else p.DraftMode.DECOUPLED
        # A decoupled drafter must run further ahead than one step verifies, or its drafts are
        # overtaken by the verifier's own token: give it the full lookahead (the longest window, so
        # that the policy's window changes need no new Track). Not to a request that is only
        # shadow-scored (window 0): at T=1 a 33-token lookahead was thrown away after ~2 steps and
        # drafted again, 1.7 s of the caller's CPU in a 65 s T=1 rollout; its drafter
        # hears of it every SHADOW_STRIDE steps and drafts just far enough to cover them.
        lookahead = (max(msg.window, 1) if mode == p.DraftMode.COUPLED
                     else shadow_lookahead() if msg.window == 0
                     else decoupled_lookahead(max(self.window, msg.window, 1)))
        retrack = mode != old_mode or lookahead != self._lookahead.get(request_id, lookahead)
        self._lookahead[request_id] = lookahead
        for drafter in old:
            if drafter not in wanted or retrack:  # the request goes on: the drafter may keep its state
                await self._release_held(drafter)
                await self.send(drafter, p.Untrack(request_id=request_id, park=True))
                self._parked.setdefault(request_id, set()).add(drafter)
        for drafter in wanted:
            if drafter not in old or retrack:
                self._parked.get(request_id, set()).discard(drafter)
                await self._release_held(drafter)
                await self.send(drafter, p.Track(
                    request_id=request_id, context_ids=seq.prompt_ids + seq.output_ids,
                    prompt_len=len(seq.prompt_ids), window=lookahead, mode=mode, seed=seq.seed,
                    temperature=seq.params.temperature))
        self.drafters[request_id] = wanted
        if mode == p.DraftMode.COUPLED and wanted:
            self.coupled.add(request_id)
        else:
            self.coupled.discard(request_id)
        methods = [d.removeprefix("draft-") for d in wanted]
        self.verifier.assign(request_id, methods, msg.window, race=msg.race)
        if request_id in self.assignments and request_id != "*":
            self.assignments[request_id] = msg

    async def _barrier(self) -> None:
        """Coupled mode: wait for every running request's draft (bounded)."""
        assert self.verifier is not None
        deadline = time.perf_counter() + self.barrier_timeout_s
        while True:
            waiting = [r for r in self.verifier.awaiting_drafts() if r in self.coupled and self.drafters.get(r)]
            if not waiting or time.perf_counter() >= deadline:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), deadline - time.perf_counter())
            except asyncio.TimeoutError:
                return

    def _threads_for_step(self) -> int:
        """The forward's threads: its own, and the model drafters' lent cores while none drafts."""
        if not self.lend_threads or not self._threads:
            return 0
        drafting = any(name.removeprefix("draft-") in MODEL_METHODS
                       for names in self.drafters.values() for name in names)
        return self._threads + (0 if drafting else self.lend_threads)

    def _step_on(self, threads: int, drafts: Any) -> Any:
        """One engine step on ``threads`` torch threads (0: as they are), on the calling thread."""
        assert self.verifier is not None
        if threads:
            import torch

            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
        return self.verifier.engine.step(drafts)

    async def _step_loop(self) -> None:
        assert self.verifier is not None
        verifier = self.verifier
        while True:
            await self._take_inbox()
            if self._update is not None and not verifier.has_work:
                await self._apply_update()
                continue
            if not verifier.has_work or self.paused:
                self._wake.clear()
                if not self._inbox:
                    if self._steps_since_trim:  # going idle: give the pages freed since back (a forward's
                        self._steps_since_trim = 0  # buffers vary with batch and context; glibc keeps them)
                        await self.run_blocking(release_freed_memory)
                    if not self._inbox and not self._wake.is_set():
                        await self._wake.wait()
                continue
            t_wait = time.perf_counter()
            if self.coupled:
                await self._barrier()
            waited = time.perf_counter() - t_wait
            drafts = verifier.collect_drafts()
            t0 = time.perf_counter()
            inline = self.inline_steps and not verifier.engine.waiting  # admitting prefills: on the thread
            threads = self._threads_for_step()
            self._lent_step = threads > self._threads
            if inline:
                report = self._step_on(threads, drafts)
            else:
                report = await self.run_blocking(self._step_on, threads, drafts)
            busy = time.perf_counter() - t0
            verified = _per_method(report.verdicts)  # before retire() adds the unverified drafts' scores
            verifier.retire(report)
            shadowed = _per_method([v for v in report.verdicts if not v.drafted and v.scores])
            self.stats["steps"] += 1
            self._steps_since_trim += 1
            self.stats["tokens"] += report.new_tokens
            self.stats["drafted"] += report.drafted
            self.stats["accepted"] += report.accepted
            self.stats["busy_s"] += busy
            self.stats["waited_s"] += waited
            self.log.info("verify.step", step=int(self.stats["steps"]), batch_size=report.batch_size,
                          prefill_tokens=report.prefill_tokens, drafted=report.drafted, accepted=report.accepted,
                          new_tokens=report.new_tokens, forward_ms=round(report.forward_s * 1000, 2),
                          step_ms=round(busy * 1000, 2), waited_ms=round(waited * 1000, 2),
                          methods=verified, shadowed=shadowed,
                          graph="x".join(map(str, report.graph)) if report.graph else "")
            if report.capture_s and report.graph:
                self.log.info("verify.graph_captured", batch=report.graph[0], chunk=report.graph[1],
                              capture_ms=round(report.capture_s * 1000, 2))
            await self._broadcast(report)
            await self._realize_running()
            if inline:  # what arrived during the step (drafts, aborts, heartbeats due) before the next one
                for _ in range(LOOP_TURNS):
                    await asyncio.sleep(0)
            if time.perf_counter() - self._last_progress >= self.progress_every_s:
                await self._send_progress()

    async def _send_progress(self) -> None:
        """Each reply_to gets its running requests' tokens committed since the last Progress. Not
        waited on: a reader that stopped gets it later (its requests' positions stay where they were)."""
        assert self.verifier is not None
        self._last_progress = time.perf_counter()
        by_reader: dict[str, list[p.Partial]] = {}
        for rid, start in self._reported.items():
            seq, reader = self.verifier.sequences.get(rid), self.reply_to.get(rid)
            if seq is not None and reader is not None and len(seq.output_ids) > start:
                by_reader.setdefault(reader, []).append(p.Partial(
                    request_id=rid, start=start, token_ids=seq.output_ids[start:], logprobs=seq.logprobs[start:]))
        for reader, partials in by_reader.items():
            if reader in self.directory and reader not in self.dead_peers and await self.send(
                    reader, p.Progress(version=self.version, partials=partials), timeout_s=0):
                for partial in partials:
                    self._reported[partial.request_id] = partial.start + len(partial.token_ids)

    async def _result(self, seq: Sequence, error: str = "") -> None:
        reply_to = self.reply_to.pop(seq.request_id, None)
        self._reported.pop(seq.request_id, None)
        self._finished_ids[seq.request_id] = None
        while len(self._finished_ids) > FINISHED_IDS:
            self._finished_ids.popitem(last=False)
        drafters = self.drafters.pop(seq.request_id, [])
        parked = self._parked.pop(seq.request_id, set())  # never beside drafters: a Track unparks
        self._lookahead.pop(seq.request_id, None)
        self.assignments.pop(seq.request_id, None)
        self._not_running.pop(seq.request_id, None)
        self.coupled.discard(seq.request_id)
        self.log.info("request.finished", request_id=seq.request_id, tokens=len(seq.output_ids),
                      finish_reason=str(seq.finish_reason or p.FinishReason.ERROR),
                      latency_s=round(time.perf_counter() - seq.arrival_s, 4), steps=seq.steps,
                      drafted=seq.drafted, accepted=seq.accepted)
        if seq.finish_reason == p.FinishReason.ABORT:  # no final verdict will tell them
            for drafter in [*drafters, *parked]:
                await self._release_held(drafter)
                await self.send(drafter, p.Untrack(request_id=seq.request_id))
            if self.policy is not None and self.policy not in self.dead_peers:
                await self.send(self.policy, p.Untrack(request_id=seq.request_id))
        if reply_to is None:
            return
        await self.send(reply_to, p.RequestResult(
            request_id=seq.request_id, prompt_ids=seq.prompt_ids, token_ids=seq.output_ids, logprobs=seq.logprobs,
            finish_reason=seq.finish_reason or p.FinishReason.ERROR,
            stats=p.RequestStats(drafted=seq.drafted, accepted=seq.accepted, verify_steps=seq.steps,
                                 per_method=seq.per_method),
            policy_version=self.version, error=error))


#: finished request ids remembered, to drop the policy's late assignments for them
FINISHED_IDS = 4096

#: event-loop turns given after an inline step: a message that came in during it needs one for its
#: socket's readiness and one for the task that reads and dispatches it; one more for a handler's send
LOOP_TURNS = 3


def _per_method(verdicts: list[p.Verdict]) -> dict[str, list[int]]:
    """method -> [drafted, accepted, drafts] verified in one step (each raced draft counted)."""
    out: dict[str, list[int]] = {}
    for v in verdicts:
        scores = v.scores or ({v.method: [v.drafted, v.accepted]} if v.method else {})
        for method, (drafted, accepted) in scores.items():
            counts = out.setdefault(method, [0, 0, 0])
            counts[0] += drafted
            counts[1] += accepted
            counts[2] += 1
    return out
