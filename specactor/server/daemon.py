"""``specactor serve``: a RolloutEngine (or a RolloutPool of them) behind a ZeroMQ ROUTER socket.

IO is separate from the engine's busy loop: this coroutine only decodes calls,
hands them to the engine (whose verifier runs in its own process) and sends
replies. Every call is checked before anything is submitted, and any bad call
is answered with a :class:`~specactor.server.api.Failure` naming the problem
while everyone else is served. A client that disappears (its heartbeats stop,
or a reply cannot be delivered) has its requests aborted, so it leaks nothing.
On SIGTERM the daemon stops accepting work, lets running requests finish for
up to ``drain_timeout_s``, aborts the rest and delivers every result before
it exits: nothing accepted is silently lost.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from specactor import protocol as p
from specactor.rollout_engine import RolloutEngine
from specactor.events import get_logger
from specactor.server import api
from specactor.server.security import ServerKeys, WeightPaths, is_loopback

if TYPE_CHECKING:
    from specactor.pool import RolloutPool

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
MAX_CALL_BYTES = 64 << 20


class RolloutServer:
    def __init__(self, engine: "RolloutEngine | RolloutPool", endpoint: str = DEFAULT_ENDPOINT, *,
                 client_timeout_s: float = 10.0,
                 drain_timeout_s: float = 30.0, keys: ServerKeys | None = None,
                 weight_paths: WeightPaths | None = None) -> None:
        """``keys``: serve only clients holding a key in ``keys.client_keys`` (CURVE); ``weight_paths``:
        where update files may be read (default: anywhere on loopback, nowhere beyond it)."""
        self.engine, self.endpoint = engine, endpoint
        self.keys, self._auth = keys, None
        self.weight_paths = weight_paths or WeightPaths(reachable=not is_loopback(endpoint))
        self.client_timeout_s, self.drain_timeout_s = client_timeout_s, drain_timeout_s
        self.log = get_logger(actor="server")
        self.sock: zmq.asyncio.Socket | None = None
        self.draining = False
        self.owned: dict[bytes, set[str]] = {}  # client identity -> its request ids in flight
        self.last_seen: dict[bytes, float] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        self.paused_by: bytes | None = None  # the client whose pause holds: resumed if it goes

    def bind(self) -> str:
        """Bind the socket; returns the endpoint actually bound (resolves port 0 / ``*``)."""
        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unreachable client raises instead of dropping
        # ZeroMQ drops what is over its limit without a word, so its limit is above ours: a call
        # over ours is answered with a Failure; only one over twice ours is cut off
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * MAX_CALL_BYTES)
        sock.setsockopt(zmq.LINGER, 2000)
        if self.keys is not None:
            self._auth = self.keys.secure(sock)
        sock.bind(self.endpoint)
        self.sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.endpoint

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then shut down gracefully."""
        if self.sock is None:
            self.bind()
        assert self.sock is not None
        self.log.info("server.ready", endpoint=self.endpoint, model=self.engine.model_name,
                      mode=self.engine.config.mode)
        reaper = asyncio.create_task(self._reap_silent_clients())
        stopping = asyncio.create_task(stop.wait())
        try:
            while True:
                receiving = asyncio.ensure_future(self.sock.recv_multipart(copy=False))
                done, _ = await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if receiving not in done:
                    receiving.cancel()
                    break
                frames = receiving.result()
                identity = bytes(frames[0].buffer)
                if identity in self.owned or identity == self.paused_by:  # only they must keep beating
                    self.last_seen[identity] = time.monotonic()
                if len(frames) != 2:  # ROUTER adds the identity: a DEALER's call is one frame
                    self._spawn(self._fail(identity, None, f"a call is one frame, got {len(frames) - 1}"))
                    continue
                await self._dispatch(identity, bytes(frames[1].buffer))
            await self._shutdown()
        finally:
            reaper.cancel()
            stopping.cancel()
            self.sock.close()
            if self._auth is not None:
                self._auth.stop()

    # ------------------------------------------------------------------ calls

    async def _dispatch(self, identity: bytes, body: bytes) -> None:
        if len(body) > MAX_CALL_BYTES:
            self._spawn(self._fail(identity, api.call_id_of(body), f"a call of {len(body)} bytes is over the "
                                                                   f"limit of {MAX_CALL_BYTES}"))
            return
        try:
            call = api.decode_call(body)
        except ValueError as exc:
            self._spawn(self._fail(identity, api.call_id_of(body), str(exc)))
            return
        if isinstance(call, api.Heartbeat):
            return
        self.calls += 1
        if isinstance(call, api.WeightsChunk):
            # forwarded before the next call is read: the engine's backpressure paces the
            # client, instead of hundreds of megabytes piling up in this process
            await self._run(identity, call)
        else:
            self._spawn(self._run(identity, call))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, identity: bytes, call: api.Call) -> None:
        try:
            value = await self._answer(identity, call)
        except (ValueError, TypeError, RuntimeError, OSError, KeyError) as exc:
            await self._fail(identity, call.call_id, str(exc))
        except Exception as exc:  # the daemon survives anything one call does
            await self._fail(identity, call.call_id, f"internal error: {type(exc).__name__}: {exc}")
        else:
            if not isinstance(call, api.WeightsChunk):  # chunks are answered only if they fail
                await self._reply(identity, api.Done(call_id=call.call_id, value=value))

    async def _answer(self, identity: bytes, call: api.Call) -> Any:
        engine = self.engine
        if isinstance(call, api.Generate):
            return await self._generate(identity, call)
        if isinstance(call, api.Abort):
            await engine.abort(call.request_id)
            return None
        if isinstance(call, api.WeightsChunk):
            await engine.send_weights_chunk(call.chunk)
            return None
        if isinstance(call, api.CommitWeights):
            if call.path:
                self.weight_paths.check(call.path)
            return await engine.commit_weights(call.update_id, version=call.version, in_flight=call.in_flight,
                                               path=call.path)
        if isinstance(call, api.Pause):
            await engine.pause()
            self.paused_by = identity
            self.last_seen[identity] = time.monotonic()
            return None
        if isinstance(call, api.Resume):
            await engine.resume()
            if self.paused_by is not None and self.paused_by not in self.owned:
                self.last_seen.pop(self.paused_by, None)
            self.paused_by = None
            return None
        if isinstance(call, api.Health):
            return {**await engine.health(), "draining": self.draining, "clients": len(self.owned)}
        if isinstance(call, api.Stats):
            return await engine.stats()
        raise TypeError(f"unhandled call kind {type(call).__name__}")

    async def _generate(self, identity: bytes, call: api.Generate) -> int:
        if self.draining:
            raise RuntimeError("the daemon is shutting down: no new requests")
        if call.model is not None and call.model != self.engine.model_name:
            raise ValueError(f"unknown model {call.model!r}: this daemon serves {self.engine.model_name!r}")
        submitted = await self.engine.submit(call.prompt_ids, call.sampling_params, call.request_ids,
                                             group_ids=call.group_ids)
        owned = self.owned.setdefault(identity, set())
        owned.update(rid for rid, _ in submitted)
        self.last_seen[identity] = time.monotonic()
        finished: asyncio.Queue[tuple[int, p.RequestResult]] = asyncio.Queue()
        for i, (_, future) in enumerate(submitted):
            future.add_done_callback(lambda f, i=i: finished.put_nowait((i, f.result())))
        try:
            for _ in submitted:
                i, result = await finished.get()
                owned.discard(result.request_id)
                await self._reply(identity, api.Result(call_id=call.call_id, index=i, result=result))
        finally:
            owned.difference_update(rid for rid, _ in submitted)
            if not owned:  # per-client state lives while the client has something here, no longer
                self.owned.pop(identity, None)
                if identity != self.paused_by:
                    self.last_seen.pop(identity, None)
        return len(submitted)

    # ------------------------------------------------------------------ replies and clients

    async def _fail(self, identity: bytes, call_id: int | None, error: str) -> None:
        self.log.warning("server.call_failed", call_id=call_id, error=error)
        await self._reply(identity, api.Failure(call_id=call_id, error=error))

    async def _reply(self, identity: bytes, reply: api.Reply) -> None:
        if self.sock is None or self.sock.closed:
            return
        try:
            await self.sock.send_multipart([identity, api.encode(reply)])
        except zmq.ZMQError:  # EHOSTUNREACH: the client is gone
            await self._client_gone(identity, "reply undeliverable")

    async def _client_gone(self, identity: bytes, why: str) -> None:
        owned = self.owned.pop(identity, set())
        self.last_seen.pop(identity, None)
        if identity == self.paused_by:  # nobody else could ever resume it
            self.paused_by = None
            self.log.warning("server.pause_released", why=why)
            await self.engine.resume()
        if owned:
            self.log.warning("server.client_gone", why=why, aborted=len(owned))
        for request_id in owned:
            await self.engine.abort(request_id)

    async def _reap_silent_clients(self) -> None:
        """A client with requests in flight sends heartbeats; one that stops is gone."""
        while True:
            await asyncio.sleep(min(1.0, self.client_timeout_s / 4))
            now = time.monotonic()
            holders = set(self.owned) | ({self.paused_by} if self.paused_by is not None else set())
            for identity in holders:
                if now - self.last_seen.get(identity, now) > self.client_timeout_s:
                    await self._client_gone(identity, f"silent for more than {self.client_timeout_s:g} s")

    async def _shutdown(self) -> None:
        """Refuse new work; let running requests finish (bounded), abort the rest, deliver everything."""
        self.draining = True
        in_flight = sum(len(ids) for ids in self.owned.values())
        self.log.info("server.draining", in_flight=in_flight, drain_timeout_s=self.drain_timeout_s)
        deadline = time.monotonic() + self.drain_timeout_s
        while self.owned and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        aborted = 0
        for ids in list(self.owned.values()):
            for request_id in list(ids):
                await self.engine.abort(request_id)
                aborted += 1
        if self.tasks:  # every generate call delivers its results (aborted ones too), then its done
            await asyncio.wait(set(self.tasks), timeout=30.0)
        self.log.info("server.shutdown", calls=self.calls, in_flight=in_flight, aborted=aborted)


async def serve(engine: "RolloutEngine | RolloutPool", endpoint: str = DEFAULT_ENDPOINT, *,
                client_timeout_s: float = 10.0,
                drain_timeout_s: float = 30.0, stop: asyncio.Event | None = None,
                on_ready: Any = None, keys: ServerKeys | None = None,
                weight_paths: WeightPaths | None = None) -> None:
    """Run ``engine`` (already started; a RolloutPool too) as a daemon until ``stop`` is set.

    ``on_ready(endpoint)`` is called once the socket is bound. ``keys`` and ``weight_paths``: see
    :class:`RolloutServer`.
    """
    server = RolloutServer(engine, endpoint, client_timeout_s=client_timeout_s, drain_timeout_s=drain_timeout_s,
                           keys=keys, weight_paths=weight_paths)
    bound = server.bind()
    if on_ready is not None:
        on_ready(bound)
    await server.serve(stop or asyncio.Event())
