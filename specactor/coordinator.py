"""The Coordinator actor: the front door inside the actor system.

RolloutEngine (:mod:`specactor.rollout_engine`) hands it the samples of every
call; it sends them to the verifier and gathers the results. Who drafts for a
request: in ``coupled`` mode the first drafter, fixed; in ``specactor`` mode the
PolicyActor (Fastest-of-N), which assigns and reassigns methods, windows and
modes as verdicts come in; with ``policy=False`` every drafter, the verifier
taking the longest usable draft. The verifier tells the drafters to Track and
Untrack requests.
"""


from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable


from specactor import protocol as p
from specactor.actor import Actor
from specactor.calls import check_not_in_flight
from specactor.config import EngineConfig

#: tokens (prompts and resumed outputs) in one GenerateBatch at most: a few MB, well inside a message's limit
SUBMIT_BATCH_TOKENS = 1 << 20


def _batches(requests: list[p.GenerateRequest]) -> list[list[p.GenerateRequest]]:
    """``requests`` in order, cut where a batch would pass :data:`SUBMIT_BATCH_TOKENS`."""
    batches: list[list[p.GenerateRequest]] = []
    tokens = 0
    for request in requests:
        size = len(request.prompt_ids) + len(request.resume_ids)
        if not batches or (batches[-1] and tokens + size > SUBMIT_BATCH_TOKENS):
            batches.append([])
            tokens = 0
        batches[-1].append(request)
        tokens += size
    return batches


class Coordinator(Actor):
    """Routes requests to the verifier and drafters and collects results."""

    def __init__(self, name: str, config: EngineConfig, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.config = config
        self.pending: dict[str, asyncio.Future[p.RequestResult]] = {}  # a result leaves with its future
        self.jobs: dict[str, tuple[list[int], p.SamplingParams]] = {}  # what each pending request asked for
        self.acks: dict[tuple[str, str], asyncio.Future[p.ControlAck]] = {}  # (actor, ref) -> its answer
        #: each pending request's output so far (the verifier's Progress): (weights version, tokens, log-probs)
        self.partial: dict[str, tuple[int, list[int], list[float]]] = {}
        #: the weights version a restarted verifier is given back (the engine keeps it current)
        self.serving_version = 0
        #: "up", "restarting" (the supervisor is starting a new verifier: requests wait, then are sent
        #: again from the tokens the last one committed, or from their prompts when it committed none
        #: under the weights restored; position-keyed sampling makes them token-identical), or "down: why"
        self.verifier_state = "up"
        #: called when a restarted verifier serves, before the requests are sent again (the engine
        #: loads the running weights into it); an exception fails every pending request
        self.restore: Callable[[], Awaitable[None]] | None = None
        #: called with the name of another weight holder (a model drafter) that was restarted, so
        #: that it drafts from the running weights, not the model's files (its drafts stay lossless
        #: either way: only its acceptance is at stake)
        self.restore_holder: Callable[[str], Awaitable[None]] | None = None
        self._holder_restores: set[asyncio.Task[None]] = set()
        self._recovery: asyncio.Task[None] | None = None
        self._pongs: dict[int, asyncio.Future[None]] = {}
        self._ping_seq = 0

    async def control(self, peers: list[str], make: Any, ref: str, timeout_s: float | None = None) -> list[p.ControlAck]:
        """Send ``make(ref)`` to each peer and wait for every ControlAck (a dead peer answers not ok)."""
        loop = asyncio.get_running_loop()
        futures = []
        for peer in peers:
            future: asyncio.Future[p.ControlAck] = loop.create_future()
            self.acks[(peer, ref)] = future
            if not await self.send(peer, make(ref)):
                future.set_result(p.ControlAck(ref=ref, ok=False, detail=f"{peer} is not running"))
            futures.append(future)
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), timeout_s))
        finally:
            for peer in peers:
                self.acks.pop((peer, ref), None)

    async def caught_up(self, peer: str, timeout_s: float = 120.0) -> bool:
        """True once ``peer`` has handled everything we sent it so far (a Ping behind it came back;
        one pipe keeps its order); False if it is not running or did not answer in time."""
        self._ping_seq += 1
        seq = self._ping_seq
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs[seq] = waiter
        try:
            if not await self.send(peer, p.Ping(seq=seq, sent_ns=0)):
                return False
            await asyncio.wait_for(waiter, timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._pongs.pop(seq, None)

    async def submit(self, jobs: list[tuple[str, list[int], p.SamplingParams]],
                     resume: dict[str, tuple[int, list[int], list[float]]] | None = None) -> list[asyncio.Future]:
        """Futures of the results of ``jobs`` (request id, prompt ids, params), sent to the verifier
        in one message (:class:`~specactor.protocol.GenerateBatch`): their prompts prefill in one step.
        ``resume``: output some of them already committed elsewhere (weights version, tokens,
        log-probs), continued from there when made under the weights this engine serves."""
        ids = [request_id for request_id, _, _ in jobs]
        check_not_in_flight(ids, self.pending)  # all or nothing: checked before any is sent
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[p.RequestResult]] = []
        for request_id, prompt_ids, params in jobs:
            future: asyncio.Future[p.RequestResult] = loop.create_future()
            futures.append(future)
            if self.verifier_state.startswith("down"):
                future.set_result(failed_result(request_id, prompt_ids,
                                                f"the verifier is not running ({self.verifier_state})"))
                continue
            self.pending[request_id] = future
            self.jobs[request_id] = (list(prompt_ids), params)
            if resume and request_id in resume:
                self.partial[request_id] = resume[request_id]
        if self.verifier_state == "up":
            sent = [rid for rid in ids if rid in self.pending]
            try:
                await self._send_requests(sent)
            except BaseException:  # nothing of the call stays in flight: it may be submitted again
                for request_id in sent:
                    self.pending.pop(request_id, None)
                    self.jobs.pop(request_id, None)
                    self.partial.pop(request_id, None)
                raise
        return futures  # restarting: sent once the new verifier serves

    async def _send_requests(self, request_ids: list[str]) -> list[int]:
        """Send jobs to the verifier in one message, each resumed from its committed tokens if any;
        returns how many each resumed from."""
        cfg = self.config
        requests, resumed = [], []
        for request_id in request_ids:
            prompt_ids, params = self.jobs[request_id]
            version, resume_ids, resume_logprobs = self.partial.pop(request_id, (0, [], []))
            if version != self.serving_version:  # made on other weights: not what the new verifier would make
                resume_ids, resume_logprobs = [], []
            if cfg.mode == "coupled":
                await self.send("verifier", p.Assignment(request_id=request_id, methods=cfg.active_drafters[:1],
                                                         window=cfg.k, mode=p.DraftMode.COUPLED, reason="static"))
            elif cfg.mode == "specactor" and not cfg.policy:
                await self.send("verifier", p.Assignment(request_id=request_id, methods=cfg.active_drafters,
                                                         window=cfg.max_window, mode=p.DraftMode.DECOUPLED,
                                                         reason="static"))
            requests.append(p.GenerateRequest(request_id=request_id, prompt_ids=prompt_ids, params=params,
                                              reply_to=self.name, progress=True, resume_ids=resume_ids,
                                              resume_logprobs=resume_logprobs))
            resumed.append(len(resume_ids))
        for batch in _batches(requests):
            message = batch[0] if len(batch) == 1 else p.GenerateBatch(requests=batch)
            if not await self.send("verifier", message) and self.verifier_state == "up":
                for request in batch:  # nothing will ever answer them: answer them now
                    self._resolve(failed_result(request.request_id, request.prompt_ids, "the verifier is not running"))
        return resumed

    def _progress(self, msg: p.Progress) -> None:
        """Keep each pending request's committed output (contiguous pieces only)."""
        for part in msg.partials:
            if part.request_id not in self.jobs or len(part.token_ids) != len(part.logprobs):
                continue
            version, tokens, logprobs = self.partial.get(part.request_id, (msg.version, [], []))
            if part.start == 0 or (version == msg.version and part.start == len(tokens)):
                if part.start == 0:
                    tokens, logprobs = [], []
                self.partial[part.request_id] = (msg.version, tokens + part.token_ids, logprobs + part.logprobs)

    def _resolve(self, result: p.RequestResult) -> None:
        self.jobs.pop(result.request_id, None)
        self.partial.pop(result.request_id, None)
        future = self.pending.pop(result.request_id, None)
        if future is not None and not future.done():
            future.set_result(result)

    def abort_waiting(self, request_id: str, reason: str) -> bool:
        """Abort a request the verifier does not hold (it is being restarted); False if it may."""
        if self.verifier_state == "up" or request_id not in self.pending:
            return False
        self._resolve(failed_result(request_id, self.jobs[request_id][0], reason, p.FinishReason.ABORT))
        return True

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.RequestResult):
            self._resolve(msg)
        elif isinstance(msg, p.Progress):
            self._progress(msg)
        elif isinstance(msg, p.Pong):
            waiter = self._pongs.pop(msg.seq, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif isinstance(msg, p.ControlAck):
            future = self.acks.get((sender, msg.ref))
            if future is not None and not future.done():
                future.set_result(msg)
        else:
            raise TypeError(f"Coordinator does not handle {type(msg).__name__}")

    async def on_error(self, sender: str, error: p.Error) -> None:
        self.log.warning("coordinator.error_reply", sender=sender, code=error.code, error=error.message,
                         ref=error.ref)

    async def on_peer_down(self, name: str, reason: str, restarting: bool = False) -> None:
        for (peer, ref), future in list(self.acks.items()):
            if peer == name and not future.done():
                future.set_result(p.ControlAck(ref=ref, ok=False, detail=f"{name} is down: {reason}"))
        if name != "verifier":
            return
        if restarting:  # the requests wait for the new verifier, and are sent to it again
            self.verifier_state = "restarting"
            self.log.warning("coordinator.verifier_restarting", reason=reason, waiting=len(self.pending))
            return
        # gone for good: nothing can finish any more: fail everything, lose nothing silently
        self.verifier_state = f"down: {reason}"
        self._fail_all(f"verifier down: {reason}")

    async def on_peer_up(self, name: str) -> None:
        if name == "verifier" and self.verifier_state == "restarting":
            # not here: restoring the weights waits for the verifier's answer, which this loop delivers
            self._recovery = asyncio.create_task(self._recover())
        elif name != "verifier" and self.restore_holder is not None:
            task = asyncio.create_task(self._restore_holder(name))
            self._holder_restores.add(task)
            task.add_done_callback(self._holder_restores.discard)

    async def _restore_holder(self, name: str) -> None:
        assert self.restore_holder is not None
        try:
            await self.restore_holder(name)
        except Exception as exc:  # it drafts on from the model's files: lossless, only slower
            self.log.warning("coordinator.error_reply", sender=name, code="weights",
                             error=f"restarted drafter kept the model's weights: {exc}", ref="")

    async def _recover(self) -> None:
        """A new verifier serves: load the running weights into it, then send every waiting request."""
        started = time.perf_counter()
        try:
            if self.restore is not None:
                await self.restore()
        except Exception as exc:
            self.verifier_state = f"down: the restarted verifier could not load the running weights: {exc}"
            self.log.error("coordinator.verifier_recovered", ok=False, error=self.verifier_state, requests=0,
                           seconds=round(time.perf_counter() - started, 3))
            self._fail_all(self.verifier_state)
            return
        self.verifier_state = "up"
        waiting = list(self.jobs)
        resumed = await self._send_requests(waiting)
        self.log.info("coordinator.verifier_recovered", ok=True, error="", requests=len(waiting),
                      resumed=sum(n > 0 for n in resumed), resumed_tokens=sum(resumed),
                      seconds=round(time.perf_counter() - started, 3))

    def _fail_all(self, error: str) -> None:
        for request_id in list(self.pending):
            prompt_ids = self.jobs.get(request_id, ([], None))[0]
            self._resolve(failed_result(request_id, prompt_ids, error))


def failed_result(request_id: str, prompt_ids: list[int], error: str,
                  finish_reason: p.FinishReason = p.FinishReason.ERROR) -> p.RequestResult:
    """The result of a request no verifier will answer: no tokens, and why."""
    return p.RequestResult(request_id=request_id, prompt_ids=list(prompt_ids), token_ids=[], logprobs=[],
                           finish_reason=finish_reason, error=error)
