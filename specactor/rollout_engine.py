"""RolloutEngine: the Python API of specactor.

    async with RolloutEngine(EngineConfig(mode="specactor", drafters=["ngram"])) as engine:
        results = await engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, n=4))

RolloutEngine checks each call and fans ``n`` samples out into separate
requests (``specactor.calls``; seeds by the one rule of ``specactor.seeds``:
the seed, the request's id and the sample index), starts the actors (verifier,
drafters, policy) in an ActorSystem, and hands the requests to its Coordinator
(:mod:`specactor.coordinator`), which routes them and gathers the results.

Between RL steps, ``update_weights`` sends a new state dict (chunked raw
bytes) or a checkpoint path to the verifier and any model drafter; it bumps
the policy version that every result carries. Requests running at that moment
finish on the old weights first (``in_flight="finish"``, new ones wait) or
are aborted (``"abort"``): no output ever mixes versions.
"""


from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any, AsyncIterator, Sequence as Seq

import msgspec

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.backends import check_backend
from specactor.config import EngineConfig
from specactor.speculation import LEARNING_METHODS, MODEL_METHODS
from specactor.events import configure_events, events_path
from specactor.memory import release_freed_memory
from specactor.engine.model_registry import DEFAULT_MODEL
from specactor.calls import Job, Params, as_finished, check_group_ids, expand, normalise
from specactor.coordinator import Coordinator
from specactor.weight_update import DEFAULT_CHUNK_BYTES, check_source, chunk_state_dict, next_version


#: weight-update bytes in flight to a holder, at most (about; see RolloutEngine.send_weights_chunk)
WEIGHT_SYNC_BYTES = 128 << 20


class RolloutEngine:
    """Lossless speculative rollout engine (see the module docstring)."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        self.config = config or EngineConfig(**overrides)
        check_backend(self.config)
        self.system = ActorSystem(self.config.transport, max_restarts=self.config.max_restarts)
        self.coordinator = Coordinator("coordinator", self.config)
        self.version = 0  # policy version of the weights the engine serves
        self.vocab_size: int | None = None  # known once started
        self.model_name = self.config.model or DEFAULT_MODEL
        self._stats_lock = asyncio.Lock()  # replies share one queue: one stats round at a time
        # the last committed update, to load into a restarted verifier: (checkpoint path, chunks)
        self._running_update: tuple[str, list[p.WeightsChunk]] | None = None
        self._staging: dict[str, list[p.WeightsChunk]] = {}  # the chunks of the update being sent
        self._weight_shapes: dict[str, tuple[int, ...]] = {}  # the model's, known once started
        self._unsynced_bytes = 0  # weight bytes sent since the holders last caught up
        self.coordinator.restore = self._restore_weights
        self.coordinator.restore_holder = self._restore_holder_weights
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
        from specactor.engine.model_registry import resolve_model
        from specactor.engine.config import ModelConfig
        from specactor.engine.model import hf_shapes

        cfg = self.config
        if cfg.events_path:  # before any actor starts: child processes inherit the file
            self._events_before = events_path()
            configure_events(cfg.events_path, console_level="warning")
        model_cfg = ModelConfig.from_dir(resolve_model(cfg.model))  # also converts once
        self.vocab_size = model_cfg.vocab_size
        self._weight_shapes = hf_shapes(model_cfg)
        await self.system.start()
        await self.system.spawn(self.coordinator)
        use_policy = cfg.mode == "specactor" and cfg.policy
        verifier_kwargs = {"model": cfg.model, "mode": _verify_mode(cfg.mode), "window": cfg.max_window,
                           "max_batch": cfg.max_batch, "max_len": cfg.max_len, "threads": cfg.verifier_threads,
                           "device": cfg.device, "dtype": cfg.dtype, "default_seed": cfg.seed,
                           "progress_every_s": cfg.progress_every_s,
                           "policy": "policy" if use_policy else None,
                           "learners": [f"draft-{m}" for m in cfg.active_drafters if m in LEARNING_METHODS],
                           "profile": cfg.measure_profile, "backend": cfg.backend,
                           "share_prompts": cfg.share_prompts, "cuda_graphs": cfg.cuda_graphs,
                           "inline_steps": cfg.inline_steps, "lend_threads": cfg.lent_threads}
        await self._spawn("verifier", "specactor.verifier.actor:VerifyActor", verifier_kwargs, cfg.processes)
        for method in cfg.active_drafters:
            # cheap drafters share this process; a model drafter gets its own. Only an actor with a
            # process of its own sets torch's thread count: it is global to the process, and the
            # caller's (an RL loop training in this process) must stay as it is.
            own_process = cfg.processes and method in MODEL_METHODS
            kwargs = {"method": method, "k": cfg.k, "window": cfg.max_window, "model": cfg.model,
                      "policy": "policy" if use_policy else None, "measure_cost": cfg.measure_profile,
                      "threads": cfg.drafter_threads if own_process else None}
            if method in MODEL_METHODS:  # sized like the verifier: it drafts for every running request
                kwargs["drafter_options"] = {"device": cfg.device, "max_slots": cfg.max_batch,
                                             "max_len": cfg.max_len + cfg.max_window}
                if method == "model" and own_process:
                    kwargs["drafter_options"]["threads"] = cfg.drafter_threads
                if method == "model" and cfg.draft_quant is not None:
                    kwargs["drafter_options"]["quant"] = cfg.draft_quant
            await self._spawn(f"draft-{method}", "specactor.drafters.actor:DraftActor", kwargs, own_process)
        if use_policy:  # light: shares this process
            await self._spawn("policy", "specactor.policy.actor:PolicyActor",
                              {"methods": cfg.active_drafters, "max_window": cfg.max_window,
                               "profile": await self._policy_profile(),
                               "shared_methods": cfg.drafters_on_verifier,
                               "racing": cfg.policy_races}, False)

    async def _policy_profile(self) -> str:
        """The cost profile the policy decides on: the file ``profile`` names, or the packaged one;
        else (auto, cached) this machine's, which the verifier measured or found before it started
        serving (its spawn has returned), cached under the thread count it reports."""
        from specactor.engine.model_registry import resolve_model
        from specactor.engine.profiling import resolve_profile

        cfg = self.config
        if cfg.profile not in (None, "auto", "cached"):
            return str(cfg.profile)
        threads = (await self.stats(timeout_s=10.0)).get("verifier", {}).get("threads")
        return resolve_profile(cfg.profile, resolve_model(cfg.model), dtype=cfg.dtype, device=cfg.device,
                               threads=int(threads) if threads else None, backend=cfg.profile_backend)

    async def _spawn(self, name: str, cls: str, kwargs: dict[str, Any], process: bool) -> None:
        """Start an actor from its spec, in a child process or in this one: either way the
        supervisor can start it again if it dies."""
        env = {"OMP_NUM_THREADS": str(kwargs.get("threads") or "")} if process and kwargs.get("threads") else {}
        await self.system.spawn(ActorSpec(name=name, cls=cls, kwargs=kwargs, env=env), local=not process)

    def _expand(self, prompt_ids: Any, sampling_params: Params | None, request_ids: Seq[str] | None,
                request_id: str | None, group_ids: Seq[str] | None = None) -> tuple[Any, list[Job]]:
        """The call, normalised, and one job per sample; every input is checked first, so a
        bad one rejects the whole call (ValueError naming it) before anything is submitted.
        ``group_ids`` are checked as a pool checks them; on one engine every group is together."""
        call = normalise(prompt_ids, sampling_params, request_ids, request_id)
        check_group_ids(call, group_ids)
        jobs = expand(call, vocab_size=self.vocab_size, max_len=self.config.max_len,
                      default_seed=self.config.seed, in_flight=self.coordinator.pending,
                      max_in_flight=self.config.max_in_flight)
        return call, jobs

    async def submit(self, prompt_ids: Any, sampling_params: Params | None = None,
                     request_ids: Seq[str] | None = None, *, request_id: str | None = None,
                     group_ids: Seq[str] | None = None) -> list[tuple[str, asyncio.Future[p.RequestResult]]]:
        """Submit every sample (checked first, all or nothing): (sample's request id, future of its result)."""
        _, jobs = self._expand(prompt_ids, sampling_params, request_ids, request_id, group_ids)
        return await self._submit(jobs)

    async def _submit(self, jobs: list[Job], resume: dict[str, tuple[int, list[int], list[float]]] | None = None,
                      ) -> list[tuple[str, asyncio.Future[p.RequestResult]]]:
        futures = await self.coordinator.submit([(job.request_id, job.prompt_ids, job.params) for job in jobs], resume)
        return [(job.request_id, future) for job, future in zip(jobs, futures)]

    async def submit_jobs(self, jobs: list[Job], resume: dict[str, tuple[int, list[int], list[float]]] | None = None,
                          ) -> list[tuple[str, asyncio.Future[p.RequestResult]]]:
        """Submit samples already expanded and checked (a pool expands each call once, for all its
        replicas); ``resume``: sample id -> (weights version, tokens, log-probs) another engine
        committed, continued from there if made under this engine's weights (the tokens are the
        same either way: sampling is keyed by seed, request and position)."""
        return await self._submit(jobs, resume)

    def committed(self, request_ids: Seq[str]) -> dict[str, tuple[int, list[int], list[float]]]:
        """What each of these pending samples has committed so far, by the verifier's last progress
        report: (weights version, tokens, log-probs); samples with nothing reported are left out."""
        partial = self.coordinator.partial
        return {rid: partial[rid] for rid in request_ids if rid in partial}

    async def generate(self, prompt_ids: Any, sampling_params: Params | None = None,
                       request_ids: Seq[str] | None = None, *, request_id: str | None = None,
                       group_ids: Seq[str] | None = None) -> Any:
        """Generate ``n`` samples per prompt.

        Batch form ``generate([ids, ...], params, request_ids=[...])``: every sample's result,
        in input order. Single form ``generate(ids, params, request_id="x")`` (verl's call):
        one RequestResult when ``n == 1``, else the ``n`` results in sample order.
        ``group_ids`` (one per prompt) matter to a RolloutPool; here they are only checked.
        """
        call, jobs = self._expand(prompt_ids, sampling_params, request_ids, request_id, group_ids)
        submitted = await self._submit(jobs)
        return call.shape(list(await asyncio.gather(*(future for _, future in submitted))))

    async def stream(self, prompt_ids: Any, sampling_params: Params | None = None,
                     request_ids: Seq[str] | None = None, *, request_id: str | None = None,
                     group_ids: Seq[str] | None = None) -> AsyncIterator[p.RequestResult]:
        """Like generate (either form), but yields each sample's result as soon as it finishes."""
        submitted = await self.submit(prompt_ids, sampling_params, request_ids, request_id=request_id,
                                      group_ids=group_ids)
        async for result in as_finished(submitted):
            yield result

    async def stream_jobs(self, jobs: list[Job]) -> AsyncIterator[p.RequestResult]:
        """Like stream, for samples already expanded (:func:`specactor.calls.expand`): some
        samples of a prompt, as ``specactor rollout --resume`` runs the ones still missing."""
        async for result in as_finished(await self._submit(jobs)):
            yield result

    async def abort(self, request_id: str) -> None:
        if self.coordinator.abort_waiting(request_id, "aborted while the verifier restarted"):
            return
        await self.coordinator.send("verifier", p.AbortRequest(request_id=request_id))

    # ------------------------------------------------------------------ between RL steps

    @property
    def _weight_holders(self) -> list[str]:
        """Actors that hold a copy of the policy's weights: the verifier, a model drafter, and a
        learned drafter (which takes the new embedding, and trains on rollouts it has not seen)."""
        return ["verifier"] + [f"draft-{m}" for m in MODEL_METHODS if m in self.config.active_drafters]

    async def update_weights(self, state_dict: Any = None, *, path: str | None = None, version: int | None = None,
                             in_flight: str = "finish", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
        """Load new weights (a Hugging Face-named state dict, or a checkpoint ``path``) into the
        target and any model drafter; return the new policy version (default: current + 1).

        ``in_flight="finish"``: running requests finish on the old weights, new ones wait
        (while the engine is paused, that wait lasts until :meth:`resume`);
        ``"abort"``: running requests are aborted. Raises ValueError if the update is
        rejected (the weights then stay as they were).
        """
        check_source(state_dict, path)
        update_id = uuid.uuid4().hex
        if state_dict is not None:
            for chunk in chunk_state_dict(update_id, state_dict, chunk_bytes):
                await self.send_weights_chunk(chunk)
                await asyncio.sleep(0)  # a send that does not block does not yield: keep the loop live
        return await self.commit_weights(update_id, version=version, in_flight=in_flight, path=path)

    async def send_weights_chunk(self, chunk: p.WeightsChunk) -> None:
        """Streaming form of update_weights: send one chunk, then :meth:`commit_weights`."""
        if self.config.restore_weights and tuple(chunk.shape) == self._weight_shapes.get(chunk.name):
            # kept only if it fits the model (the verifier refuses the rest), and at most a float64 model's size
            if chunk.update_id not in self._staging:
                self._staging.clear()  # one update is sent at a time: an earlier one was abandoned
            kept = self._staging.setdefault(chunk.update_id, [])
            if sum(len(c.data) for c in kept) + len(chunk.data) <= 8 * sum(
                    math.prod(shape) for shape in self._weight_shapes.values()):
                kept.append(chunk)
        for holder in self._weight_holders:
            await self.coordinator.send(holder, chunk)
        # ZeroMQ bounds its queues in messages, not bytes (1000 chunks of 8 MB would be 8 GB): every
        # WEIGHT_SYNC_BYTES, wait until each holder has taken what was sent (a daemon's client waits too)
        self._unsynced_bytes += len(chunk.data)
        if self._unsynced_bytes >= WEIGHT_SYNC_BYTES:
            self._unsynced_bytes = 0
            await asyncio.gather(*(self.coordinator.caught_up(holder) for holder in self._weight_holders))

    async def commit_weights(self, update_id: str, *, version: int | None = None, in_flight: str = "finish",
                             path: str | None = None) -> int:
        version = next_version(in_flight, version, self.version)
        commit = p.WeightsCommit(update_id=update_id, version=version, in_flight=in_flight, path=path or "")
        acks = await self.coordinator.control(self._weight_holders, lambda _: commit, update_id)
        verifier_ack = acks[0]
        if not verifier_ack.ok:
            self._staging.pop(update_id, None)
            raise ValueError(f"weight update rejected: {verifier_ack.detail}")
        self.version = verifier_ack.version
        self.coordinator.serving_version = self.version  # what a restarted verifier gets back
        if self.config.restore_weights:
            self._running_update = (path or "", self._staging.pop(update_id, []))
        self._staging.clear()
        for holder, ack in zip(self._weight_holders[1:], acks[1:]):
            if not ack.ok:  # drafts stay lossless; only its acceptance suffers, and the policy sees that
                self.coordinator.log.warning("coordinator.error_reply", sender=holder, code="weights",
                                             error=f"drafter kept its old weights: {ack.detail}", ref=update_id)
        return self.version

    async def _restore_holder_weights(self, name: str) -> None:
        """A model drafter the supervisor restarted gets the running weights, as the verifier does."""
        if name in self._weight_holders[1:]:
            await self._restore_weights(name)

    async def _restore_weights(self, peer: str = "verifier") -> None:
        """Load the running weights into a verifier (or model drafter) the supervisor restarted (it
        starts from the model's files): the last update again, under the running version."""
        if self.version == 0:
            return
        if self._running_update is None:
            raise RuntimeError(f"version {self.version} was loaded with restore_weights=False: nothing to "
                               f"reload; call update_weights again")
        path, chunks = self._running_update
        update_id = uuid.uuid4().hex
        for chunk in chunks:
            await self.coordinator.send(peer, msgspec.structs.replace(chunk, update_id=update_id))
            await asyncio.sleep(0)
        commit = p.WeightsCommit(update_id=update_id, version=self.version, in_flight="finish", path=path)
        (ack,) = await self.coordinator.control([peer], lambda _: commit, update_id)
        if not ack.ok:
            raise RuntimeError(ack.detail)

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
        state = self.coordinator.verifier_state
        return {"ok": "verifier" in live and bool(verifier) and state == "up", "model": self.model_name,
                "mode": self.config.mode, "policy_version": self.version, "paused": bool(verifier.get("paused", 0)),
                "in_flight": len(self.coordinator.pending), "actors": live, "verifier": state,
                "restarts": dict(self.system.restarts), "down": dict(self.system.down)}

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
