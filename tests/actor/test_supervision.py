"""Crashed and hung child actors are detected, reported and (when hung) killed.

The deadlines here are generous on purpose: the contract is that detection happens, by the right
mechanism (a crash through the process handle, a hang through missing heartbeats), not how fast a
loaded machine gets round to it; a detection that never comes still fails at the deadline."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector

#: how long a test waits for what must happen; far beyond any detection bound of actor/system.py
DEADLINE_S = 60.0


async def _next_peer_down(collector: Collector, timeout: float) -> p.PeerDown:
    async with asyncio.timeout(timeout):
        while True:
            _, msg = await collector.received.get()
            if isinstance(msg, p.PeerDown):
                return msg


async def _until(condition: Callable[[], bool], timeout: float, poll_s: float = 0.02) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(poll_s)


async def test_sigkilled_child_is_detected_through_its_process_handle_and_reported(events_file) -> None:
    # a hang takes an hour to be judged here: only the process handle can report this crash
    # before the deadline (restarts: tests/faults)
    async with ActorSystem("ipc", hung_after_s=3600.0, max_restarts=0) as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="victim", cls="specactor.actor.probes:Echo"))
        os.kill(system.pid("victim"), signal.SIGKILL)
        down = await _next_peer_down(owner, DEADLINE_S)
        assert down.name == "victim" and down.reason == "process exited with code -9" and not down.restarting
        assert system.down["victim"] == down.reason
        # the owner keeps working and sends to the dead peer are dropped, not hung
        assert await asyncio.wait_for(owner.send("victim", p.Ping(seq=1)), DEADLINE_S) is False
    crashed = [e for e in events_file() if e["event"] == "system.actor_crashed"]
    assert crashed and crashed[0]["name"] == "victim" and crashed[0]["returncode"] == -9
    assert not any(e["event"] == "system.actor_hung" for e in events_file())


async def test_hung_child_is_detected_by_its_silence_and_killed(events_file) -> None:
    async with ActorSystem("ipc", heartbeat_s=0.1, hung_after_s=1.0, max_restarts=0) as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="stuck", cls="specactor.actor.probes:Hanger",
                                     kwargs={"heartbeat_s": 0.1}))
        pid = system.pid("stuck")
        await owner.send("stuck", p.Payload(seq=1))
        down = await _next_peer_down(owner, DEADLINE_S)
        assert down.name == "stuck" and down.reason.startswith("hung: no heartbeat for") and not down.restarting
        # killed, not left hanging (the Hanger would sleep for an hour)
        await _until(lambda: not _alive(pid), DEADLINE_S)
    hung = [e for e in events_file() if e["event"] == "system.actor_hung"]
    # judged hung only once silent for longer than hung_after_s: load may delay that, never hasten it
    assert hung and hung[0]["name"] == "stuck" and hung[0]["silent_for_s"] >= 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not yet reaped counts as dead (and one reaped meanwhile has no /proc entry)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


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
        down = await _next_peer_down(owner, DEADLINE_S)
        assert down.name == "fragile" and "boom" in down.reason
    assert any(e["event"] == "system.actor_crashed" and e["name"] == "fragile" for e in events_file())


async def test_only_child_processes_send_heartbeats() -> None:
    """The watchdog judges child processes by their heartbeats; an actor in the supervisor's own
    process lives or dies with its task, so its beats would only take CPU from the verifier."""
    async with ActorSystem("ipc", heartbeat_s=0.05, hung_after_s=5.0, max_restarts=0) as system:
        await system.spawn(Collector("local"))
        await system.spawn(ActorSpec(name="child", cls="specactor.actor.probes:Echo", kwargs={"heartbeat_s": 0.05}))
        local, child = system._members["local"], system._members["child"]
        local_since, child_beats = local.last_heartbeat, {child.last_heartbeat}

        def child_beat_five_times() -> bool:
            child_beats.add(child.last_heartbeat)
            return len(child_beats) > 5

        # five of the child's heartbeat periods at least, however slowly a loaded machine runs them
        await _until(child_beat_five_times, DEADLINE_S, poll_s=0.01)
        assert local.last_heartbeat == local_since
