"""The front door: RolloutEngine (Python API) and its Coordinator actor.

    async with RolloutEngine(EngineConfig(mode="specactor", drafters=["ngram"])) as engine:
        results = await engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, n=4))

The Coordinator fans ``n`` samples out into separate requests (seeds derived
from the request's seed and the sample index), sends them to the verifier and
gathers the results. Who drafts for a request: in ``coupled`` mode the first
drafter, fixed; in ``specactor`` mode the PolicyActor (Fastest-of-N), which
assigns and reassigns methods, windows and modes as verdicts come in; with
``policy=False`` every drafter, the verifier taking the longest usable draft.
The verifier tells the drafters to Track and Untrack requests.

Between RL steps, ``update_weights`` sends a new state dict (chunked raw
bytes) or a checkpoint path to the verifier and any model drafter; it bumps
the policy version that every result carries. Requests running at that moment
finish on the old weights first (``in_flight="finish"``, new ones wait) or
are aborted (``"abort"``): no output ever mixes versions.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence as Seq

from specactor import protocol as p
from specactor.actor import Actor, ActorSpec, ActorSystem, class_path
from specactor.drafters.registry import METHODS
from specactor.events import configure_events, events_path
from specactor.memory import release_freed_memory
from specactor.models import DEFAULT_MODEL
from specactor.verifier.engine import derive_seed
from specactor.weight_update import DEFAULT_CHUNK_BYTES, IN_FLIGHT, chunk_state_dict

MODES = ("autoregressive", "coupled", "specactor")


@dataclass
class EngineConfig:
    model: str | None = None
    mode: str = "specactor"
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    k: int = 4  # draft length per proposal (coupled: per verify step)
    window: int = 8  # decoupled: how far a drafter may run ahead of the last verdict
    max_batch: int = 32
    max_len: int = 1024
    transport: str = "ipc"
    processes: bool = True  # verifier and model drafters in their own processes
    verifier_threads: int | None = None  # default: every core not given to a model drafter
    drafter_threads: int = 1
    events_path: str | None = None  # route this process's events, and its actors', to this JSONL file
    policy: bool = True  # specactor mode: Fastest-of-N policy (False: static, all drafters)
    racing: bool = True  # the policy may race extra methods for tail requests
    profile: str | None = None  # cost profile for the policy (default: the packaged one)

    def check(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: choose one of {', '.join(MODES)}")
        unknown = [d for d in self.drafters if d not in METHODS]
        if unknown:
            raise ValueError(f"unknown drafting method {unknown[0]!r}: choose from {', '.join(METHODS)}")
        if self.mode != "autoregressive" and not self.drafters:
            raise ValueError(f"mode {self.mode} needs at least one drafter")
        if not 1 <= self.k <= self.window:
            raise ValueError(f"need 1 <= k <= window (got k={self.k}, window={self.window})")
        if self.processes and self.transport == "inproc":
            raise ValueError("processes=True needs transport ipc or tcp")

    @property
    def verifier_thread_count(self) -> int | None:
        """Torch threads of the verifier: all cores, minus the model drafter's when one runs
        in its own process. Oversubscribing costs more than the thread it buys: on 2 cores,
        a 2-thread verifier beside a 1-thread model drafter took 19.1 s where a 1-thread
        verifier took 11.8 s (bench/RESULTS.md, thread split)."""
        if self.verifier_threads is not None:
            return self.verifier_threads
        if self.processes and "model" in self.active_drafters:
            return max(1, (os.cpu_count() or 1) - self.drafter_threads)
        return None

    @property
    def active_drafters(self) -> list[str]:
        if self.mode == "autoregressive":
            return []
        return self.drafters[:1] if self.mode == "coupled" else list(self.drafters)


class Coordinator(Actor):
    """Routes requests to the verifier and drafters and collects results."""

    def __init__(self, name: str, config: EngineConfig, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.config = config
        self.pending: dict[str, asyncio.Future[p.RequestResult]] = {}
        self.finished: asyncio.Queue[p.RequestResult] = asyncio.Queue()
        self.acks: dict[tuple[str, str], asyncio.Future[p.ControlAck]] = {}  # (actor, ref) -> its answer

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

    async def submit(self, request_id: str, prompt_ids: list[int], params: p.SamplingParams) -> asyncio.Future:
        if request_id in self.pending:
            raise ValueError(f"request id {request_id!r} is already in flight")
        future: asyncio.Future[p.RequestResult] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        cfg = self.config
        if cfg.mode == "coupled":
            await self.send("verifier", p.Assignment(request_id=request_id, methods=cfg.active_drafters[:1],
                                                     window=cfg.k, mode=p.DraftMode.COUPLED, reason="static"))
        elif cfg.mode == "specactor" and not cfg.policy:
            await self.send("verifier", p.Assignment(request_id=request_id, methods=cfg.active_drafters,
                                                     window=cfg.window, mode=p.DraftMode.DECOUPLED, reason="static"))
        await self.send("verifier", p.GenerateRequest(request_id=request_id, prompt_ids=prompt_ids, params=params,
                                                      reply_to=self.name))
        return future

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.RequestResult):
            future = self.pending.pop(msg.request_id, None)
            if future is not None and not future.done():
                future.set_result(msg)
            await self.finished.put(msg)
        elif isinstance(msg, p.ControlAck):
            future = self.acks.get((sender, msg.ref))
            if future is not None and not future.done():
                future.set_result(msg)
        elif isinstance(msg, p.Error):
            self.log.warning("coordinator.error_reply", sender=sender, code=msg.code, error=msg.message, ref=msg.ref)
        else:
            raise TypeError(f"Coordinator does not handle {type(msg).__name__}")

    async def on_peer_down(self, name: str, reason: str) -> None:
        for (peer, ref), future in list(self.acks.items()):
            if peer == name and not future.done():
                future.set_result(p.ControlAck(ref=ref, ok=False, detail=f"{name} is down: {reason}"))
        if name == "verifier":  # nothing can finish any more: fail everything, lose nothing silently
            for request_id, future in list(self.pending.items()):
                if not future.done():
                    future.set_result(p.RequestResult(
                        request_id=request_id, prompt_ids=[], token_ids=[], logprobs=[],
                        finish_reason=p.FinishReason.ERROR, error=f"verifier down: {reason}"))
            self.pending.clear()


class RolloutEngine:
    """Lossless speculative rollout engine (see the module docstring)."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        self.config = config or EngineConfig(**overrides)
        self.config.check()
        self.system = ActorSystem(self.config.transport)
        self.coordinator = Coordinator("coordinator", self.config)
        self._ids = itertools.count()
        self.version = 0  # policy version of the weights the engine serves
        self.vocab_size: int | None = None  # known once started
        self.model_name = self.config.model or DEFAULT_MODEL
        self._stats_lock = asyncio.Lock()  # replies share one queue: one stats round at a time
        self._events_before: str | None = None

    async def __aenter__(self) -> "RolloutEngine":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every actor and give the memory of in-process models back."""
        await self.system.shutdown()
        release_freed_memory()
        if self.config.events_path:
            configure_events(self._events_before, console_level="warning")

    async def start(self) -> None:
        from specactor.models import resolve_model
        from specactor.verifier.config import ModelConfig

        cfg = self.config
        if cfg.events_path:  # before any actor starts: child processes inherit the file
            self._events_before = events_path()
            configure_events(cfg.events_path, console_level="warning")
        self.vocab_size = ModelConfig.from_dir(resolve_model(cfg.model)).vocab_size  # also converts once
        await self.system.start()
        await self.system.spawn(self.coordinator)
        use_policy = cfg.mode == "specactor" and cfg.policy
        verifier_kwargs = {"model": cfg.model, "mode": _verify_mode(cfg.mode), "window": cfg.window,
                           "max_batch": cfg.max_batch, "max_len": cfg.max_len, "threads": cfg.verifier_thread_count,
                           "policy": "policy" if use_policy else None}
        await self._spawn("verifier", "specactor.verifier.actor:VerifyActor", verifier_kwargs, cfg.processes)
        for method in cfg.active_drafters:
            # cheap drafters share this process; a model drafter gets its own. Only an actor with a
            # process of its own sets torch's thread count: it is global to the process, and the
            # caller's (an RL loop training in this process) must stay as it is.
            own_process = cfg.processes and method == "model"
            kwargs = {"method": method, "k": cfg.k, "window": cfg.window, "model": cfg.model,
                      "threads": cfg.drafter_threads if own_process else None}
            await self._spawn(f"draft-{method}", "specactor.drafters.actor:DraftActor", kwargs, own_process)
        if use_policy:  # light: shares this process
            await self._spawn("policy", "specactor.policy.actor:PolicyActor",
                              {"methods": cfg.active_drafters, "max_window": cfg.window, "profile": cfg.profile,
                               "racing": cfg.racing}, False)

    async def _spawn(self, name: str, cls: str, kwargs: dict[str, Any], process: bool) -> None:
        if process:
            env = {"OMP_NUM_THREADS": str(kwargs.get("threads") or "")} if kwargs.get("threads") else {}
            await self.system.spawn(ActorSpec(name=name, cls=cls, kwargs=kwargs, env=env))
        else:
            from specactor.actor.spec import load_class

            await self.system.spawn(load_class(cls)(name=name, **kwargs))

    def _expand(self, prompt_ids: Seq[Seq[int]], params: p.SamplingParams | Seq[p.SamplingParams],
                request_ids: Seq[str] | None) -> list[tuple[str, list[int], p.SamplingParams]]:
        """One job per sample, every input checked first: a bad one rejects the whole call
        (ValueError naming it) before anything is submitted."""
        if isinstance(params, p.SamplingParams):
            params = [params] * len(prompt_ids)
        if len(params) != len(prompt_ids):
            raise ValueError(f"{len(params)} sampling params for {len(prompt_ids)} prompts")
        if request_ids is None:
            request_ids = [f"req-{next(self._ids)}" for _ in prompt_ids]
        if len(request_ids) != len(prompt_ids):
            raise ValueError(f"{len(request_ids)} request ids for {len(prompt_ids)} prompts")
        jobs = []
        for rid, ids, sp in zip(request_ids, prompt_ids, params):
            sp.validate()
            self._check_prompt(rid, ids, sp)
            for sample in range(sp.n):
                sub = rid if sp.n == 1 else f"{rid}#{sample}"
                base = sp.seed if sp.seed is not None else derive_seed(rid)
                seed = base if sp.n == 1 else derive_seed(base, sample)
                one = p.SamplingParams(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                                       max_tokens=sp.max_tokens, stop_token_ids=list(sp.stop_token_ids),
                                       seed=seed, n=1, logprobs=sp.logprobs)
                jobs.append((sub, list(ids), one))
        seen: set[str] = set()
        for rid, _, _ in jobs:
            if rid in seen or rid in self.coordinator.pending:
                raise ValueError(f"duplicate request id {rid!r}: " + (
                    "it is already in flight" if rid in self.coordinator.pending else "used twice in this call"))
            seen.add(rid)
        return jobs

    def _check_prompt(self, request_id: str, ids: Seq[int], sp: p.SamplingParams) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request id must be a non-empty string, got {request_id!r}")
        if len(ids) == 0:
            raise ValueError(f"request {request_id!r}: prompt is empty")
        vocab = self.vocab_size
        bad = next((t for t in ids if not isinstance(t, int) or isinstance(t, bool)
                    or not 0 <= t < (vocab if vocab is not None else 2**63)), None)
        if bad is not None:
            raise ValueError(f"request {request_id!r}: token id {bad!r} is outside the vocabulary"
                             + (f" (size {vocab})" if vocab is not None else ""))
        bad_stop = next((t for t in sp.stop_token_ids if vocab is not None and t >= vocab), None)
        if bad_stop is not None:
            raise ValueError(f"request {request_id!r}: stop token id {bad_stop} is outside the vocabulary "
                             f"(size {vocab})")
        if len(ids) + sp.max_tokens > self.config.max_len:
            raise ValueError(f"request {request_id!r}: prompt ({len(ids)} tokens) + max_tokens ({sp.max_tokens}) "
                             f"exceeds the context of {self.config.max_len} tokens")

    async def submit(self, prompt_ids: Seq[Seq[int]], sampling_params: p.SamplingParams | Seq[p.SamplingParams],
                     request_ids: Seq[str] | None = None) -> list[tuple[str, asyncio.Future[p.RequestResult]]]:
        """Submit every sample (checked first, all or nothing): (request id, future of its result)."""
        jobs = self._expand(prompt_ids, sampling_params, request_ids)
        return [(job[0], await self.coordinator.submit(*job)) for job in jobs]

    async def generate(self, prompt_ids: Seq[Seq[int]], sampling_params: p.SamplingParams | Seq[p.SamplingParams],
                       request_ids: Seq[str] | None = None) -> list[p.RequestResult]:
        """Generate for every prompt (``n`` samples each); results in input order."""
        submitted = await self.submit(prompt_ids, sampling_params, request_ids)
        return list(await asyncio.gather(*(future for _, future in submitted)))

    async def stream(self, prompt_ids: Seq[Seq[int]], sampling_params: p.SamplingParams | Seq[p.SamplingParams],
                     request_ids: Seq[str] | None = None) -> AsyncIterator[p.RequestResult]:
        """Like generate, but yields each result as soon as it finishes."""
        submitted = await self.submit(prompt_ids, sampling_params, request_ids)
        for done in asyncio.as_completed([future for _, future in submitted]):
            yield await done

    async def abort(self, request_id: str) -> None:
        await self.coordinator.send("verifier", p.AbortRequest(request_id=request_id))

    # ------------------------------------------------------------------ between RL steps

    @property
    def _weight_holders(self) -> list[str]:
        """Actors that hold a copy of the policy's weights: the verifier, and a model drafter."""
        return ["verifier"] + (["draft-model"] if "model" in self.config.active_drafters else [])

    async def update_weights(self, state_dict: Any = None, *, path: str | None = None, version: int | None = None,
                             in_flight: str = "finish", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
        """Load new weights (a Hugging Face-named state dict, or a checkpoint ``path``) into the
        target and any model drafter; return the new policy version (default: current + 1).

        ``in_flight="finish"``: running requests finish on the old weights, new ones wait
        (while the engine is paused, that wait lasts until :meth:`resume`);
        ``"abort"``: running requests are aborted. Raises ValueError if the update is
        rejected (the weights then stay as they were).
        """
        if (state_dict is None) == (path is None):
            raise ValueError("update_weights needs exactly one of state_dict and path")
        update_id = uuid.uuid4().hex
        if state_dict is not None:
            for chunk in chunk_state_dict(update_id, state_dict, chunk_bytes):
                await self.send_weights_chunk(chunk)
                await asyncio.sleep(0)  # a send that does not block does not yield: keep the loop live
        return await self.commit_weights(update_id, version=version, in_flight=in_flight, path=path)

    async def send_weights_chunk(self, chunk: p.WeightsChunk) -> None:
        """Streaming form of update_weights: send one chunk, then :meth:`commit_weights`."""
        for holder in self._weight_holders:
            await self.coordinator.send(holder, chunk)

    async def commit_weights(self, update_id: str, *, version: int | None = None, in_flight: str = "finish",
                             path: str | None = None) -> int:
        if in_flight not in IN_FLIGHT:
            raise ValueError(f"in_flight must be one of {', '.join(IN_FLIGHT)}, got {in_flight!r}")
        version = self.version + 1 if version is None else version
        if version <= self.version:
            raise ValueError(f"version {version} is not newer than the running version {self.version}")
        commit = p.WeightsCommit(update_id=update_id, version=version, in_flight=in_flight, path=path or "")
        acks = await self.coordinator.control(self._weight_holders, lambda _: commit, update_id)
        verifier_ack = acks[0]
        if not verifier_ack.ok:
            raise ValueError(f"weight update rejected: {verifier_ack.detail}")
        self.version = verifier_ack.version
        for holder, ack in zip(self._weight_holders[1:], acks[1:]):
            if not ack.ok:  # drafts stay lossless; only its acceptance suffers, and the policy sees that
                self.coordinator.log.warning("coordinator.error_reply", sender=holder, code="weights",
                                             error=f"drafter kept its old weights: {ack.detail}", ref=update_id)
        return self.version

    async def pause(self) -> None:
        """Stop stepping after the current step (requests keep their state; new ones queue)."""
        await self._toggle(p.Pause)

    async def resume(self) -> None:
        await self._toggle(p.Resume)

    async def _toggle(self, kind: type[p.Pause] | type[p.Resume]) -> None:
        (ack,) = await self.coordinator.control(["verifier"], lambda ref: kind(ref=ref), uuid.uuid4().hex)
        if not ack.ok:
            raise RuntimeError(f"{kind.__name__.lower()} failed: {ack.detail}")

    async def health(self) -> dict[str, Any]:
        """Liveness and the state a daemon reports: live actors, version, pause, load."""
        live = sorted(self.system.live())
        verifier = (await self.stats(timeout_s=2.0)).get("verifier", {})
        return {"ok": "verifier" in live and bool(verifier), "model": self.model_name, "mode": self.config.mode,
                "policy_version": self.version, "paused": bool(verifier.get("paused", 0)),
                "in_flight": len(self.coordinator.pending), "actors": live}

    async def stats(self, timeout_s: float = 5.0) -> dict[str, dict[str, float]]:
        """Live counters of the verifier and each live drafter (dead ones are skipped)."""
        async with self._stats_lock:
            return await self._stats(timeout_s)

    async def _stats(self, timeout_s: float) -> dict[str, dict[str, float]]:
        names = [n for n in ["verifier", *(f"draft-{m}" for m in self.config.active_drafters), "policy"]
                 if n in self.system.live()]
        for name in names:
            await self.system.send(name, p.StatsRequest())
        out: dict[str, dict[str, float]] = {}
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(out) < len(names):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            try:
                sender, reply = await asyncio.wait_for(self.system.replies.get(), remaining)
            except asyncio.TimeoutError:
                break
            if isinstance(reply, p.StatsReply):
                out[sender] = reply.values
        return out


def _verify_mode(mode: str) -> str:
    return {"autoregressive": "off", "coupled": "coupled", "specactor": "decoupled"}[mode]
