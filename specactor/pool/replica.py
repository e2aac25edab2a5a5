"""One replica of a pool: a Ray actor that owns a RolloutEngine.

The engine is what it is on one machine (its verifier and model drafters in
processes of their own, the cheap drafters and the policy beside it); the
replica only adapts its calls to Ray: ``run`` is a streaming generator that
yields each sample's result as it finishes and, in between, what unfinished
samples have committed, so that the pool can continue them on another replica
if this one dies. Ray re-creates a dead replica (``max_restarts``) by calling
its constructor again; the pool then calls :meth:`Replica.start` with the
running weights before it routes anything to it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, AsyncIterator

import msgspec

from specactor import protocol as p
from specactor.calls import Job
from specactor.config import EngineConfig
from specactor.events import REPLICA_ENV, get_logger
from specactor.rollout_engine import RolloutEngine

#: committed output of a sample: (weights version, tokens, log-probs)
Committed = tuple[int, list[int], list[float]]
#: what ``run`` yields: ("result", RequestResult) or ("progress", {sample id: (version, start, tokens, log-probs)})
Update = tuple[str, Any]


class Replica:
    """A RolloutEngine behind a Ray actor (see the module docstring)."""

    def __init__(self, index: int, config: EngineConfig) -> None:
        os.environ[REPLICA_ENV] = str(index)  # before the engine configures events: its children inherit it
        self.index, self.config = index, config
        self.engine: RolloutEngine | None = None
        self.log = get_logger(actor=f"replica-{index}")

    async def start(self, version: int = 0, path: str = "", chunks: list[Any] | None = None) -> dict[str, Any]:
        """Start the engine and load the pool's running weights (version ``version``, from the
        checkpoint ``path`` or the object-store ``chunks``) before anything is routed here."""
        if self.engine is None:
            engine = RolloutEngine(self.config)
            await engine.start()
            self.engine = engine
        engine = self.engine
        if version > engine.version:
            update_id = f"restore-{self.index}-{version}"
            for ref in chunks or []:
                chunk = from_store(await ref)
                await engine.send_weights_chunk(msgspec.structs.replace(chunk, update_id=update_id))
            await engine.commit_weights(update_id, version=version, path=path or None)
        return {"pid": os.getpid(), "vocab_size": engine.vocab_size, "model": engine.model_name,
                "version": engine.version, "node": _node_ip()}

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError(f"replica {self.index} has not started")
        return self.engine

    async def ping(self) -> dict[str, Any]:
        """Liveness, answered from the replica's event loop (a hung loop does not answer)."""
        engine = self.engine
        return {"started": engine is not None, "pid": os.getpid(),
                "in_flight": len(engine.coordinator.pending) if engine else 0,
                "version": engine.version if engine else 0}

    async def run(self, jobs: list[Job], resume: dict[str, Committed], progress_every_s: float = 1.0,
                  ) -> AsyncIterator[Update]:
        """Run ``jobs`` (continuing any in ``resume``); yield each result as it finishes, and every
        ``progress_every_s`` the output committed since the last report."""
        engine = self._engine()
        submitted = await engine.submit_jobs(jobs, resume)
        futures = {future: rid for rid, future in submitted}
        reported: dict[str, tuple[int, int]] = {rid: (c[0], len(c[1])) for rid, c in resume.items()}
        while futures:
            done, _ = await asyncio.wait(futures, timeout=progress_every_s, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                futures.pop(future)
                yield ("result", future.result())
            news = _news(engine.committed(list(futures.values())), reported)
            if news:
                yield ("progress", news)

    async def abort(self, request_id: str) -> None:
        await self._engine().abort(request_id)

    async def weights_chunk(self, stored: "StoredChunk") -> None:
        await self._engine().send_weights_chunk(from_store(stored))

    async def commit_weights(self, update_id: str, version: int, in_flight: str, path: str | None
                             ) -> tuple[bool, int | str]:
        """(True, version) or (False, why): the pool decides what a refusal means for the pool."""
        try:
            return True, await self._engine().commit_weights(update_id, version=version, in_flight=in_flight,
                                                             path=path)
        except ValueError as exc:
            return False, str(exc)

    async def pause(self) -> None:
        await self._engine().pause()

    async def resume(self) -> None:
        await self._engine().resume()

    async def health(self) -> dict[str, Any]:
        return await self._engine().health()

    async def stats(self) -> dict[str, dict[str, float]]:
        return await self._engine().stats()

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
            self.engine = None


#: a weight chunk as the object store holds it: its header, and its bytes as an array (which Ray
#: maps into a reader's memory instead of copying it, as it would the bytes of a pickled message)
StoredChunk = tuple[p.WeightsChunk, Any]


def to_store(chunk: p.WeightsChunk) -> StoredChunk:
    import numpy as np

    return msgspec.structs.replace(chunk, data=b""), np.frombuffer(chunk.data, dtype=np.uint8)


def from_store(stored: StoredChunk) -> p.WeightsChunk:
    header, data = stored
    return msgspec.structs.replace(header, data=memoryview(data))  # encoded as bytes on its way on


def _news(committed: dict[str, Committed], reported: dict[str, tuple[int, int]],
          ) -> dict[str, tuple[int, int, list[int], list[float]]]:
    """What was committed since the last report, per sample: (version, start, tokens, log-probs);
    from the start again when the version changed or the output shrank (a restart of the verifier)."""
    news = {}
    for rid, (version, tokens, logprobs) in committed.items():
        seen_version, seen = reported.get(rid, (version, 0))
        start = seen if seen_version == version and seen <= len(tokens) else 0
        if start < len(tokens) or start == 0 and seen:
            news[rid] = (version, start, tokens[start:], logprobs[start:])
            reported[rid] = (version, len(tokens))
    return news


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (a replica built directly, as the tests do)
        return ""
