"""Shutdown under load loses nothing; a slow consumer bounds the producer's memory.

Deadlines here are generous on purpose: the contracts are that nothing is lost, nothing waits on a
peer that does not read, and shutdown does not hang, not how fast a loaded machine does it; what
must happen and never does still fails at the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psutil
import pytest

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector, Producer

#: how long a test waits for what must happen
DEADLINE_S = 60.0
#: a drain that outlasts this lost messages to the clock (on a loaded machine), not to a bug
DRAIN_S = 60.0


async def _until(condition: Callable[[], object], timeout: float = DEADLINE_S) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("transport, n", [("inproc", 20000), ("ipc", 5000), ("tcp", 3000)])
async def test_shutdown_under_load_loses_nothing(transport: str, n: int, events_file) -> None:
    """Three producers (one local, two in child processes where possible) each
    send n messages; shutdown starts while they are in flight, drains them all and ends."""
    sink = Collector("sink", drain_timeout_s=DRAIN_S)
    sink.keep = False  # count only; do not queue
    # shutdown waits up to DRAIN_S (+ 5 s) for an actor before it kills it: past that it hangs
    async with asyncio.timeout(2 * DRAIN_S + DEADLINE_S):
        async with ActorSystem(transport, drain_timeout_s=DRAIN_S) as system:
            await system.spawn(sink)
            await system.spawn(Producer("local", target="sink", drain_timeout_s=DRAIN_S))
            names = ["local"]
            if transport != "inproc":
                for i in range(2):
                    await system.spawn(ActorSpec(name=f"remote{i}", cls="specactor.actor.probes:Producer",
                                                 kwargs={"target": "sink", "hwm": 50, "drain_timeout_s": DRAIN_S}))
                    names.append(f"remote{i}")
            for name in names:
                await system.send(name, p.Payload(seq=n))
            at_shutdown = sink.count
    assert at_shutdown < n * len(names), "test too easy: everything arrived before shutdown"
    assert sink.count == n * len(names)
    # every actor drained and said goodbye: none was cut off or killed
    assert not [e for e in events_file() if e["event"] == "actor.drain_timeout"]
    for member in system._members.values():  # each ended by itself: exited 0, or its task returned
        if member.process is not None:
            assert member.process.returncode == 0, (member.name, member.process.returncode)
        else:
            assert member.task is not None and member.task.done() and not member.task.cancelled()
            assert member.task.exception() is None, member.name


async def test_slow_consumer_applies_backpressure_not_memory_growth() -> None:
    """A producer in a child process tries to push 200 MB of 2 KB messages at
    a consumer that takes 1 ms each; its memory must stay bounded while it waits."""
    async with ActorSystem("ipc") as system:
        slow = Collector("slow", delay_s=0.001, hwm=20)
        slow.keep = False
        await system.spawn(slow)
        await system.spawn(ActorSpec(name="producer", cls="specactor.actor.probes:Producer",
                                     kwargs={"target": "slow", "size": 2048, "hwm": 20, "spill_bytes": 4 << 20}))
        proc = psutil.Process(system.pid("producer"))
        rss_before = proc.memory_info().rss
        started = time.monotonic()
        await system.send("producer", p.Payload(seq=100_000))
        samples = []
        for _ in range(20):
            await asyncio.sleep(0.1)
            samples.append(proc.memory_info().rss)
        received, elapsed = slow.count, time.monotonic() - started
        # The consumer got only what it could handle (at most one a ms, however long this took) ...
        assert 0 < received <= elapsed / 0.001 + 1 and received < 100_000
        # ... and the producer holds at most its spill (4 MB) and a few MB of queued frames, not 200 MB.
        growth_mb = (max(samples) - rss_before) / 2**20
        assert growth_mb < 16, f"producer grew by {growth_mb:.1f} MB"
        # the producer is blocked on sending, not dead
        assert system.live() == ["slow", "producer"]
        await system.stop("producer", timeout_s=0.5)


async def test_an_advisory_send_to_a_full_peer_is_dropped_at_once_not_waited_for() -> None:
    """The verifier's VerdictBatches to the policy (which lives in the caller's process) use this:
    a caller whose loop stops reading must not stall verification."""
    async with ActorSystem("inproc") as system:
        stuck = Collector("stuck", delay_s=3600, hwm=4)  # handles one message, then never again
        sender = Collector("sender", hwm=4)
        await system.spawn(stuck)
        await system.spawn(sender)
        # how often the loop runs anything else while the sends go on: a send that waits (for
        # room, for a timeout, however short) lets it run; one dropped at once does not
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        before = ticks
        # the stuck peer never reads again: a send that waited for it would wait past this
        async with asyncio.timeout(DEADLINE_S):
            results = [await sender.send("stuck", p.Payload(seq=i), timeout_s=0) for i in range(200)]
        waits = ticks - before
        ticker.cancel()
        assert results[0] and not all(results) and results.count(True) < 50
        assert waits <= len(results), f"the loop ran {waits} times during {len(results)} advisory sends"


class _SeqRecorder(Collector):
    """Keeps only the order of the payloads' sequence numbers (the payloads are large); with
    ``stall_until``, its process stops reading at the first payload (an RL loop's training step)
    until that says so, and ``woke`` is when it read on."""

    def __init__(self, name: str, stall_until: Callable[[], bool] | None = None, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.seqs: list[int] = []
        self.stall_until, self.woke = stall_until, 0.0

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Payload):
            self.seqs.append(msg.seq)
            if self.stall_until is not None and not self.woke:
                while not self.stall_until():  # the whole process: no actor in it reads
                    pass
                self.woke = time.time()


def _gone_quiet(pid: int, window_s: float = 0.5, busy_s: float = 0.05, at_most_s: float = 30.0) -> Callable[[], bool]:
    """A wait (it sleeps ``window_s`` a call) that says True once process ``pid`` used less than
    ``busy_s`` of CPU in one window: it has handed over all it had, or it waits for room. A fixed
    stall would race the sender on a loaded machine; at most ``at_most_s`` in all."""
    proc = psutil.Process(pid)
    ends = time.monotonic() + at_most_s
    last = [sum(proc.cpu_times()[:2])]

    def quiet() -> bool:
        time.sleep(window_s)
        used = sum(proc.cpu_times()[:2])
        busy, last[0] = used - last[0], used
        return busy < busy_s or time.monotonic() > ends

    return quiet


@pytest.mark.parametrize("spill_bytes", [256 << 20, 0])
async def test_a_peer_that_stops_reading_for_a_while_does_not_hold_the_sender_up(spill_bytes: int) -> None:
    """The verifier sends results and verdicts to actors in the caller's process; an RL loop that
    trains in that process stops reading for a while. The sender goes on (its messages wait in
    its spill, in order) instead of waiting once the sockets are full; without a spill (0) it
    waits, which is what this test would see if the spill did not work."""
    async with ActorSystem("ipc") as system:
        # its process stops reading at the first payload, until the producer has gone quiet (done,
        # or waiting for room): 200 MB is more than the sockets hold
        reader = _SeqRecorder("reader", hwm=2)
        owner = Collector("owner")
        await system.spawn(reader)
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="producer", cls="specactor.actor.probes:Producer",
                                     kwargs={"target": "reader", "size": 1 << 20, "hwm": 2, "spill_bytes": spill_bytes}))
        reader.stall_until = _gone_quiet(system.pid("producer"))
        await system.send("producer", p.Payload(seq=200))
        await _until(lambda: reader.woke)
        woke = reader.woke
        await owner.send("producer", p.StatsRequest())
        _, reply = await asyncio.wait_for(owner.received.get(), DEADLINE_S)
        await _until(lambda: len(reader.seqs) == 200)
    assert reader.seqs == list(range(200))  # everything, in order
    if spill_bytes:
        assert reply.values["sent"] == 200 and 0 < reply.values["done_at"] < woke
    else:
        assert reply.values["done_at"] > woke
