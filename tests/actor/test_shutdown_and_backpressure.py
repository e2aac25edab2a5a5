"""Shutdown under load loses nothing; a slow consumer bounds the producer's memory."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector, Producer


@pytest.mark.parametrize("transport, n", [("inproc", 20000), ("ipc", 5000), ("tcp", 3000)])
async def test_shutdown_under_load_loses_nothing(transport: str, n: int) -> None:
    """Three producers (one local, two in child processes where possible) each
    send n messages; shutdown starts while they are in flight."""
    sink = Collector("sink")
    sink.keep = False  # count only; do not queue
    async with ActorSystem(transport) as system:
        await system.spawn(sink)
        await system.spawn(Producer("local", target="sink"))
        names = ["local"]
        if transport != "inproc":
            for i in range(2):
                await system.spawn(ActorSpec(name=f"remote{i}", cls="specactor.actor.probes:Producer",
                                             kwargs={"target": "sink", "hwm": 50}))
                names.append(f"remote{i}")
        for name in names:
            await system.send(name, p.Payload(seq=n))
        at_shutdown = sink.count
    assert at_shutdown < n * len(names), "test too easy: everything arrived before shutdown"
    assert sink.count == n * len(names)


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
        await system.send("producer", p.Payload(seq=100_000))
        samples = []
        for _ in range(20):
            await asyncio.sleep(0.1)
            samples.append(proc.memory_info().rss)
        received = slow.count
        # The consumer got only what it could handle (about 1 per ms) ...
        assert received < 5000
        # ... and the producer holds at most its spill (4 MB) and a few MB of queued frames, not 200 MB.
        growth_mb = (max(samples) - rss_before) / 2**20
        assert growth_mb < 16, f"producer grew by {growth_mb:.1f} MB"
        # the producer is blocked on sending, not dead
        assert system.live() == ["slow", "producer"]
        await system.stop("producer", timeout_s=0.5)


async def test_an_advisory_send_to_a_full_peer_is_dropped_at_once_not_waited_for() -> None:
    """The verifier's VerdictBatches to the policy (which lives in the caller's process) use this:
    a caller whose loop stops reading must not stall verification."""
    import time

    from specactor.actor.probes import Collector

    async with ActorSystem("inproc") as system:
        stuck = Collector("stuck", delay_s=3600, hwm=4)  # handles one message, then never again
        sender = Collector("sender", hwm=4)
        await system.spawn(stuck)
        await system.spawn(sender)
        started = time.monotonic()
        results = [await sender.send("stuck", p.Payload(seq=i), timeout_s=0) for i in range(200)]
        assert time.monotonic() - started < 5.0
        assert results[0] and not all(results) and results.count(True) < 50


class _SeqRecorder(Collector):
    """Keeps only the order of the payloads' sequence numbers (the payloads are large); with
    ``stall_s``, its process stops reading for that long at the first payload (an RL loop's
    training step), and ``woke`` is when it read on."""

    def __init__(self, name: str, stall_s: float = 0.0, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.seqs: list[int] = []
        self.stall_s, self.woke = stall_s, 0.0

    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Payload):
            self.seqs.append(msg.seq)
            if self.stall_s and not self.woke:
                import time

                time.sleep(self.stall_s)  # the whole process: no actor in it reads
                self.woke = time.time()


@pytest.mark.parametrize("spill_bytes", [256 << 20, 0])
async def test_a_peer_that_stops_reading_for_a_while_does_not_hold_the_sender_up(spill_bytes: int) -> None:
    """The verifier sends results and verdicts to actors in the caller's process; an RL loop that
    trains in that process stops reading for a while. The sender goes on (its messages wait in
    its spill, in order) instead of waiting once the sockets are full; without a spill (0) it
    waits, which is what this test would see if the spill did not work."""
    async with ActorSystem("ipc") as system:
        # its process stops reading at the first payload: 200 MB is more than the sockets hold (the
        # test stopped reading itself 50 ms after asking for them, and on a loaded machine the
        # reader had taken them all by then)
        reader = _SeqRecorder("reader", stall_s=1.5, hwm=2)
        owner = Collector("owner")
        await system.spawn(reader)
        await system.spawn(owner)
        await system.spawn(ActorSpec(name="producer", cls="specactor.actor.probes:Producer",
                                     kwargs={"target": "reader", "size": 1 << 20, "hwm": 2, "spill_bytes": spill_bytes}))
        await system.send("producer", p.Payload(seq=200))
        for _ in range(400):
            if reader.woke:
                break
            await asyncio.sleep(0.05)
        woke = reader.woke
        await owner.send("producer", p.StatsRequest())
        _, reply = await asyncio.wait_for(owner.received.get(), 20)
        for _ in range(400):
            if len(reader.seqs) == 200:
                break
            await asyncio.sleep(0.05)
    assert reader.seqs == list(range(200))  # everything, in order
    if spill_bytes:
        assert reply.values["sent"] == 200 and 0 < reply.values["done_at"] < woke
    else:
        assert reply.values["done_at"] > woke
