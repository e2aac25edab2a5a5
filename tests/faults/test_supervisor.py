"""The supervisor restarts what dies, within bounds; a dead loop is a dead actor; Errors are never
answered with Errors; children die with their parent (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector, Rejecter

LOOP_FAILER = "specactor.actor.probes:LoopFailer"


async def _next(collector: Collector, kind: type, timeout: float = 20.0):
    while True:
        _, msg = await asyncio.wait_for(collector.received.get(), timeout)
        if isinstance(msg, kind):
            return msg


async def _pid(system: ActorSystem, owner: Collector, name: str) -> int:
    await owner.send(name, p.StatsRequest())
    reply = await _next(owner, p.StatsReply)
    return int(reply.values["pid"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_a_killed_child_is_restarted_under_its_name_and_serves_again(events_file) -> None:
    async with ActorSystem("ipc", max_restarts=2) as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="victim", cls=LOOP_FAILER))
        first = await _pid(system, owner, "victim")
        os.kill(first, signal.SIGKILL)
        down = await _next(owner, p.PeerDown)
        assert down.name == "victim" and down.restarting
        deadline = time.monotonic() + 30
        while system.restarts.get("victim") != 1 or "victim" in system.down:
            assert time.monotonic() < deadline, "not restarted"
            await asyncio.sleep(0.05)
        second = await _pid(system, owner, "victim")  # the owner reaches the new one by the same name
        assert second != first and not _alive(first)
    events = events_file()
    assert any(e["event"] == "system.actor_restarted" and e["name"] == "victim" for e in events)


async def test_restarts_are_bounded_then_the_actor_stays_down() -> None:
    async with ActorSystem("ipc", max_restarts=1) as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="victim", cls=LOOP_FAILER))
        await owner.send("victim", p.Payload(seq=2))  # exits with code 3
        assert (await _next(owner, p.PeerDown)).restarting
        deadline = time.monotonic() + 30
        while system.restarts.get("victim") != 1 or "victim" in system.down:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await owner.send("victim", p.Payload(seq=2))  # again: no restart left
        final = await _next(owner, p.PeerDown)
        assert final.name == "victim" and not final.restarting and "code 3" in final.reason
        assert "code 3" in system.down["victim"]
        assert await owner.send("victim", p.Ping(seq=1)) is False  # sends to it fail fast, never hang


async def test_a_loop_that_dies_takes_its_actor_down_and_it_is_restarted(events_file) -> None:
    """Before: the heartbeat went on while the step loop was dead, so the actor looked healthy
    and never answered again."""
    async with ActorSystem("ipc", max_restarts=1) as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="victim", cls=LOOP_FAILER))
        first = await _pid(system, owner, "victim")
        await owner.send("victim", p.Payload(seq=1))
        down = await _next(owner, p.PeerDown)
        assert down.name == "victim" and down.restarting and "code 1" in down.reason
        deadline = time.monotonic() + 30
        while system.restarts.get("victim") != 1 or "victim" in system.down:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await _pid(system, owner, "victim") != first
    failed = [e for e in events_file() if e["event"] == "actor.loop_failed"]
    assert failed and "on purpose" in failed[0]["error"]


async def test_a_dead_local_loop_is_reported_as_a_crash() -> None:
    from specactor.actor.probes import LoopFailer

    async with ActorSystem("inproc") as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(LoopFailer("victim"))
        await owner.send("victim", p.Payload(seq=1))
        down = await _next(owner, p.PeerDown)
        assert down.name == "victim" and "loop failed" in down.reason and not down.restarting


async def test_an_in_process_actor_started_from_a_spec_is_restarted_when_its_loop_dies(events_file) -> None:
    async with ActorSystem("inproc", max_restarts=1) as system:
        owner = Collector("owner")
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="victim", cls=LOOP_FAILER), local=True)
        first = system._members["victim"].actor
        await owner.send("victim", p.Payload(seq=1))
        down = await _next(owner, p.PeerDown)
        assert down.name == "victim" and down.restarting and "loop failed" in down.reason
        deadline = time.monotonic() + 10
        while system.restarts.get("victim") != 1 or "victim" in system.down:
            assert time.monotonic() < deadline, "not restarted"
            await asyncio.sleep(0.02)
        assert system._members["victim"].actor is not first
        assert await _pid(system, owner, "victim") == os.getpid()  # the new one serves, in this process
        await owner.send("victim", p.Payload(seq=1))  # restarts spent: down for good, and says so
        down = await _next(owner, p.PeerDown)
        while down.restarting:
            down = await _next(owner, p.PeerDown)
        assert down.name == "victim" and "victim" in system.down
    assert [e["name"] for e in events_file() if e["event"] == "system.actor_restarted"] == ["victim"]


async def test_an_error_is_never_answered_with_an_error() -> None:
    async with ActorSystem("inproc") as system:
        a, b = Rejecter("a"), Rejecter("b")
        await system.spawn(a)
        await system.spawn(b)
        await a.send("b", p.Payload(seq=1))
        await asyncio.sleep(0.5)
        assert (a.errors, b.errors) == (1, 0)  # b's handler failed and said so, once; a did not answer
        assert a.handled == 1 and b.handled == 1


def test_children_die_with_their_parent(tmp_path) -> None:
    """SIGKILL the process that owns the actors (it runs no cleanup): its children are gone within 5 s."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import asyncio, sys
        from specactor.actor import ActorSpec, ActorSystem

        async def main():
            system = ActorSystem("ipc")
            await system.start()
            await system.spawn(ActorSpec(name="child", cls="specactor.actor.probes:Echo"))
            print(system.pid("child"), flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main())
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(owner.stdout.readline())
        assert _alive(child)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 5.0
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its parent by 5 s"
    finally:
        owner.kill()
