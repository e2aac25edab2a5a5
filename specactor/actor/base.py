"""The Actor base class: one asyncio task serving one ZeroMQ inbox.

Subclasses override :meth:`handle` (and optionally :meth:`on_start`,
:meth:`on_stop`, :meth:`on_peer_down`). The receive loop handles control
messages itself (directory, ping, stop, goodbye, peer-down) and hands every
other message to ``handle`` in arrival order.

Blocking compute must not run on the event loop: a model forward goes through
:meth:`run_blocking`, which runs it on the actor's own worker thread (torch
releases the GIL), so the loop keeps receiving messages and sending heartbeats
meanwhile. Compute-heavy actors also run in their own process (see
:class:`~specactor.actor.system.ActorSystem`), so that they use their own cores.

Lifecycle: bind, tell the supervisor ``Ready``, wait for the ``PeerDirectory``,
``on_start``, serve. On ``Stop``: ``on_stop``, then ``Goodbye`` to every peer,
then keep serving until every live peer's ``Goodbye`` has arrived (ZeroMQ keeps
each pipe in order, so by then everything each peer sent has been handled) and
every live peer has acknowledged ours (so everything we sent has arrived:
ZeroMQ itself may drop frames in flight when a sender disconnects).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from typing import Any, Callable, Coroutine, TypeVar

import zmq

from specactor import protocol as p
from specactor.actor.address import check_name
from specactor.actor.mailbox import Mailbox
from specactor.events import get_logger

T = TypeVar("T")

SUPERVISOR = "supervisor"


class Actor:
    """Base class of every actor; see the module docstring for the lifecycle."""

    def __init__(
        self,
        name: str,
        *,
        hwm: int = 1000,
        max_message_bytes: int = 64 << 20,
        heartbeat_s: float = 0.2,
        drain_timeout_s: float = 5.0,
        send_timeout_s: float | None = None,
        spill_bytes: int = 64 << 20,
    ) -> None:
        self.name = check_name(name)
        self.hwm = hwm
        self.spill_bytes = spill_bytes  # per peer, queued beyond ZeroMQ's hwm before a send waits
        self.max_message_bytes = max_message_bytes
        self.heartbeat_s = heartbeat_s
        self.drain_timeout_s = drain_timeout_s
        self.send_timeout_s = send_timeout_s
        self.directory: dict[str, str] = {}
        self.dead_peers: set[str] = set()
        self.handled = 0
        self.log = get_logger(actor=name)
        self.started = asyncio.Event()
        self._mailbox: Mailbox | None = None
        self._goodbyes: set[str] = set()
        self._goodbye_acks: set[str] = set()
        self._said_goodbye = False
        self._stop_requested: p.Stop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loops: list[asyncio.Task[Any]] = []
        self._loop_error: BaseException | None = None  # what killed one of our loops

    # ------------------------------------------------------------------ hooks

    async def on_start(self) -> None:
        """Called once the directory is known, before serving messages."""

    async def handle(self, sender: str, msg: p.Message) -> None:
        """Handle one non-control message. Exceptions become error replies."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(msg).__name__}")

    async def on_stop(self) -> None:
        """Called on Stop, before Goodbyes: finish or hand off own work here."""

    async def on_peer_down(self, name: str, reason: str, restarting: bool = False) -> None:
        """Called when the supervisor reports that ``name`` crashed or hung; ``restarting``: a new
        one is starting (then :meth:`on_peer_up` follows, unless that fails too)."""

    async def on_peer_up(self, name: str) -> None:
        """Called when a peer reported down serves again (the supervisor restarted it)."""

    async def on_error(self, sender: str, error: p.Error) -> None:
        """An Error reply from ``sender`` (to something we sent). Never answered: two actors that
        each reject what the other sends would otherwise bounce Errors forever."""
        self.log.warning("actor.error_reply", sender=sender, code=error.code, error=error.message, ref=error.ref)

    def on_closed(self) -> None:
        """Called once the mailbox is closed and no message can arrive any more:
        drop heavy state (models, KV caches) so that an actor object that
        outlives its run does not pin memory."""

    # ------------------------------------------------------------------ API

    @property
    def address(self) -> str:
        assert self._mailbox is not None, "actor is not serving"
        return self._mailbox.address

    async def send(self, peer: str, msg: p._Msg, *, timeout_s: float | None = -1.0) -> bool:
        """Send ``msg`` to ``peer``, in order; a peer that is not reading gets it queued (up to
        ``spill_bytes``), and only beyond that does this wait (backpressure).

        ``timeout_s``: how long to wait for room (default: the actor's ``send_timeout_s``;
        0: drop at once if the queue is full, for advisory messages that must not hold
        the sender up). Returns False, with an event, when the peer is unknown, dead, or
        we have already said Goodbye (shutdown), or the send timed out.
        """
        assert self._mailbox is not None, "actor is not serving"
        address = self.directory.get(peer)
        if address is None or peer in self.dead_peers:
            self.log.warning("actor.unknown_peer" if address is None else "actor.send_dropped",
                             peer=peer, kind=type(msg).__name__)
            return False
        if self._said_goodbye and not isinstance(msg, (p.Goodbye, p.GoodbyeAck)):
            self.log.debug("actor.send_dropped", peer=peer, kind=type(msg).__name__)
            return False
        limit = self.send_timeout_s if timeout_s is not None and timeout_s < 0 else timeout_s
        timeout_ms = None if limit is None else int(limit * 1000)
        sent = await self._mailbox.send(peer, address, p.frames(self.name, msg), timeout_ms)
        if not sent:
            self.log.warning("actor.send_dropped", peer=peer, kind=type(msg).__name__)
        return sent

    def start_loop(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a background loop of this actor (a step or drafting loop); it is
        cancelled, and waited for, when the actor stops. A loop that raises stops the
        actor, which then fails (:meth:`serve` raises): an actor whose loop is dead
        would keep answering heartbeats and never do its work, so its supervisor
        must see it crash."""
        task = asyncio.create_task(coro)
        task.add_done_callback(self._loop_done)
        self._loops.append(task)

    def _loop_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None or self._loop_error is not None:
            return
        exc = task.exception()
        self._loop_error = exc
        self.log.error("actor.loop_failed", error=f"{type(exc).__name__}: {exc}")
        self.request_stop("loop failed")

    async def _stop_loops(self) -> None:
        loops, self._loops = self._loops, []  # a cancelled task's traceback pins its frame: drop them
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn(*args)`` on this actor's worker thread."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def request_stop(self, reason: str = "self") -> None:
        """Stop from inside (e.g. on SIGTERM): a Stop to our own inbox wakes the loop.

        No Goodbyes are awaited, since the peers keep running.
        """
        if self._stop_requested is None and self._mailbox is not None:
            stop = p.Stop(reason=reason, expect_goodbyes=False)
            asyncio.get_running_loop().create_task(self.send(self.name, stop))

    # ------------------------------------------------------------------ serving

    async def serve(
        self,
        bind_address: str,
        ctx: zmq.Context,
        supervisor_address: str | None = None,
        on_bound: Callable[[str], None] | None = None,
        heartbeat: bool = True,
    ) -> None:
        """Bind, announce, serve until stopped. Returns after a clean stop.

        ``heartbeat``: send the supervisor a heartbeat every ``heartbeat_s``; an actor in the
        supervisor's own process passes False: its liveness is its task's, and a beat costs a
        send and a receive on the cores the verifier computes on."""
        linger_ms = int(self.drain_timeout_s * 1000)
        self._mailbox = Mailbox(ctx, bind_address, self.hwm, linger_ms, self.max_message_bytes, self.spill_bytes)
        self.directory[self.name] = self._mailbox.address
        if on_bound is not None:
            on_bound(self._mailbox.address)
        beating: asyncio.Task[None] | None = None
        try:
            if supervisor_address is not None:
                self.directory[SUPERVISOR] = supervisor_address
                await self.send(SUPERVISOR, p.Ready(name=self.name, address=self.address, pid=os.getpid()))
                if heartbeat:
                    beating = asyncio.create_task(self._heartbeat())
            else:
                await self._begin()
            await self._serve_until_stopped()
        finally:
            if beating is not None:
                beating.cancel()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            self._mailbox.close()
            self.on_closed()
            self.log.info("actor.stopped", handled=self.handled,
                          reason=self._stop_requested.reason if self._stop_requested else "cancelled")
        if self._loop_error is not None:
            raise RuntimeError(f"actor {self.name!r}: a loop failed: "
                               f"{type(self._loop_error).__name__}: {self._loop_error}") from self._loop_error

    async def _begin(self) -> None:
        await self.on_start()
        self.started.set()
        self.log.info("actor.started", address=self.address)

    async def _heartbeat(self) -> None:
        seq = 0
        while True:
            await asyncio.sleep(self.heartbeat_s)
            seq += 1
            if not self._said_goodbye:
                await self.send(SUPERVISOR, p.Heartbeat(name=self.name, seq=seq))

    def _still_waiting_for(self) -> set[str]:
        """Peers whose Goodbye (if expected) or whose ack of ours is missing."""
        live = set(self.directory) - {self.name} - self.dead_peers
        assert self._stop_requested is not None
        missing = live - self._goodbye_acks
        if self._stop_requested.expect_goodbyes:
            missing |= live - self._goodbyes
        return missing

    async def _serve_until_stopped(self) -> None:
        assert self._mailbox is not None
        drain_deadline: float | None = None
        while True:
            if self._stop_requested is not None and not self._said_goodbye:
                await self._say_goodbye()
                drain_deadline = time.monotonic() + self.drain_timeout_s
            if self._said_goodbye:
                missing = self._still_waiting_for()
                if not missing:
                    return
                remaining = drain_deadline - time.monotonic()  # type: ignore[operator]
                try:
                    # Not socket.poll(): ZeroMQ's fd is edge-triggered and a poll
                    # can miss frames already queued. A cancelled recv takes nothing.
                    burst = await asyncio.wait_for(self._mailbox.recv_burst(), max(remaining, 0))
                except asyncio.TimeoutError:
                    self.log.warning("actor.drain_timeout", missing=sorted(missing))
                    return
            else:
                burst = await self._mailbox.recv_burst()
            for frames in burst:
                await self._dispatch(frames)
            # A receive that finds frames waiting does not yield: without this, a flood
            # (a weight update's chunks) starves the heartbeat and the actor's own loops.
            await asyncio.sleep(0)

    async def _say_goodbye(self) -> None:
        assert self._stop_requested is not None
        await self._stop_loops()
        await self.on_stop()
        for peer in sorted(set(self.directory) - {self.name} - self.dead_peers):
            await self.send(peer, p.Goodbye(name=self.name))
        self._said_goodbye = True

    async def _dispatch(self, frames: list[bytes]) -> None:
        sender = ""
        size = sum(len(f) for f in frames)
        try:
            if len(frames) != 2:
                raise p.ProtocolError(f"expected 2 frames [sender, body], got {len(frames)}")
            try:
                sender = frames[0].decode()
            except UnicodeDecodeError:
                raise p.ProtocolError("sender frame is not UTF-8") from None
            if len(frames[1]) > self.max_message_bytes:
                raise p.ProtocolError(
                    f"message of {len(frames[1])} bytes exceeds the limit of {self.max_message_bytes}"
                )
            msg = p.decode(frames[1])
        except p.ProtocolError as exc:
            self.log.warning("actor.bad_message", sender=sender, error=str(exc), size=size)
            await self._reply_error(sender, "bad_message", str(exc))
            return
        if await self._control(sender, msg):
            return
        if isinstance(msg, p.Error):
            try:
                await self.on_error(sender, msg)
            except Exception as exc:  # not answered either
                self.log.error("actor.handler_failed", sender=sender, kind="Error",
                               error=f"{type(exc).__name__}: {exc}")
            self.handled += 1
            return
        try:
            await self.handle(sender, msg)
        except Exception as exc:  # the actor survives its handlers
            self.log.error("actor.handler_failed", sender=sender, kind=type(msg).__name__,
                           error=f"{type(exc).__name__}: {exc}")
            await self._reply_error(sender, "handler_failed", f"{type(exc).__name__}: {exc}",
                                    ref=getattr(msg, "request_id", ""))
        self.handled += 1

    async def _reply_error(self, sender: str, code: str, message: str, ref: str = "") -> None:
        if sender in self.directory and sender != self.name and sender not in self.dead_peers:
            await self.send(sender, p.Error(code=code, message=message, ref=ref))

    async def _control(self, sender: str, msg: p.Message) -> bool:
        """Handle a control message; False if it is for :meth:`handle`."""
        if isinstance(msg, p.PeerDirectory):
            self.directory.update(msg.peers)
            self.directory[self.name] = self.address
            back = sorted(self.dead_peers & set(msg.peers))  # restarted by the supervisor
            self.dead_peers -= set(back)
            if not self.started.is_set():
                await self._begin()
            await self.send(sender, p.DirectoryAck(name=self.name, version=msg.version))
            for name in back:
                await self.on_peer_up(name)
            return True
        if isinstance(msg, p.Ping):
            await self.send(sender, p.Pong(seq=msg.seq, sent_ns=msg.sent_ns))
            return True
        if isinstance(msg, p.Stop):
            if self._stop_requested is None:
                self._stop_requested = msg
            return True
        if isinstance(msg, p.Goodbye):
            self._goodbyes.add(msg.name)
            if msg.name in self.directory and msg.name not in self.dead_peers:
                await self.send(msg.name, p.GoodbyeAck(name=self.name))
            return True
        if isinstance(msg, p.GoodbyeAck):
            self._goodbye_acks.add(msg.name)
            return True
        if isinstance(msg, p.PeerDown):
            self.dead_peers.add(msg.name)
            if self._mailbox is not None:
                self._mailbox.forget(msg.name)
            await self.on_peer_down(msg.name, msg.reason, msg.restarting)
            return True
        return False
