"""ZeroMQ endpoints of one actor: a bound PULL inbox and PUSH outboxes.

High-water marks bound every ZeroMQ queue (in messages). Beyond them, a
message to a peer that is not reading goes to that peer's spill queue, kept
in order and bounded in bytes (``spill_bytes``), which a background task
feeds to ZeroMQ as the peer reads again: so a busy loop (the verifier's
steps) never waits on a reader that stopped for a while (a host loop that
trains), and messages to one peer keep their order. Only when the spill is
full does ``send`` wait: that wait is the backpressure that keeps memory
bounded. Advisory sends (``timeout_ms=0``) never spill: they are dropped.

Sockets are plain (non-asyncio) ZeroMQ sockets driven by :class:`Readiness`:
operations are tried with NOBLOCK first (no future per message on the hot
path) and only on EAGAIN does a task sleep on the socket's notification fd.
ZeroMQ's fd is edge-triggered, so readiness is always re-checked through
``ZMQ_EVENTS`` before sleeping; sleeping on the fd alone loses wake-ups.
"""

from __future__ import annotations

import asyncio
from collections import deque

import zmq

#: Frames handled per wake-up of the receive loop before yielding to others.
RECV_BURST = 256
#: ... and at most this many bytes: taking hundreds of megabytes at once (a weight
#: update's chunks) would keep the event loop, and so the heartbeat, away for seconds.
RECV_BURST_BYTES = 16 << 20


class Readiness:
    """Awaitable POLLIN/POLLOUT readiness of one socket, shared by many tasks.

    The fd stays registered with the event loop for the socket's lifetime (no
    epoll_ctl per wait); a wake-up with nobody waiting just reads ZMQ_EVENTS,
    which clears the fd so a level-triggered loop does not spin on it.
    """

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self._fd = sock.getsockopt(zmq.FD)
        self._loop = asyncio.get_running_loop()
        self._waiters: list[asyncio.Future[None]] = []
        self._loop.add_reader(self._fd, self._wake)

    async def wait(self, event: int) -> None:
        while not (self.sock.getsockopt(zmq.EVENTS) & event):
            fut = self._loop.create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)

    def _wake(self) -> None:
        if not self._waiters:
            self.sock.getsockopt(zmq.EVENTS)
            return
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        for fut in self._waiters:
            fut.cancel()
        self._waiters.clear()


class _Spill:
    """Messages for one peer that ZeroMQ had no room for, in order, and the task feeding them."""

    def __init__(self) -> None:
        self.frames: deque[tuple[list[bytes], int]] = deque()
        self.bytes = 0
        self.room = asyncio.Event()  # set whenever the feeder took a message out
        self.feeder: asyncio.Task[None] | None = None


class Mailbox:
    def __init__(
        self,
        ctx: zmq.Context,
        bind_address: str,
        hwm: int,
        linger_ms: int,
        max_message_bytes: int,
        spill_bytes: int = 0,
    ) -> None:
        self._ctx = ctx
        self._hwm = hwm
        self._spill_bytes = spill_bytes
        self._spills: dict[str, _Spill] = {}
        self._linger_ms = linger_ms
        self.inbox = ctx.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.RCVHWM, hwm)
        self.inbox.setsockopt(zmq.LINGER, 0)
        # Hard cap for remote transports (the peer is disconnected above it);
        # the actor itself answers merely-large frames with an error first.
        self.inbox.setsockopt(zmq.MAXMSGSIZE, 4 * max_message_bytes)
        self.inbox.bind(bind_address)
        self.address: str = self.inbox.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._inbox_ready = Readiness(self.inbox)
        self._outboxes: dict[str, tuple[zmq.Socket, Readiness, str]] = {}

    async def recv_burst(self) -> list[list[bytes]]:
        """Wait for at least one multipart message, then take what is queued."""
        burst: list[list[bytes]] = []
        size = 0
        while True:
            try:
                while len(burst) < RECV_BURST and size < RECV_BURST_BYTES:
                    frames = self.inbox.recv_multipart(zmq.NOBLOCK)
                    burst.append(frames)
                    size += sum(len(f) for f in frames)
            except zmq.Again:
                pass
            if burst:
                return burst
            await self._inbox_ready.wait(zmq.POLLIN)

    def _outbox(self, peer: str, address: str) -> tuple[zmq.Socket, Readiness]:
        """The PUSH socket to ``peer`` at ``address`` (reconnected if it moved)."""
        entry = self._outboxes.get(peer)
        if entry is not None and entry[2] == address:
            return entry[0], entry[1]
        if entry is not None:
            self.forget(peer)
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        sock.setsockopt(zmq.LINGER, self._linger_ms)
        sock.connect(address)
        ready = Readiness(sock)
        self._outboxes[peer] = (sock, ready, address)
        return sock, ready

    async def send(self, peer: str, address: str, frames: list[bytes], timeout_ms: int | None) -> bool:
        """Send, or queue behind what waits for ``peer``; wait only while its spill is full.
        False if ``timeout_ms`` ran out (0: dropped at once unless ZeroMQ takes it now)."""
        sock, ready = self._outbox(peer, address)
        spill = self._spills.get(peer)
        if spill is None or not spill.frames:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
                return True
            except zmq.Again:
                pass
        if timeout_ms == 0:
            return False
        if self._spill_bytes <= 0:
            return await self._send_waiting(sock, ready, frames, timeout_ms)
        if spill is None:
            spill = self._spills[peer] = _Spill()
        size = sum(len(f) for f in frames)
        deadline = None if timeout_ms is None else asyncio.get_running_loop().time() + timeout_ms / 1000
        while spill.frames and spill.bytes + size > self._spill_bytes:
            spill.room.clear()
            left = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(spill.room.wait(), left)
            except asyncio.TimeoutError:
                return False
            if self._spills.get(peer) is not spill:  # the peer was forgotten (down) meanwhile
                return False
        spill.frames.append((frames, size))
        spill.bytes += size
        if spill.feeder is None or spill.feeder.done():
            spill.feeder = asyncio.create_task(self._feed(peer, spill, sock, ready))
        return True

    async def _feed(self, peer: str, spill: _Spill, sock: zmq.Socket, ready: Readiness) -> None:
        """Hand ``peer``'s spilled messages to ZeroMQ, in order, as it makes room."""
        while spill.frames:
            try:
                sock.send_multipart(spill.frames[0][0], zmq.NOBLOCK)
            except zmq.Again:
                await ready.wait(zmq.POLLOUT)
                continue
            _, size = spill.frames.popleft()
            spill.bytes -= size
            spill.room.set()

    async def _send_waiting(self, sock: zmq.Socket, ready: Readiness, frames: list[bytes],
                            timeout_ms: int | None) -> bool:
        while True:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
                return True
            except zmq.Again:
                pass
            if timeout_ms is None:
                await ready.wait(zmq.POLLOUT)
                continue
            try:
                await asyncio.wait_for(ready.wait(zmq.POLLOUT), timeout_ms / 1000)
            except asyncio.TimeoutError:
                return False

    def forget(self, peer: str) -> None:
        """Drop the outbox to a dead peer without waiting for queued frames."""
        self._drop_spill(peer)
        entry = self._outboxes.pop(peer, None)
        if entry is not None:
            entry[1].close()
            entry[0].close(linger=0)

    def _drop_spill(self, peer: str) -> None:
        spill = self._spills.pop(peer, None)
        if spill is not None:
            if spill.feeder is not None:
                spill.feeder.cancel()
            spill.frames.clear()
            spill.bytes = 0
            spill.room.set()  # senders waiting for room see the peer is gone

    def close(self) -> None:
        """Close everything; outboxes keep their linger to flush queued frames (spilled ones,
        which a clean stop has sent before its Goodbyes were acknowledged, are dropped)."""
        for peer in list(self._spills):
            self._drop_spill(peer)
        self._inbox_ready.close()
        self.inbox.close(linger=0)
        for sock, ready, _ in self._outboxes.values():
            ready.close()
            sock.close()
        self._outboxes.clear()
