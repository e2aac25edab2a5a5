"""Every message type crosses every transport unchanged; actors in child
processes and in the parent talk to each other."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem, class_path
from specactor.actor.address import AddressAllocator
from specactor.actor.mailbox import Mailbox
from specactor.actor.probes import Collector, Echo
from tests.test_protocol import EXAMPLES

TRANSPORTS = ["inproc", "ipc", "tcp"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_message_type_round_trips_over_the_wire(transport: str) -> None:
    ctx = zmq.Context()
    alloc = AddressAllocator(transport)
    a = Mailbox(ctx, alloc.allocate("a"), hwm=100, linger_ms=100, max_message_bytes=1 << 20)
    b = Mailbox(ctx, alloc.allocate("b"), hwm=100, linger_ms=100, max_message_bytes=1 << 20)
    try:
        for msg in EXAMPLES.values():
            # a -> b, then b echoes the decoded message back -> a
            await a.send("b", b.address, p.frames("a", msg), timeout_ms=2000)
            [[sender, body]] = await asyncio.wait_for(b.recv_burst(), 5)
            assert sender == b"a"
            there = p.decode(body)
            assert there == msg
            await b.send("a", a.address, p.frames("b", there), timeout_ms=2000)
            [[sender, body]] = await asyncio.wait_for(a.recv_burst(), 5)
            assert sender == b"b" and p.decode(body) == msg
    finally:
        a.close()
        b.close()
        ctx.destroy(linger=0)
        alloc.cleanup()


async def _ask(collector: Collector, system_send, target: str, msg: p._Msg) -> p.Message:
    await system_send(target, msg)
    sender, reply = await asyncio.wait_for(collector.received.get(), 10)
    assert sender == target
    return reply


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_actors_exchange_messages(transport: str) -> None:
    """An Echo actor (a child process where the transport allows) answers a
    Collector in the parent, for every non-control message type."""
    async with ActorSystem(transport) as system:
        collector = Collector("collector")
        await system.spawn(collector)
        if transport == "inproc":
            await system.spawn(Echo("echo"))
        else:
            await system.spawn(ActorSpec(name="echo", cls=class_path(Echo)))
            assert system.pid("echo") != system.pid("collector")
        # (an Error is never answered, so not echoed either)
        control = (p.Ping, p.Pong, p.Stop, p.Goodbye, p.GoodbyeAck, p.PeerDirectory, p.PeerDown, p.Ready, p.Heartbeat,
                   p.StatsRequest, p.DirectoryAck, p.Error)
        for kind, msg in EXAMPLES.items():
            if kind in control:
                continue
            await collector.send("echo", msg)
            sender, reply = await asyncio.wait_for(collector.received.get(), 10)
            assert (sender, reply) == ("echo", msg)
        # Ping is answered by the runtime itself
        await collector.send("echo", p.Ping(seq=9, sent_ns=1))
        assert await asyncio.wait_for(collector.received.get(), 10) == ("echo", p.Pong(seq=9, sent_ns=1))


async def test_child_processes_talk_to_each_other_and_to_the_parent() -> None:
    async with ActorSystem("ipc") as system:
        collector = Collector("collector")
        await system.spawn(collector)
        await system.spawn(ActorSpec(name="sink", cls="specactor.actor.probes:Sink"))
        await system.spawn(ActorSpec(name="producer", cls="specactor.actor.probes:Producer",
                                     kwargs={"target": "sink"}))
        assert len({system.pid(n) for n in ("collector", "sink", "producer")}) == 3
        await collector.send("producer", p.Payload(seq=500))
        for _ in range(100):
            await collector.send("sink", p.StatsRequest())
            _, reply = await asyncio.wait_for(collector.received.get(), 10)
            assert isinstance(reply, p.StatsReply)
            if reply.values["count"] == 500:
                break
            await asyncio.sleep(0.05)
        assert reply.values["count"] == 500


async def test_bad_spec_is_reported_clearly() -> None:
    async with ActorSystem("ipc", ready_timeout_s=30) as system:
        with pytest.raises(RuntimeError, match="exited with code"):
            await system.spawn(ActorSpec(name="ghost", cls="specactor.actor.probes:NoSuchActor"))
        with pytest.raises(ValueError, match="inproc cannot reach"):
            async with ActorSystem("inproc") as other:
                await other.spawn(ActorSpec(name="echo", cls=class_path(Echo)))
        with pytest.raises(ValueError, match="actor name"):
            await system.spawn(Echo("bad name!"))
