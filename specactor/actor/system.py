"""ActorSystem: starts actors, wires their addresses, watches them, stops them.

Actors run either in this process (an asyncio task on this loop, sharing one
ZeroMQ context, any transport) or in a child process of their own (started as
``python -m specactor.actor.child`` with a JSON spec; ipc or tcp only, since
inproc cannot cross processes). Use child processes for compute-heavy actors
(the verifier, model drafters) so that they really run in parallel.

Failure detection (bounds are the defaults):
- a child process that exits unexpectedly is seen at once through its
  process handle (``asyncio`` child watcher), typically within milliseconds;
- a child whose event loop stops sending heartbeats for ``hung_after_s``
  (2 s) is reported as hung and killed;
- an in-process actor whose task raises is reported as crashed.
Each is an event (``system.actor_crashed`` / ``system.actor_hung``) and a
``PeerDown`` message to every live actor, so owners can recover and nobody
waits on the dead one during shutdown.

Restarts: a child-process actor that crashes or hangs is started again from
its spec, under the same name (``system.actor_restarted``), up to
``max_restarts`` times in the system's life; its ``PeerDown`` then says
``restarting``, and the new PeerDirectory that names it tells every peer it
serves again (``Actor.on_peer_up``). Once the restarts are spent, or a
restart itself fails, the actor stays down: its last PeerDown says so, and
:attr:`ActorSystem.down` keeps the reason. An in-process actor started from a
spec (``spawn(spec, local=True)``) is restarted the same way when its task
raises (a loop or start-up that failed): a fresh instance from the spec. One
given as an instance cannot be rebuilt, so it stays down.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import msgspec
import zmq

from specactor import protocol as p
from specactor.actor.base import SUPERVISOR, Actor
from specactor.actor.address import AddressAllocator, Transport, check_name
from specactor.actor.actor_spec import PARENT_ENV, ActorSpec
from specactor.events import events_path, get_logger


@dataclass
class _Member:
    name: str
    address: str = ""
    actor: Actor | None = None
    task: asyncio.Task[None] | None = None
    process: asyncio.subprocess.Process | None = None
    monitor: asyncio.Task[None] | None = None
    ready: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    last_heartbeat: float = field(default_factory=time.monotonic)
    directory_version: int = 0
    down: str = ""
    spec: ActorSpec | None = None  # how to start it again
    local: bool = False  # the spec runs in this process
    stopping: bool = False  # stopped on purpose: its exit is no crash


class _Supervisor(Actor):
    """The system's own actor: receives Ready, heartbeats, and replies."""

    def __init__(self, system: "ActorSystem", **kwargs: object) -> None:
        super().__init__(SUPERVISOR, **kwargs)  # type: ignore[arg-type]
        self.system = system

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Ready):
            self.system._on_ready(msg)
        elif isinstance(msg, p.DirectoryAck):
            member = self.system._members.get(msg.name)
            if member is not None:
                member.directory_version = max(member.directory_version, msg.version)
                self.system._directory_changed.set()
        elif isinstance(msg, p.Heartbeat):
            member = self.system._members.get(msg.name)
            if member is not None:
                member.last_heartbeat = time.monotonic()
        else:
            await self.system.replies.put((sender, msg))


class ActorSystem:
    """Owns a set of actors; use as ``async with ActorSystem("ipc") as system``."""

    def __init__(
        self,
        transport: Transport | str = Transport.INPROC,
        *,
        host: str = "127.0.0.1",
        heartbeat_s: float = 0.2,
        hung_after_s: float = 2.0,
        ready_timeout_s: float = 120.0,
        drain_timeout_s: float = 5.0,
        max_restarts: int = 3,
    ) -> None:
        self.transport = Transport(transport)
        self.heartbeat_s = heartbeat_s
        self.hung_after_s = hung_after_s
        self.ready_timeout_s = ready_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.max_restarts = max_restarts
        self.restarts: dict[str, int] = {}  # name -> times restarted
        self.allocator = AddressAllocator(self.transport, host)
        self.replies: asyncio.Queue[tuple[str, p.Message]] = asyncio.Queue()
        self.down: dict[str, str] = {}
        self.log = get_logger(actor=SUPERVISOR)
        self._members: dict[str, _Member] = {}
        self._ctx: zmq.Context | None = None
        self._supervisor: _Supervisor | None = None
        self._supervisor_task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._stopping = False
        self._directory_version = 0
        self._directory_changed = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "ActorSystem":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        self._ctx = zmq.Context()
        self._supervisor = _Supervisor(self, drain_timeout_s=self.drain_timeout_s)
        bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._supervisor_task = asyncio.create_task(
            self._supervisor.serve(self.allocator.allocate(SUPERVISOR), self._ctx,
                                   on_bound=bound.set_result)
        )
        await bound
        self._watchdog = asyncio.create_task(self._watch_heartbeats())

    @property
    def supervisor(self) -> _Supervisor:
        assert self._supervisor is not None, "ActorSystem not started"
        return self._supervisor

    def live(self) -> list[str]:
        return [m.name for m in self._members.values() if not m.down]

    def pid(self, name: str) -> int:
        """The process id serving actor ``name`` (this process for local actors)."""
        member = self._members[name]
        return member.process.pid if member.process is not None else os.getpid()

    async def spawn(self, actor: Actor | ActorSpec, *, local: bool = False) -> str:
        """Start an actor here (an Actor instance, or an ActorSpec with ``local``) or in a
        child process (an ActorSpec). A spec can be started again after a crash.

        Returns its address once it is serving and every actor knows it.
        """
        assert self._ctx is not None and self._supervisor is not None, "ActorSystem not started"
        if self._stopping:
            raise RuntimeError("ActorSystem is shutting down")
        name = check_name(actor.name)
        if name in self._members or name == SUPERVISOR:
            raise ValueError(f"an actor named {name!r} already exists")
        if not isinstance(actor, Actor) and not local and self.transport is Transport.INPROC:
            raise ValueError("inproc cannot reach a child process: use transport 'ipc' or 'tcp'")
        member = _Member(name, local=local)
        self._members[name] = member
        await self._start(member, actor)
        self.log.info("system.spawned", name=name, process=member.process is not None, address=member.address)
        await self._broadcast_directory()
        return member.address

    async def _start(self, member: _Member, actor: Actor | ActorSpec) -> None:
        """Start ``member``'s actor and wait until it is ready (RuntimeError if it is not)."""
        assert self._ctx is not None
        name = member.name
        bind = self.allocator.allocate(name, self.restarts.get(name, 0))
        if isinstance(actor, ActorSpec):
            member.spec = actor  # what a restart starts again
            if member.local:
                actor = _build_local(actor)
        if isinstance(actor, Actor):
            member.actor = actor
            # in this process: its task says whether it lives, so it sends no heartbeats
            member.task = asyncio.create_task(actor.serve(bind, self._ctx, self.supervisor.address, heartbeat=False))
            member.task.add_done_callback(lambda t, m=member: self._on_local_exit(m, t))
        else:
            member.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "specactor.actor.child",
                msgspec.json.encode(actor).decode(), bind, self.supervisor.address,
                events_path() or "", env={**os.environ, PARENT_ENV: str(os.getpid())},
            )
            member.monitor = asyncio.create_task(self._monitor_process(member))
        try:
            done, _ = await asyncio.wait(
                [member.ready] + [t for t in (member.monitor, member.task) if t is not None],
                timeout=self.ready_timeout_s, return_when=asyncio.FIRST_COMPLETED,
            )
        except BaseException:
            await self._kill(member)
            raise
        if member.ready not in done:
            await self._kill(member)
            if member.task is not None and member.task.done() and not member.task.cancelled():
                why = f" (its start raised {member.task.exception()!r})"
            elif member.process and member.process.returncode is not None:
                why = f" (exited with code {member.process.returncode})"
            else:
                why = f" within {self.ready_timeout_s} s"
            raise RuntimeError(f"actor {name!r} did not become ready{why}")

    async def send(self, name: str, msg: p._Msg) -> bool:
        """Send a message to an actor as the supervisor (replies land in ``replies``)."""
        return await self.supervisor.send(name, msg)

    async def stop(self, name: str, timeout_s: float | None = None) -> None:
        """Stop one actor (it drains what it has; peers keep running)."""
        member = self._members[name]
        member.stopping = True
        await self.supervisor.send(name, p.Stop(reason="stopped by supervisor", expect_goodbyes=False))
        await self._wait_exit(member, timeout_s or self.drain_timeout_s + 5)
        # If it had to be killed it said no Goodbye: tell the others it is gone.
        await self._report_down(member, "stopped")

    async def shutdown(self) -> None:
        """Stop every actor, draining in-flight messages, then the supervisor."""
        if self._supervisor is None or self._stopping:
            return
        self._stopping = True
        started = time.monotonic()
        live = [m for m in self._members.values() if not m.down]
        for member in live:
            await self.supervisor.send(member.name, p.Stop(reason="shutdown", expect_goodbyes=True))
            await self.supervisor.send(member.name, p.Goodbye(name=SUPERVISOR))
        await asyncio.gather(*(self._wait_exit(m, self.drain_timeout_s + 5) for m in live))
        if self._watchdog is not None:
            self._watchdog.cancel()
        assert self._supervisor_task is not None
        self._supervisor_task.cancel()
        await asyncio.gather(self._supervisor_task, return_exceptions=True)
        self.log.info("system.shutdown", actors=len(live), seconds=round(time.monotonic() - started, 3))
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
        self.allocator.cleanup()

    # ------------------------------------------------------------------ internals

    def _on_ready(self, msg: p.Ready) -> None:
        member = self._members.get(msg.name)
        if member is not None and not member.ready.done():
            member.address = msg.address
            member.last_heartbeat = time.monotonic()
            member.ready.set_result(msg.address)

    async def _broadcast_directory(self) -> None:
        """Send the address book to every live actor and wait until each has it."""
        self._directory_version += 1
        version = self._directory_version
        members = [m for m in self._members.values() if not m.down and m.address]
        peers = {m.name: m.address for m in members}
        peers[SUPERVISOR] = self.supervisor.address
        self.supervisor.directory.update(peers)
        for member in members:
            await self.supervisor.send(member.name, p.PeerDirectory(peers=peers, version=version))
        deadline = time.monotonic() + self.ready_timeout_s
        while any(m.directory_version < version and not m.down for m in members):
            self._directory_changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                lagging = [m.name for m in members if m.directory_version < version and not m.down]
                raise RuntimeError(f"actors {lagging} did not acknowledge the directory")
            try:
                await asyncio.wait_for(self._directory_changed.wait(), min(remaining, self.heartbeat_s))
            except asyncio.TimeoutError:
                pass

    async def _report_down(self, member: _Member, reason: str, restarting: bool = False) -> None:
        if member.down or self._stopping:
            return
        member.down = reason
        if member.monitor is not None and member.monitor is not asyncio.current_task():
            member.monitor.cancel()
        self.down[member.name] = reason
        self.supervisor.dead_peers.add(member.name)
        for name in self.live():
            await self.supervisor.send(name, p.PeerDown(name=member.name, reason=reason, restarting=restarting))

    def _restarts_left(self, name: str) -> bool:
        return not self._stopping and self.restarts.get(name, 0) < self.max_restarts

    async def _failed(self, member: _Member, reason: str) -> None:
        """A child crashed or hung: report it, make sure it is dead, start it again if allowed."""
        if member.down or member.stopping or self._stopping:
            return
        name, spec = member.name, member.spec
        restarting = spec is not None and self._restarts_left(name)
        await self._report_down(member, reason, restarting)
        await self._kill(member)
        while restarting:
            assert spec is not None
            self.restarts[name] = self.restarts.get(name, 0) + 1
            fresh = _Member(name, local=member.local)
            self._members[name] = fresh
            try:
                await self._start(fresh, spec)
            except Exception as exc:  # a local spec's constructor may raise anything
                reason = f"restart {self.restarts[name]} of {self.max_restarts} failed: {exc}"
                self.log.error("system.actor_crashed", name=name, returncode=None, error=reason)
                fresh.down = reason
                self.down[name] = reason
                restarting = self._restarts_left(name)
                continue
            self.supervisor.dead_peers.discard(name)
            await self._broadcast_directory()  # every peer knows it serves again: only then is it up
            self.down.pop(name, None)
            self.log.info("system.actor_restarted", name=name, restarts=self.restarts[name], address=fresh.address)
            return
        if spec is not None and not self._stopping:  # gone for good: say so to everyone
            self.down[name] = reason
            for peer in self.live():
                await self.supervisor.send(peer, p.PeerDown(name=name, reason=reason, restarting=False))

    async def _monitor_process(self, member: _Member) -> None:
        assert member.process is not None
        code = await member.process.wait()
        if not member.down and not member.stopping and not self._stopping:
            self.log.error("system.actor_crashed", name=member.name, returncode=code)
            await self._failed(member, f"process exited with code {code}")

    def _on_local_exit(self, member: _Member, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None or self._stopping or member.down or member.stopping:
            return
        self.log.error("system.actor_crashed", name=member.name, returncode=None,
                       error=repr(task.exception()))
        reason = f"crashed: {task.exception()!r}"
        loop = asyncio.get_running_loop()
        if member.ready.done():  # a start-up failure is _start's to report
            loop.create_task(self._failed(member, reason) if member.spec is not None
                             else self._report_down(member, reason))

    async def _watch_heartbeats(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.heartbeat_s)
            now = time.monotonic()
            stalled, last = now - last > self.heartbeat_s + self.hung_after_s / 2, now
            if stalled or self._stopping:  # our own loop was busy: heartbeats may be waiting unread, so
                continue  # judge next round; stopping: actors that said Goodbye beat no more
            for member in list(self._members.values()):
                # judged once started (its on_start done: it acknowledged a directory); a start-up
                # that holds the interpreter (vLLM's engine build) is bounded by ready_timeout_s instead
                if member.process is None or member.down or not member.ready.done() or not member.directory_version:
                    continue
                silent = now - member.last_heartbeat
                if silent > self.hung_after_s and member.process.returncode is None:
                    self.log.error("system.actor_hung", name=member.name, silent_for_s=round(silent, 3))
                    asyncio.get_running_loop().create_task(
                        self._failed(member, f"hung: no heartbeat for {silent:.1f} s"))

    async def _wait_exit(self, member: _Member, timeout_s: float) -> None:
        waiter = member.task if member.task is not None else member.process.wait() if member.process else None
        if waiter is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(waiter) if member.task else waiter, timeout_s)
        except asyncio.TimeoutError:
            self.log.warning("actor.drain_timeout", missing=[member.name])
            await self._kill(member)
        except Exception:
            pass

    async def _kill(self, member: _Member) -> None:
        if member.task is not None and not member.task.done():
            member.task.cancel()
            await asyncio.gather(member.task, return_exceptions=True)
        if member.process is not None and member.process.returncode is None:
            member.process.send_signal(signal.SIGKILL)
            await member.process.wait()


def _build_local(spec: ActorSpec) -> Actor:
    """An in-process actor from its spec (``env`` is a child's: it does not apply here)."""
    from specactor.actor.actor_spec import load_class

    return load_class(spec.cls)(name=spec.name, **spec.kwargs)
