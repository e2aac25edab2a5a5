"""RolloutClient: the RolloutEngine API against a running ``specactor serve`` daemon.

    async with RolloutClient("tcp://127.0.0.1:5557") as client:
        results = await client.generate([[1, 2, 3]], SamplingParams(temperature=1.0, n=4))
        version = await client.update_weights(model.state_dict())

One DEALER socket; a background task routes each reply to its call by
``call_id``. While calls are outstanding the client sends heartbeats, so a
daemon can tell a client that died from one that waits for a long rollout.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any, AsyncIterator, Sequence as Seq

import msgspec
import zmq
import zmq.asyncio

from specactor import protocol as p
from specactor.calls import Call, Params, check_group_ids, normalise
from specactor.server import api
from specactor.server.daemon import DEFAULT_ENDPOINT, MAX_CALL_BYTES
from specactor.server.security import ClientKeys
from specactor.weight_update import DEFAULT_CHUNK_BYTES, check_source, chunk_state_dict


class RemoteError(ValueError):
    """The daemon refused a call; the message says why (bad input, shutting down, ...)."""


class RolloutClient:
    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, heartbeat_s: float = 1.0,
                 timeout_s: float | None = 600.0, keys: ClientKeys | None = None) -> None:
        """``timeout_s``: how long to wait for any single reply (a generate call's next sample,
        a commit's answer) before TimeoutError; None waits forever. Finite by default, so that a
        daemon that died or dropped a call cannot hang the caller. ``keys``: this client's key pair
        and the daemon's public key, for a daemon started with ``--server-key`` (a daemon that does
        not know the key answers nothing: calls end in TimeoutError)."""
        self.endpoint, self.heartbeat_s, self.timeout_s = endpoint, heartbeat_s, timeout_s
        self.keys = keys
        self._holding_pause = False  # a daemon paused by us resumes if our heartbeats stop
        self._sock: zmq.asyncio.Socket | None = None
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Queue[api.Reply]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> "RolloutClient":
        self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def connect(self) -> None:
        if self._sock is not None:
            return
        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:
            self.keys.secure(sock)
        sock.connect(self.endpoint)
        self._sock = sock
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._heartbeat())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # ------------------------------------------------------------------ plumbing

    async def _receive(self) -> None:
        assert self._sock is not None
        while True:
            body = await self._sock.recv()
            reply = api.decode_reply(body)
            queue = self._calls.get(reply.call_id) if reply.call_id is not None else None
            if queue is not None:
                queue.put_nowait(reply)

    async def _heartbeat(self) -> None:
        assert self._sock is not None
        beat = api.encode(api.Heartbeat(call_id=0))
        while True:
            await asyncio.sleep(self.heartbeat_s)
            if self._calls or self._holding_pause:
                await self._sock.send(beat)

    def _socket(self) -> zmq.asyncio.Socket:
        if self._sock is None:
            raise RuntimeError("the client is not connected: use 'async with RolloutClient(...)' or connect()")
        return self._sock

    async def _send(self, msg: msgspec.Struct) -> None:
        """Send one call; ValueError if it is over the daemon's frame limit (ZeroMQ would drop it
        silently and the call would never be answered)."""
        body = api.encode(msg)
        if len(body) > MAX_CALL_BYTES:
            raise ValueError(f"a call of {len(body)} bytes is over the daemon's limit of {MAX_CALL_BYTES}: send "
                             f"fewer prompts per call (or smaller weight chunks)")
        await self._socket().send(body)

    def _open(self) -> tuple[int, asyncio.Queue[api.Reply]]:
        self._socket()
        call_id = next(self._ids)
        queue: asyncio.Queue[api.Reply] = asyncio.Queue()
        self._calls[call_id] = queue
        return call_id, queue

    async def _next(self, queue: asyncio.Queue[api.Reply]) -> api.Reply:
        try:
            reply = await asyncio.wait_for(queue.get(), self.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no reply from the daemon at {self.endpoint} within {self.timeout_s} s") from None
        if isinstance(reply, api.Failure):
            raise RemoteError(reply.error)
        return reply

    async def _call(self, make: Any) -> Any:
        """Send ``make(call_id)`` and return its ``done`` value."""
        call_id, queue = self._open()
        try:
            await self._send(make(call_id))
            reply = await self._next(queue)
            return reply.value if isinstance(reply, api.Done) else None
        finally:
            self._calls.pop(call_id, None)

    # ------------------------------------------------------------------ the engine's API

    async def stream_indexed(self, prompt_ids: Any, sampling_params: Params | None = None,
                             request_ids: Seq[str] | None = None, model: str | None = None, *,
                             request_id: str | None = None, group_ids: Seq[str] | None = None,
                             ) -> AsyncIterator[tuple[int, p.RequestResult]]:
        """(index in input order, result) for every sample, as each finishes."""
        call = normalise(prompt_ids, sampling_params, request_ids, request_id)
        async for item in self._stream(call, model, check_group_ids(call, group_ids)):
            yield item

    async def _stream(self, call: Call, model: str | None, group_ids: list[str] | None = None,
                      ) -> AsyncIterator[tuple[int, p.RequestResult]]:
        call_id, queue = self._open()
        try:
            await self._send(api.Generate(call_id=call_id, prompt_ids=call.prompt_ids, sampling_params=call.params,
                                          request_ids=call.request_ids, model=model, group_ids=group_ids))
            while True:
                reply = await self._next(queue)
                if isinstance(reply, api.Done):
                    return
                assert isinstance(reply, api.Result)
                yield reply.index, reply.result
        finally:
            self._calls.pop(call_id, None)

    async def stream(self, prompt_ids: Any, sampling_params: Params | None = None,
                     request_ids: Seq[str] | None = None, model: str | None = None, *,
                     request_id: str | None = None, group_ids: Seq[str] | None = None,
                     ) -> AsyncIterator[p.RequestResult]:
        """Like generate (either form), but yields each sample's result as soon as it finishes."""
        async for _, result in self.stream_indexed(prompt_ids, sampling_params, request_ids, model,
                                                   request_id=request_id, group_ids=group_ids):
            yield result

    async def generate(self, prompt_ids: Any, sampling_params: Params | None = None,
                       request_ids: Seq[str] | None = None, model: str | None = None, *,
                       request_id: str | None = None, group_ids: Seq[str] | None = None) -> Any:
        """As :meth:`RolloutEngine.generate`: batch form -> every sample's result in input order;
        single form ``generate(ids, params, request_id="x")`` -> one result (``n == 1``) or the n.
        ``group_ids``: one per prompt; a daemon serving a pool runs prompts sharing one together."""
        call = normalise(prompt_ids, sampling_params, request_ids, request_id)
        results: dict[int, p.RequestResult] = {}
        async for index, result in self._stream(call, model, check_group_ids(call, group_ids)):
            results[index] = result
        return call.shape([results[i] for i in sorted(results)])

    async def abort(self, request_id: str) -> None:
        await self._call(lambda call_id: api.Abort(call_id=call_id, request_id=request_id))

    async def update_weights(self, state_dict: Any = None, *, path: str | None = None, version: int | None = None,
                             in_flight: str = "finish", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
        """As :meth:`RolloutEngine.update_weights`; a ``path`` must be readable by the daemon."""
        check_source(state_dict, path)
        update_id = uuid.uuid4().hex
        if state_dict is not None:
            for chunk in chunk_state_dict(update_id, state_dict, chunk_bytes):
                await self._send(api.WeightsChunk(call_id=0, chunk=chunk))
        return await self._call(lambda call_id: api.CommitWeights(
            call_id=call_id, update_id=update_id, version=version, in_flight=in_flight, path=path))

    async def pause(self) -> None:
        """Pause the daemon. It stays paused while this client lives (its heartbeats go on until
        :meth:`resume`); if they stop, the daemon resumes by itself."""
        await self._call(lambda call_id: api.Pause(call_id=call_id))
        self._holding_pause = True

    async def resume(self) -> None:
        await self._call(lambda call_id: api.Resume(call_id=call_id))
        self._holding_pause = False

    async def health(self) -> dict[str, Any]:
        return await self._call(lambda call_id: api.Health(call_id=call_id))

    async def stats(self) -> dict[str, dict[str, float]]:
        return await self._call(lambda call_id: api.Stats(call_id=call_id))
