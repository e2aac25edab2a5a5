"""RolloutPool: the RolloutEngine API over N replicas on Ray.

    async with RolloutPool(EngineConfig(mode="specactor"), replicas=4) as pool:
        results = await pool.generate(prompts, SamplingParams(temperature=1.0, n=8))

Each replica is a Ray actor owning a RolloutEngine (:mod:`specactor.pool.replica`),
placed in a bundle of one placement group (:mod:`specactor.pool.placement`).
The pool checks and expands every call once, as an engine does, and routes each
group of samples to one replica (:mod:`specactor.pool.router`). Seeds belong to
the request, never to a replica, so where a sample runs changes none of its
tokens: that is what makes the pool's faults cheap. A replica that dies (its
process killed, its node lost) or hangs (no answer to a ping within
``hang_timeout_s``) is restarted by Ray, up to ``max_restarts`` times, and gets
the running weights before it serves again; its unfinished samples continue at
once on a live replica from the tokens they had committed (the replicas report
them every ``progress_every_s``), token-identical to an undisturbed run.

Weights: ``update_weights`` puts each chunk into Ray's object store once; every
replica reads it from there (or the checkpoint path), and the version is the
pool's: new calls wait while an update commits, and requests in flight finish
on the old weights or are aborted, as ``in_flight`` says, on each replica
exactly as on one engine. The chunks of the running update stay in the object
store for a replica that restarts.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Sequence as Seq

from specactor import protocol as p
from specactor.backends import check_backend
from specactor.calls import Job, Params, as_finished, check_group_ids, check_not_in_flight, expand, normalise
from specactor.config import EngineConfig
from specactor.coordinator import failed_result
from specactor.engine.model_registry import DEFAULT_MODEL
from specactor.events import configure_events, events_path, get_logger
from specactor.pool.placement import actor_options, bundle, import_ray, join_ray, place, replica_config
from specactor.pool.broadcast import WeightBroadcast
from specactor.pool.replica import Committed, Replica
from specactor.pool.router import Router
from specactor.weight_update import DEFAULT_CHUNK_BYTES, check_source, chunk_state_dict, next_version

#: sample ids whose route the pool remembers (:attr:`RolloutPool.routes`)
ROUTES_KEPT = 100_000


@dataclass
class _Sample:
    """A sample in flight in the pool."""

    job: Job
    group: str
    tokens: int  # what it weighs in the router: prompt + max_tokens
    future: asyncio.Future
    replica: int = -1
    committed: Committed | None = None  # its output so far, as its replica last reported it
    moving_to: int | None = None  # aborted on its replica, to continue on this one (the tail rebalanced)


@dataclass
class _ReplicaSlot:
    handle: Any
    state: str = "starting"  # "up", "restarting", "down: why"
    generation: int = 0  # bumped at each death: a stale failure report is ignored
    deaths: int = 0
    pid: int = 0
    node: str = ""
    checking: bool = False


class RolloutPool:
    """RolloutEngine's API over ``replicas`` Ray actors (see the module docstring)."""

    def __init__(self, config: EngineConfig | None = None, *, replicas: int = 2, ray_address: str | None = None,
                 max_restarts: int = 3, hang_timeout_s: float = 60.0, check_every_s: float = 2.0,
                 revive_timeout_s: float = 300.0, strategy: str = "PACK", rebalance_every_s: float | None = 0.5,
                 **overrides: Any) -> None:
        """``ray_address``: a cluster to join (``auto``: this machine's), else a local Ray starts;
        ``strategy``: Ray's placement strategy for the replicas' bundles (PACK, SPREAD, ...);
        ``rebalance_every_s``: how often an idle replica may take half of the busiest one's
        samples (None: never; see :meth:`_rebalance`)."""
        if replicas < 1:
            raise ValueError(f"a pool needs at least one replica, got {replicas}")
        if max_restarts < 0 or hang_timeout_s <= 0 or check_every_s <= 0:
            raise ValueError("need max_restarts >= 0, hang_timeout_s > 0 and check_every_s > 0")
        self.config = config or EngineConfig(**overrides)
        check_backend(self.config)
        self.replicas, self.ray_address, self.strategy = replicas, ray_address, strategy
        self.max_restarts, self.hang_timeout_s, self.check_every_s = max_restarts, hang_timeout_s, check_every_s
        self.revive_timeout_s = revive_timeout_s
        self.rebalance_every_s = rebalance_every_s
        self.model_name = self.config.model or DEFAULT_MODEL
        self.version = 0
        self.vocab_size: int | None = None
        self.router = Router(replicas)
        #: the replicas each recent sample ran on, in order (more than one: it was moved off a dead one)
        self.routes: OrderedDict[str, list[int]] = OrderedDict()
        self.log = get_logger(actor="pool")
        self._slots: list[_ReplicaSlot] = []
        self._samples: dict[str, _Sample] = {}
        self._open = asyncio.Event()  # cleared while a weight update commits: new calls wait
        self._weights_lock = asyncio.Lock()
        self._weights = WeightBroadcast()
        self._paused = False
        self._owns_ray = False
        self._group: Any = None
        self._monitor: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._events_before: str | None = None

    # ------------------------------------------------------------------ life

    async def __aenter__(self) -> "RolloutPool":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Join or start Ray, place the replicas and start their engines (in parallel)."""
        ray = import_ray()
        began = time.perf_counter()
        if self.config.events_path:  # the pool's own events go where its replicas' do
            self._events_before = events_path()
            configure_events(self.config.events_path, console_level="warning")
        self.log = get_logger(actor="pool")  # a bound logger keeps the configuration it was made under
        self._open.set()
        self._owns_ray = join_ray(self.ray_address)
        # the replicas write where this process does (each node: that path on its own disk)
        config = replica_config(replace(self.config, events_path=self.config.events_path or events_path()),
                                self.replicas)
        resources = bundle(config)
        try:
            self._group = await place(self.replicas, resources, self.strategy)
            remote = ray.remote(Replica)
            self._slots = [_ReplicaSlot(remote.options(**actor_options(resources, self._group, i, self.max_restarts))
                                        .remote(i, config)) for i in range(self.replicas)]
            infos = await asyncio.gather(*(slot.handle.start.remote() for slot in self._slots))
        except BaseException:
            await self.close()
            raise
        for slot, info in zip(self._slots, infos):
            slot.state, slot.pid, slot.node = "up", info["pid"], info["node"]
        self.vocab_size = infos[0]["vocab_size"]
        self._monitor = asyncio.create_task(self._watch())
        if self.rebalance_every_s:
            self._spawn(self._balance())
        self.log.info("pool.started", replicas=self.replicas, resources=resources, strategy=self.strategy,
                      nodes=len({slot.node for slot in self._slots}), seconds=round(time.perf_counter() - began, 3))

    async def close(self) -> None:
        """Stop every replica (its engine first, then its Ray actor) and Ray, if the pool started it;
        samples still in flight get an error result."""
        ray = import_ray()
        if self._monitor is not None:
            self._monitor.cancel()
        for task in list(self._tasks):
            task.cancel()
        up = [slot for slot in self._slots if slot.state == "up"]
        if up:  # a replica that died unnoticed answers with an error: it is killed below all the same
            closing = asyncio.gather(*(_ref(slot.handle.close.remote()) for slot in up), return_exceptions=True)
            try:
                await asyncio.wait_for(closing, 30.0)
            except asyncio.TimeoutError:
                pass
        for slot in self._slots:
            ray.kill(slot.handle, no_restart=True)
        for rid in list(self._samples):
            self._resolve(failed_result(rid, self._samples[rid].job.prompt_ids, "the pool was closed"))
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None
        self._slots = []
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
        if self.config.events_path:
            configure_events(self._events_before, console_level="warning")

    # ------------------------------------------------------------------ calls

    async def generate(self, prompt_ids: Any, sampling_params: Params | None = None,
                       request_ids: Seq[str] | None = None, *, request_id: str | None = None,
                       group_ids: Seq[str] | None = None) -> Any:
        """As :meth:`RolloutEngine.generate`; ``group_ids`` (one per prompt): prompts that share a key
        run on one replica (a GRPO group sent as separate requests)."""
        call = normalise(prompt_ids, sampling_params, request_ids, request_id)
        submitted = await self._submit_call(call, group_ids)
        return call.shape(list(await asyncio.gather(*(future for _, future in submitted))))

    async def stream(self, prompt_ids: Any, sampling_params: Params | None = None,
                     request_ids: Seq[str] | None = None, *, request_id: str | None = None,
                     group_ids: Seq[str] | None = None) -> AsyncIterator[p.RequestResult]:
        """Like generate, but yields each sample's result as soon as it finishes."""
        submitted = await self.submit(prompt_ids, sampling_params, request_ids, request_id=request_id,
                                      group_ids=group_ids)
        async for result in as_finished(submitted):
            yield result

    async def stream_jobs(self, jobs: list[Job]) -> AsyncIterator[p.RequestResult]:
        """Like stream, for samples already expanded (``specactor rollout``)."""
        async for result in as_finished(await self.submit_jobs(jobs)):
            yield result

    async def submit(self, prompt_ids: Any, sampling_params: Params | None = None,
                     request_ids: Seq[str] | None = None, *, request_id: str | None = None,
                     group_ids: Seq[str] | None = None) -> list[tuple[str, asyncio.Future[p.RequestResult]]]:
        """Submit every sample (checked first, all or nothing): (sample's id, future of its result)."""
        return await self._submit_call(normalise(prompt_ids, sampling_params, request_ids, request_id), group_ids)

    async def _submit_call(self, call: Any, group_ids: Seq[str] | None
                           ) -> list[tuple[str, asyncio.Future[p.RequestResult]]]:
        group_ids = check_group_ids(call, group_ids)
        jobs = expand(call, vocab_size=self.vocab_size, max_len=self.config.max_len, default_seed=self.config.seed,
                      in_flight=self._samples, max_in_flight=self.config.max_in_flight * self.replicas)
        groups = None
        if group_ids is not None:
            key = dict(zip(dict.fromkeys(job.parent_id for job in jobs), group_ids))
            groups = [key[job.parent_id] for job in jobs]
        return await self.submit_jobs(jobs, groups)

    async def submit_jobs(self, jobs: list[Job], groups: list[str] | None = None,
                          ) -> list[tuple[str, asyncio.Future[p.RequestResult]]]:
        """Route samples already expanded: each group (default: the samples of one request) to one
        replica. Waits while a weight update commits, so every later result has the new weights."""
        if not self._slots:
            raise RuntimeError("the pool is not started")
        check_not_in_flight([job.request_id for job in jobs], self._samples)
        await self._open.wait()
        loop = asyncio.get_running_loop()
        samples = []
        for i, job in enumerate(jobs):
            sample = _Sample(job, groups[i] if groups else job.parent_id,
                             len(job.prompt_ids) + job.params.max_tokens, loop.create_future())
            self._samples[job.request_id] = sample
            samples.append(sample)
        await self._dispatch(samples)
        return [(sample.job.request_id, sample.future) for sample in samples]

    async def _dispatch(self, samples: list[_Sample]) -> None:
        """Route each group of ``samples`` and start it on its replica (waiting for one to be up)."""
        if not self._live() and not await self._wait_live():
            for sample in samples:
                self._resolve(failed_result(sample.job.request_id, sample.job.prompt_ids,
                                            "no replica of the pool is up: " + self._states()))
            return
        groups: dict[str, list[_Sample]] = {}
        for sample in samples:
            groups.setdefault(sample.group, []).append(sample)
        by_replica: dict[int, list[_Sample]] = {}
        for group, members in groups.items():
            replica = self.router.route(group, sum(s.tokens for s in members), self._live())
            by_replica.setdefault(replica, []).extend(members)
        for replica, members in by_replica.items():
            self._launch(replica, members)

    def _launch(self, replica: int, samples: list[_Sample]) -> None:
        slot = self._slots[replica]
        resume = {}
        for sample in samples:
            sample.replica, sample.moving_to = replica, None
            self.routes.setdefault(sample.job.request_id, []).append(replica)
            self.routes.move_to_end(sample.job.request_id)
            if sample.committed is not None:
                resume[sample.job.request_id] = sample.committed
        while len(self.routes) > ROUTES_KEPT:
            self.routes.popitem(last=False)
        stream = slot.handle.run.options(num_returns="streaming").remote(
            [s.job for s in samples], resume, self.config.progress_every_s)
        self._spawn(self._consume(replica, slot.generation, stream, [s.job.request_id for s in samples]))
        self.log.info("pool.dispatched", replica=replica, requests=len(samples),
                      groups=len({s.group for s in samples}), resumed=len(resume),
                      resumed_tokens=sum(len(c[1]) for c in resume.values()))

    async def _consume(self, replica: int, generation: int, stream: Any, request_ids: list[str]) -> None:
        """Deliver a replica's results and progress; if it dies, move what is left elsewhere."""
        ray = import_ray()
        try:
            async for ref in stream:
                kind, payload = await ref
                if kind == "result":
                    self._resolve(payload)
                else:
                    self._progress(payload)
        except ray.exceptions.RayTaskError as exc:  # the replica lives; the call raised
            for rid in request_ids:
                if rid in self._samples and self._samples[rid].replica == replica:
                    self._resolve(failed_result(rid, self._samples[rid].job.prompt_ids, f"replica {replica}: {exc}"))
            return
        except ray.exceptions.RayError as exc:
            self._failed(replica, generation, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        left = [self._samples[rid] for rid in request_ids
                if rid in self._samples and self._samples[rid].replica == replica]
        if left:
            self.log.warning("pool.rerouted", replica=replica, requests=len(left),
                             resumed=sum(s.committed is not None for s in left))
            await self._dispatch(left)

    def _resolve(self, result: p.RequestResult) -> None:
        sample = self._samples.get(result.request_id)
        if sample is None:
            return
        if sample.moving_to is not None and result.finish_reason == p.FinishReason.ABORT:
            self._move(sample, result)  # (had it finished first, its result would simply be delivered)
            return
        del self._samples[result.request_id]
        if sample.replica >= 0:
            self.router.finished(sample.replica, sample.tokens)
        if not sample.future.done():
            sample.future.set_result(result)

    def _move(self, sample: _Sample, aborted: p.RequestResult) -> None:
        """A sample the rebalancing aborted: continue it on its new replica from the tokens it
        committed (the abort's result carries them), or wherever the router says if that one is gone."""
        target, sample.moving_to = sample.moving_to, None
        self.router.finished(sample.replica, sample.tokens)
        sample.committed = (aborted.policy_version, list(aborted.token_ids), list(aborted.logprobs))
        if target is not None and self._slots[target].state == "up":
            self.router.outstanding[target] += sample.tokens
            self._launch(target, [sample])
        else:
            self._spawn(self._dispatch([sample]))

    async def _balance(self) -> None:
        while True:
            await asyncio.sleep(self.rebalance_every_s or 1.0)
            self._rebalance()

    def _rebalance(self) -> None:
        """The long tail, spread: when a replica has nothing to do and another runs several
        samples, half of those (the least advanced) continue on the idle one from their committed
        tokens, the same tokens as where they were. Not while a weight update commits."""
        live = self._live()
        if len(live) < 2 or not self._open.is_set():
            return
        running: dict[int, list[_Sample]] = {i: [] for i in live}
        for sample in self._samples.values():
            if sample.replica in running:
                running[sample.replica].append(sample)
        if any(s.moving_to is not None for group in running.values() for s in group):
            return  # one move at a time
        idle = [i for i in live if not running[i]]
        source = max(live, key=lambda i: len(running[i]))
        if not idle or len(running[source]) < 2:
            return
        ready = [s for s in running[source] if s.committed is not None and s.committed[0] == self.version]
        ready.sort(key=lambda s: len(s.committed[1]) if s.committed else 0)
        half = len(running[source]) // 2
        if len(ready) < half:  # some have not reported progress yet: next time
            return
        moving = ready[:half]
        for sample in moving:
            sample.moving_to = idle[0]
            self._spawn(_ref(self._slots[source].handle.abort.remote(sample.job.request_id)))
        self.log.info("pool.rebalanced", source=source, target=idle[0], requests=len(moving),
                      left=len(running[source]) - len(moving))

    def _progress(self, news: dict[str, tuple[int, int, list[int], list[float]]]) -> None:
        """Keep each sample's committed output (contiguous pieces of one weights version only)."""
        for rid, (version, start, tokens, logprobs) in news.items():
            sample = self._samples.get(rid)
            if sample is None:
                continue
            have = sample.committed
            if start == 0:
                sample.committed = (version, list(tokens), list(logprobs))
            elif have is not None and have[0] == version and start == len(have[1]):
                have[1].extend(tokens)  # in place: a long sample's record is not copied at every report
                have[2].extend(logprobs)

    async def abort(self, request_id: str) -> None:
        """Abort a sample wherever it runs (its result comes back with finish reason abort)."""
        sample = self._samples.get(request_id)
        if sample is None:
            return
        sample.moving_to = None  # the caller's abort wins over a move under way
        slot = self._slots[sample.replica]
        if slot.state == "up":
            await _ref(slot.handle.abort.remote(request_id))
        else:  # no replica holds it now (it is being moved off a dead one)
            self._resolve(failed_result(request_id, sample.job.prompt_ids, "aborted while its replica restarted",
                                        p.FinishReason.ABORT))

    # ------------------------------------------------------------------ replicas

    def _live(self) -> list[int]:
        return [i for i, slot in enumerate(self._slots) if slot.state == "up"]

    def _states(self) -> str:
        return ", ".join(f"replica {i} {slot.state}" for i, slot in enumerate(self._slots))

    async def _wait_live(self) -> bool:
        """Wait for a replica to be up; False if none will be (all down, or none within the timeout)."""
        deadline = time.monotonic() + self.revive_timeout_s
        while not self._live():
            if not self._slots or all(slot.state.startswith("down") for slot in self._slots) \
                    or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def _failed(self, replica: int, generation: int, why: str) -> None:
        """Replica ``replica`` died (or hung, and was killed): restart it, or give it up."""
        slot = self._slots[replica]
        if slot.generation != generation or slot.state != "up":
            return  # already known
        slot.generation += 1
        slot.deaths += 1
        self.router.forget(replica)
        if slot.deaths > self.max_restarts:
            slot.state = f"down: {why} (restarted {self.max_restarts} times already)"
            self.log.error("pool.replica_down", replica=replica, error=why, restarts=slot.deaths - 1)
            return
        slot.state = "restarting"
        self.log.warning("pool.replica_failed", replica=replica, error=why, restarts=slot.deaths,
                         in_flight=sum(1 for s in self._samples.values() if s.replica == replica))
        self._spawn(self._revive(replica))

    async def _revive(self, replica: int) -> None:
        """Ray restarts the actor; start its engine with the running weights, then route to it."""
        ray = import_ray()
        slot, began = self._slots[replica], time.perf_counter()
        deadline = time.monotonic() + self.revive_timeout_s
        error = ""
        while time.monotonic() < deadline:
            try:
                async with self._weights_lock:
                    path, chunks = self._weights.running
                    info = await slot.handle.start.remote(self.version, path, chunks)
                if self._paused:
                    await slot.handle.pause.remote()
            except ray.exceptions.RayActorError as exc:  # not restarted yet, or not restartable
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                await asyncio.sleep(0.5)
                continue
            except ray.exceptions.RayError as exc:
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                break
            slot.state, slot.pid, slot.node = "up", info["pid"], info["node"]
            self.log.info("pool.replica_restored", replica=replica, version=info["version"], pid=slot.pid,
                          seconds=round(time.perf_counter() - began, 3))
            return
        slot.state = f"down: could not be restarted: {error}"
        self.log.error("pool.replica_down", replica=replica, error=slot.state, restarts=slot.deaths)

    async def _watch(self) -> None:
        """Ping every live replica; one that does not answer within ``hang_timeout_s`` is hung:
        killed (Ray restarts it) and treated as dead."""
        while True:
            await asyncio.sleep(self.check_every_s)
            for i, slot in enumerate(self._slots):
                if slot.state == "up" and not slot.checking:
                    slot.checking = True
                    self._spawn(self._check(i, slot))

    async def _check(self, replica: int, slot: _ReplicaSlot) -> None:
        ray = import_ray()
        generation = slot.generation
        try:
            await asyncio.wait_for(_ref(slot.handle.ping.remote()), self.hang_timeout_s)
        except asyncio.TimeoutError:
            self.log.warning("pool.replica_hung", replica=replica, silent_for_s=self.hang_timeout_s)
            ray.kill(slot.handle, no_restart=False)
            self._failed(replica, generation, f"hung: no answer within {self.hang_timeout_s:g} s")
        except ray.exceptions.RayError as exc:
            self._failed(replica, generation, f"{type(exc).__name__}")
        finally:
            slot.checking = False

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ between RL steps

    async def update_weights(self, state_dict: Any = None, *, path: str | None = None, version: int | None = None,
                             in_flight: str = "finish", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
        """As :meth:`RolloutEngine.update_weights`, for every replica: the chunks go into Ray's object
        store once and each replica reads them there. ValueError if the replicas refuse it (then
        nothing changed)."""
        check_source(state_dict, path)
        next_version(in_flight, version, self.version)  # checked before any chunk is sent
        update_id = uuid.uuid4().hex
        if state_dict is not None:
            for chunk in chunk_state_dict(update_id, state_dict, chunk_bytes):
                await self.send_weights_chunk(chunk)
        return await self.commit_weights(update_id, version=version, in_flight=in_flight, path=path)

    async def send_weights_chunk(self, chunk: p.WeightsChunk) -> None:
        """Streaming form of update_weights: one chunk into the object store, to every live replica."""
        await self._weights.send(chunk, [self._slots[i].handle for i in self._live()])

    async def commit_weights(self, update_id: str, *, version: int | None = None, in_flight: str = "finish",
                             path: str | None = None) -> int:
        version = next_version(in_flight, version, self.version)
        began = time.perf_counter()
        await self._weights.delivered()
        async with self._weights_lock:
            self._open.clear()
            while any(s.moving_to is not None for s in self._samples.values()):  # moves finish on these weights
                await asyncio.sleep(0.01)
            try:
                live = self._live()
                if not live:
                    raise RuntimeError("no replica of the pool is up to load the update: " + self._states())
                answers = await asyncio.gather(*(_ref(self._slots[i].handle.commit_weights.remote(
                    update_id, version, in_flight, path)) for i in live), return_exceptions=True)
                took = [i for i, answer in zip(live, answers) if isinstance(answer, tuple) and answer[0]]
                if not took:
                    self._weights.refused(update_id)
                    refusal = next((a[1] for a in answers if isinstance(a, tuple)), None)
                    raise ValueError(str(refusal) if refusal
                                     else f"weight update failed on every replica: {answers[0]}")
                self.version = version
                self._weights.committed(update_id, path)
                for i, answer in zip(live, answers):
                    if i not in took:  # it keeps old weights: restarted, it loads the running ones
                        self.log.warning("pool.replica_failed", replica=i, error=f"refused an update the others took: "
                                         f"{answer}", restarts=self._slots[i].deaths + 1, in_flight=0)
                        import_ray().kill(self._slots[i].handle, no_restart=False)
                        self._failed(i, self._slots[i].generation, "refused an update the others took")
            finally:
                self._open.set()
        self.log.info("pool.weights_updated", version=version, replicas=len(took), path=path or "",
                      chunks=len(self._weights.running[1]), seconds=round(time.perf_counter() - began, 3))
        return version

    async def pause(self) -> None:
        """Every replica stops stepping after its current step; new requests queue."""
        self._paused = True
        await asyncio.gather(*(_ref(self._slots[i].handle.pause.remote()) for i in self._live()))

    async def resume(self) -> None:
        self._paused = False
        await asyncio.gather(*(_ref(self._slots[i].handle.resume.remote()) for i in self._live()))

    async def health(self) -> dict[str, Any]:
        """The pool's state and each replica's: up, restarting or down (and why)."""
        live = self._live()
        replicas = []
        for i, slot in enumerate(self._slots):
            there = [s for s in self._samples.values() if s.replica == i]
            replicas.append({"replica": i, "state": slot.state, "restarts": slot.deaths, "pid": slot.pid,
                             "node": slot.node, "in_flight": len(there),
                             # what its samples would continue from elsewhere, were it to die now
                             "committed_tokens": sum(len(s.committed[1]) for s in there if s.committed)})
        return {"ok": bool(live), "model": self.model_name, "mode": self.config.mode, "policy_version": self.version,
                "paused": self._paused, "in_flight": len(self._samples), "replicas_up": len(live),
                "replicas": replicas, "verifier": "up" if live else "down"}

    async def stats(self, timeout_s: float = 5.0) -> dict[str, dict[str, float]]:
        """Each live replica's counters under ``replica{i}/{actor}``, and their sums under each actor's name."""
        live = self._live()
        answers = await asyncio.gather(*(asyncio.wait_for(_ref(self._slots[i].handle.stats.remote()), timeout_s)
                                         for i in live), return_exceptions=True)
        out: dict[str, dict[str, float]] = {}
        for i, answer in zip(live, answers):
            if not isinstance(answer, dict):
                continue
            for actor, values in answer.items():
                out[f"replica{i}/{actor}"] = dict(values)
                total = out.setdefault(actor, {})
                for key, value in values.items():
                    total[key] = total.get(key, 0.0) + float(value)
        return out


async def _ref(ref: Any) -> Any:
    """Await a Ray object ref (a coroutine, for asyncio.wait_for and gather)."""
    return await ref
