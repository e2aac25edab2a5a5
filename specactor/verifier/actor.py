"""VerifyActor: owns the target model and the authoritative state of every request.

Its step loop takes the freshest usable draft of each running request, verifies
all of them in one batched forward (on the actor's worker thread, so drafts and
requests keep arriving meanwhile), commits, sends one VerdictBatch per drafter
and a RequestResult per finished request. In decoupled mode it never waits for
a drafter. In coupled mode it waits until every running request has its draft
(the barrier the paper removes), at most ``barrier_timeout_s``, and never for a
drafter that is down.

Everything the forward touches (the engine) is changed only between steps, on
the event loop: requests, aborts and drafts are queued while a step runs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from specactor import protocol as p
from specactor.actor import Actor
from specactor.verifier.engine import Engine, Sequence, derive_seed
from specactor.verifier.verifier import Verifier


class VerifyActor(Actor):
    def __init__(
        self,
        name: str,
        model: str | None = None,
        mode: str = "decoupled",
        window: int = 8,
        max_batch: int = 32,
        max_len: int = 1024,
        threads: int | None = None,
        barrier_timeout_s: float = 2.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        if mode not in ("coupled", "decoupled", "off"):
            raise ValueError(f"mode must be coupled, decoupled or off, got {mode!r}")
        self.model_name, self.mode, self.window = model, mode, window
        self.max_batch, self.max_len, self.threads = max_batch, max_len, threads
        self.barrier_timeout_s = barrier_timeout_s
        self.verifier: Verifier | None = None
        self.reply_to: dict[str, str] = {}
        self.drafters: dict[str, list[str]] = {}  # request id -> drafter actors tracking it
        self._inbox: list[tuple[str, p.Message]] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.stats: dict[str, float] = {"steps": 0, "tokens": 0, "drafted": 0, "accepted": 0, "busy_s": 0.0,
                                        "waited_s": 0.0}

    async def on_start(self) -> None:
        def load() -> Verifier:
            import torch

            from specactor.models import resolve_model
            from specactor.tokenizer import Tokenizer
            from specactor.verifier.weights import load_causal_lm

            if self.threads:
                torch.set_num_threads(self.threads)
            folder = resolve_model(self.model_name)
            model = load_causal_lm(folder)
            eos = set(model.cfg.eos_token_ids)
            tok_eos = Tokenizer(folder).eos_token_id
            if tok_eos is not None:
                eos.add(tok_eos)
            engine = Engine(model, max_batch=self.max_batch, max_len=self.max_len, eos_token_ids=eos)
            return Verifier(engine, default_window=self.window if self.mode != "off" else 0)

        self.verifier = await self.run_blocking(load)
        self._loop_task = asyncio.create_task(self._step_loop())

    async def on_stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()

    async def on_peer_down(self, name: str, reason: str) -> None:
        # Requests keep going without that drafter: drop it from the barrier.
        for request_id, names in self.drafters.items():
            if name in names:
                names.remove(name)
        self._wake.set()

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.DraftBatch):
            assert self.verifier is not None
            for d in msg.drafts:
                self.verifier.add_draft(d.request_id, d.method, d.start, d.tokens)
        elif isinstance(msg, (p.GenerateRequest, p.AbortRequest, p.Assignment)):
            self._inbox.append((sender, msg))
        elif isinstance(msg, p.StatsRequest):
            await self.send(sender, p.StatsReply(name=self.name, values=dict(self.stats)))
        else:
            raise TypeError(f"VerifyActor does not handle {type(msg).__name__}")
        self._wake.set()

    async def _take_inbox(self) -> None:
        """Apply queued requests, assignments and aborts (between steps only)."""
        assert self.verifier is not None
        inbox, self._inbox = self._inbox, []
        for sender, msg in inbox:
            if isinstance(msg, p.Assignment):
                self.drafters[msg.request_id] = list(msg.methods)
                if msg.request_id in self.verifier.windows:
                    self.verifier.windows[msg.request_id] = msg.window
            elif isinstance(msg, p.GenerateRequest):
                await self._admit(sender, msg)
            elif isinstance(msg, p.AbortRequest):
                seq = self.verifier.abort(msg.request_id)
                if seq is not None:
                    await self._result(seq, error=msg.reason)

    async def _admit(self, sender: str, msg: p.GenerateRequest) -> None:
        assert self.verifier is not None
        reply_to = msg.reply_to or sender
        seed = msg.params.seed if msg.params.seed is not None else derive_seed(msg.request_id)
        seq = Sequence(msg.request_id, list(msg.prompt_ids), msg.params, seed=seed)
        try:
            self.verifier.add(seq, window=self.window if self.mode != "off" else 0)
        except ValueError as exc:
            await self.send(reply_to, p.RequestResult(
                request_id=msg.request_id, prompt_ids=list(msg.prompt_ids), token_ids=[], logprobs=[],
                finish_reason=p.FinishReason.ERROR, error=str(exc)))
            return
        self.reply_to[msg.request_id] = reply_to

    async def _barrier(self) -> None:
        """Coupled mode: wait for every running request's draft (bounded)."""
        assert self.verifier is not None
        deadline = time.perf_counter() + self.barrier_timeout_s
        while True:
            waiting = [r for r in self.verifier.awaiting_drafts() if self.drafters.get(r)]
            if not waiting or time.perf_counter() >= deadline:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), deadline - time.perf_counter())
            except asyncio.TimeoutError:
                return

    async def _step_loop(self) -> None:
        assert self.verifier is not None
        verifier = self.verifier
        while True:
            await self._take_inbox()
            if not verifier.has_work:
                self._wake.clear()
                if not self._inbox:
                    await self._wake.wait()
                continue
            t_wait = time.perf_counter()
            if self.mode == "coupled":
                await self._barrier()
            waited = time.perf_counter() - t_wait
            drafts = verifier.collect_drafts()
            t0 = time.perf_counter()
            report = await self.run_blocking(verifier.engine.step, drafts)
            busy = time.perf_counter() - t0
            verifier.retire(report)
            self.stats["steps"] += 1
            self.stats["tokens"] += report.new_tokens
            self.stats["drafted"] += report.drafted
            self.stats["accepted"] += report.accepted
            self.stats["busy_s"] += busy
            self.stats["waited_s"] += waited
            self.log.info("verify.step", step=int(self.stats["steps"]), batch_size=report.batch_size,
                          prefill_tokens=report.prefill_tokens, drafted=report.drafted, accepted=report.accepted,
                          new_tokens=report.new_tokens, forward_ms=round(report.forward_s * 1000, 2),
                          step_ms=round(busy * 1000, 2), waited_ms=round(waited * 1000, 2))
            await self._broadcast(report)

    async def _broadcast(self, report: Any) -> None:
        per_drafter: dict[str, list[p.Verdict]] = {}
        for verdict in report.verdicts:
            for drafter in self.drafters.get(verdict.request_id, []):
                per_drafter.setdefault(drafter, []).append(verdict)
        for drafter, verdicts in per_drafter.items():
            await self.send(drafter, p.VerdictBatch(step=int(self.stats["steps"]), verdicts=verdicts,
                                                    step_ns=int(report.forward_s * 1e9), batch_size=report.batch_size))
        for seq in report.finished:
            await self._result(seq)

    async def _result(self, seq: Sequence, error: str = "") -> None:
        reply_to = self.reply_to.pop(seq.request_id, None)
        drafters = self.drafters.pop(seq.request_id, [])
        if seq.finish_reason == p.FinishReason.ABORT:
            for drafter in drafters:  # no final verdict will tell them
                await self.send(drafter, p.Untrack(request_id=seq.request_id))
        if reply_to is None:
            return
        await self.send(reply_to, p.RequestResult(
            request_id=seq.request_id, prompt_ids=seq.prompt_ids, token_ids=seq.output_ids, logprobs=seq.logprobs,
            finish_reason=seq.finish_reason or p.FinishReason.ERROR,
            stats=p.RequestStats(drafted=seq.drafted, accepted=seq.accepted, verify_steps=seq.steps,
                                 per_method=seq.per_method),
            error=error))
