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
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence as Seq

from specactor import protocol as p
from specactor.actor import Actor, ActorSpec, ActorSystem, class_path
from specactor.drafters.registry import METHODS
from specactor.memory import release_freed_memory
from specactor.verifier.engine import derive_seed

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
    events_path: str | None = None
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
        elif isinstance(msg, p.Error):
            self.log.warning("coordinator.error_reply", sender=sender, code=msg.code, error=msg.message, ref=msg.ref)
        else:
            raise TypeError(f"Coordinator does not handle {type(msg).__name__}")

    async def on_peer_down(self, name: str, reason: str) -> None:
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

    async def __aenter__(self) -> "RolloutEngine":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every actor and give the memory of in-process models back."""
        await self.system.shutdown()
        release_freed_memory()

    async def start(self) -> None:
        cfg = self.config
        await self.system.start()
        await self.system.spawn(self.coordinator)
        use_policy = cfg.mode == "specactor" and cfg.policy
        verifier_kwargs = {"model": cfg.model, "mode": _verify_mode(cfg.mode), "window": cfg.window,
                           "max_batch": cfg.max_batch, "max_len": cfg.max_len, "threads": cfg.verifier_thread_count,
                           "policy": "policy" if use_policy else None}
        await self._spawn("verifier", "specactor.verifier.actor:VerifyActor", verifier_kwargs, cfg.processes)
        for method in cfg.active_drafters:
            kwargs = {"method": method, "k": cfg.k, "window": cfg.window, "model": cfg.model,
                      "threads": cfg.drafter_threads}
            # cheap drafters share this process; a model drafter gets its own
            await self._spawn(f"draft-{method}", "specactor.drafters.actor:DraftActor", kwargs,
                              cfg.processes and method == "model")
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
        if isinstance(params, p.SamplingParams):
            params = [params] * len(prompt_ids)
        if len(params) != len(prompt_ids):
            raise ValueError(f"{len(params)} sampling params for {len(prompt_ids)} prompts")
        if request_ids is None:
            request_ids = [f"req-{next(self._ids)}" for _ in prompt_ids]
        if len(request_ids) != len(prompt_ids) or len(set(request_ids)) != len(request_ids):
            raise ValueError("request_ids must be unique, one per prompt")
        jobs = []
        for rid, ids, sp in zip(request_ids, prompt_ids, params):
            sp.validate()
            for sample in range(sp.n):
                sub = rid if sp.n == 1 else f"{rid}#{sample}"
                base = sp.seed if sp.seed is not None else derive_seed(rid)
                seed = base if sp.n == 1 else derive_seed(base, sample)
                one = p.SamplingParams(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                                       max_tokens=sp.max_tokens, stop_token_ids=list(sp.stop_token_ids),
                                       seed=seed, n=1, logprobs=sp.logprobs)
                jobs.append((sub, list(ids), one))
        return jobs

    async def generate(self, prompt_ids: Seq[Seq[int]], sampling_params: p.SamplingParams | Seq[p.SamplingParams],
                       request_ids: Seq[str] | None = None) -> list[p.RequestResult]:
        """Generate for every prompt (``n`` samples each); results in input order."""
        futures = [await self.coordinator.submit(*job) for job in self._expand(prompt_ids, sampling_params,
                                                                                 request_ids)]
        return list(await asyncio.gather(*futures))

    async def stream(self, prompt_ids: Seq[Seq[int]], sampling_params: p.SamplingParams | Seq[p.SamplingParams],
                     request_ids: Seq[str] | None = None) -> AsyncIterator[p.RequestResult]:
        """Like generate, but yields each result as soon as it finishes."""
        futures = [await self.coordinator.submit(*job) for job in self._expand(prompt_ids, sampling_params,
                                                                                 request_ids)]
        for done in asyncio.as_completed(futures):
            yield await done

    async def abort(self, request_id: str) -> None:
        await self.coordinator.send("verifier", p.AbortRequest(request_id=request_id))

    async def stats(self, timeout_s: float = 5.0) -> dict[str, dict[str, float]]:
        """Live counters of the verifier and each live drafter (dead ones are skipped)."""
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
