"""Small reference actors for tests, health checks and transport benchmarks.

They live in the package (not in tests/) because child processes import them
by path; ``bench/transport.py`` uses them to measure the transports.
"""

from __future__ import annotations

import asyncio
import os
import time

from specactor import protocol as p
from specactor.actor.base import Actor


class Echo(Actor):
    """Sends every message back to its sender."""

    async def handle(self, sender: str, msg: p.Message) -> None:
        await self.send(sender, msg)


class Collector(Actor):
    """Keeps what it receives in a queue and counts Payloads (in-process use)."""

    def __init__(self, name: str, delay_s: float = 0.0, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.delay_s = delay_s
        self.count = 0
        self.received: asyncio.Queue[tuple[str, p.Message]] = asyncio.Queue()
        self.keep = True

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Payload):
            self.count += 1
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if not self.keep:
                return
        if isinstance(msg, p.StatsRequest):
            await self.send(sender, p.StatsReply(name=self.name, values={"count": self.count}))
            return
        await self.received.put((sender, msg))

    async def on_peer_down(self, name: str, reason: str, restarting: bool = False) -> None:
        await self.received.put(("supervisor", p.PeerDown(name=name, reason=reason, restarting=restarting)))

    async def on_error(self, sender: str, error: p.Error) -> None:
        await self.received.put((sender, error))


class Producer(Actor):
    """On ``Payload(seq=N)`` sends N payloads of ``size`` bytes to ``target``."""

    def __init__(self, name: str, target: str, size: int = 16, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.target = target
        self.data = b"x" * size
        self.sent = 0
        self.done_at = 0.0  # wall clock when the last burst was handed over (comparable across processes)

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.StatsRequest):
            await self.send(sender, p.StatsReply(name=self.name, values={"sent": self.sent, "done_at": self.done_at}))
        elif isinstance(msg, p.Payload):
            for i in range(msg.seq):
                await self.send(self.target, p.Payload(seq=i, data=self.data))
                self.sent += 1
            self.done_at = time.time()


class Sink(Actor):
    """Counts payloads and answers StatsRequest; for throughput runs in a child."""

    def __init__(self, name: str, delay_s: float = 0.0, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.delay_s = delay_s
        self.count = 0
        self.first_ns = 0
        self.last_ns = 0

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Payload):
            now = time.perf_counter_ns()
            self.first_ns = self.first_ns or now
            self.last_ns = now
            self.count += 1
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        elif isinstance(msg, p.StatsRequest):
            await self.send(sender, p.StatsReply(name=self.name, values={
                "count": self.count, "first_ns": self.first_ns, "last_ns": self.last_ns}))


class Pinger(Actor):
    """Ping-pongs with ``target`` ``count`` times, timing each round trip.

    Started by a ``Payload`` from ``starter``; reports the round trips (µs)
    back to it as a StatsReply with keys ``"0".."count-1"``.
    """

    def __init__(self, name: str, target: str, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.target = target
        self.samples_us: list[float] = []
        self._left = 0
        self._starter = ""
        self._sent_ns = 0

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Payload):
            self._left, self._starter, self.samples_us = msg.seq, sender, []
        elif isinstance(msg, p.Pong):
            self.samples_us.append((time.perf_counter_ns() - self._sent_ns) / 1000)
            self._left -= 1
        if self._left > 0:
            self._sent_ns = time.perf_counter_ns()
            await self.send(self.target, p.Ping(seq=self._left))
        elif isinstance(msg, p.Pong):
            values = {str(i): v for i, v in enumerate(self.samples_us)}
            await self.send(self._starter, p.StatsReply(name=self.name, values=values))


class Hanger(Actor):
    """Blocks its own event loop on any Payload: a deliberately hung actor."""

    async def handle(self, sender: str, msg: p.Message) -> None:
        time.sleep(3600)


class LoopFailer(Actor):
    """Runs a background loop that raises on ``Payload(seq=1)`` and exits the process on
    ``Payload(seq=2)``; answers StatsRequest with its pid. A victim for supervision tests."""

    async def on_start(self) -> None:
        self._fail = asyncio.Event()
        self.start_loop(self._loop())

    async def _loop(self) -> None:
        await self._fail.wait()
        raise RuntimeError("the loop failed on purpose")

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Payload) and msg.seq == 1:
            self._fail.set()
        elif isinstance(msg, p.Payload) and msg.seq == 2:
            os._exit(3)
        elif isinstance(msg, p.StatsRequest):
            await self.send(sender, p.StatsReply(name=self.name, values={"pid": os.getpid()}))


class Rejecter(Actor):
    """Every handler raises (so every message is answered with an Error); counts the Errors it
    gets. Two of them must not bounce Errors between each other."""

    def __init__(self, name: str, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.errors = 0

    async def handle(self, sender: str, msg: p.Message) -> None:
        raise ValueError(f"{self.name} takes nothing")

    async def on_error(self, sender: str, error: p.Error) -> None:
        self.errors += 1
        await super().on_error(sender, error)
