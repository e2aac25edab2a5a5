"""Crashed and hung child actors are detected within a stated bound and reported."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector

#: Documented bound (actor/system.py): a crashed child is reported within this.
CRASH_DETECTION_BOUND_S = 1.0


async def _next_peer_down(collector: Collector, timeout: float) -> p.PeerDown:
    while True:
        _, msg = await asyncio.wait_for(collector.received.get(), timeout)
        if isinstance(msg, p.PeerDown):
            return msg


async def test_sigkilled_child_is_detected_and_reported(events_file) -> None:
    async with ActorSystem("ipc", max_restarts=0) as system:  # detection alone (restarts: tests/faults)
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="victim", cls="specactor.actor.probes:Echo"))
        killed_at = time.monotonic()
        os.kill(system.pid("victim"), signal.SIGKILL)
        down = await _next_peer_down(owner, 10)
        detected_after = time.monotonic() - killed_at
        assert down.name == "victim" and "-9" in down.reason and not down.restarting
        assert detected_after < CRASH_DETECTION_BOUND_S
        assert system.down["victim"]
        # the owner keeps working and sends to the dead peer are dropped, not hung
        assert await owner.send("victim", p.Ping(seq=1)) is False
    crashed = [e for e in events_file() if e["event"] == "system.actor_crashed"]
    assert crashed and crashed[0]["name"] == "victim" and crashed[0]["returncode"] == -9


async def test_hung_child_is_detected_and_killed(events_file) -> None:
    async with ActorSystem("ipc", heartbeat_s=0.1, hung_after_s=1.0, max_restarts=0) as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="stuck", cls="specactor.actor.probes:Hanger",
                                     kwargs={"heartbeat_s": 0.1}))
        await owner.send("stuck", p.Payload(seq=1))
        hung_at = time.monotonic()
        down = await _next_peer_down(owner, 10)
        assert down.name == "stuck" and down.reason.startswith("hung")
        # bound: hung_after_s + one watchdog period + a heartbeat of slack
        assert time.monotonic() - hung_at < 1.0 + 0.1 + 0.5
        pid = system.pid("stuck")
        await asyncio.sleep(0.2)
        assert not _alive(pid)
    assert any(e["event"] == "system.actor_hung" for e in events_file())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not yet reaped counts as dead
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


class _Fatal(BaseException):
    """Not an Exception: escapes the handler guard, like a real crash would."""


class _Fragile(Collector):
    async def handle(self, sender: str, msg: p.Message) -> None:
        raise _Fatal("boom")


async def test_local_actor_crash_is_reported(events_file) -> None:
    async with ActorSystem("inproc") as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(_Fragile("fragile"))
        await owner.send("fragile", p.Payload(seq=1))
        down = await _next_peer_down(owner, 10)
        assert down.name == "fragile" and "boom" in down.reason
    assert any(e["event"] == "system.actor_crashed" and e["name"] == "fragile" for e in events_file())


async def test_only_child_processes_send_heartbeats() -> None:
    """The watchdog judges child processes by their heartbeats; an actor in the supervisor's own
    process lives or dies with its task, so its beats would only take CPU from the verifier."""
    async with ActorSystem("ipc", heartbeat_s=0.05, hung_after_s=5.0, max_restarts=0) as system:
        await system.spawn(Collector("local"))
        await system.spawn(ActorSpec(name="child", cls="specactor.actor.probes:Echo", kwargs={"heartbeat_s": 0.05}))
        local, child = system._members["local"], system._members["child"]
        local_since, child_since = local.last_heartbeat, child.last_heartbeat
        await asyncio.sleep(0.5)
        assert child.last_heartbeat > child_since
        assert local.last_heartbeat == local_since
