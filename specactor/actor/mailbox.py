"""ZeroMQ endpoints of one actor: a bound PULL inbox and PUSH outboxes.

High-water marks bound every queue: when a peer is slow, its inbox fills, our
outbox fills, and ``send`` waits. That wait is the backpressure that keeps
memory bounded; nothing buffers without limit in between.

Sockets are plain (non-asyncio) ZeroMQ sockets driven by :class:`Readiness`:
operations are tried with NOBLOCK first (no future per message on the hot
path) and only on EAGAIN does a task sleep on the socket's notification fd.
ZeroMQ's fd is edge-triggered, so readiness is always re-checked through
``ZMQ_EVENTS`` before sleeping; sleeping on the fd alone loses wake-ups.
"""

from __future__ import annotations

import asyncio

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


class Mailbox:
    def __init__(
        self,
        ctx: zmq.Context,
        bind_address: str,
        hwm: int,
        linger_ms: int,
        max_message_bytes: int,
    ) -> None:
        self._ctx = ctx
        self._hwm = hwm
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
        """Send; wait while the peer's queue is full. False if ``timeout_ms`` ran out."""
        sock, ready = self._outbox(peer, address)
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
        entry = self._outboxes.pop(peer, None)
        if entry is not None:
            entry[1].close()
            entry[0].close(linger=0)

    def close(self) -> None:
        """Close everything; outboxes keep their linger to flush queued frames."""
        self._inbox_ready.close()
        self.inbox.close(linger=0)
        for sock, ready, _ in self._outboxes.values():
            ready.close()
            sock.close()
        self._outboxes.clear()
