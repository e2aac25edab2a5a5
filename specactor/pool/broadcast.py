"""A weight update's chunks in Ray's object store: put once, read by every replica.

Each chunk goes into the object store once (its bytes as an array, which a
replica on the same node maps instead of copying); every live replica is sent
its reference, up to :data:`CHUNKS_IN_FLIGHT` at a time (the replicas stage
chunks by offset, in any order). The running update's references are kept, so
that a replica Ray restarts loads the same weights from the store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from specactor import protocol as p
from specactor.pool.placement import import_ray
from specactor.pool.replica import to_store

#: weight chunks on their way to each replica at once (each ~DEFAULT_CHUNK_BYTES)
CHUNKS_IN_FLIGHT = 8


class WeightBroadcast:
    """The chunks of the update being sent, and of the one running (see the module docstring)."""

    def __init__(self) -> None:
        self.running: tuple[str, list[Any]] = ("", [])  # the running update: (checkpoint path, chunk refs)
        self._staging: dict[str, list[Any]] = {}
        self._sending: list[asyncio.Future[Any]] = []  # deliveries not yet confirmed

    async def send(self, chunk: p.WeightsChunk, replicas: list[Any]) -> None:
        """Put ``chunk`` into the store and send its reference to each of ``replicas`` (Ray actor
        handles); returns once few enough deliveries are under way."""
        if chunk.update_id not in self._staging:
            self._staging = {chunk.update_id: []}  # one update is sent at a time: an earlier one was abandoned
        ref = import_ray().put(to_store(chunk))
        self._staging[chunk.update_id].append(ref)
        self._sending.extend(asyncio.ensure_future(_delivery(handle.weights_chunk.remote(ref))) for handle in replicas)
        while len(self._sending) > CHUNKS_IN_FLIGHT * max(1, len(replicas)):
            await asyncio.wait([self._sending.pop(0)])

    async def delivered(self) -> None:
        """Every chunk sent so far has reached its replicas (or its replica died: a replica that
        died here is restored with the running weights)."""
        sending, self._sending = self._sending, []
        if sending:
            await asyncio.wait(sending)
            for task in sending:
                task.exception()  # retrieved

    def committed(self, update_id: str, path: str | None) -> None:
        """The update ``update_id`` runs now: keep its chunks for restarts, forget the rest."""
        self.running = (path or "", self._staging.pop(update_id, []))
        self._staging.clear()

    def refused(self, update_id: str) -> None:
        self._staging.pop(update_id, None)


async def _delivery(ref: Any) -> Any:
    return await ref
