"""Malformed frames get an error event and an error reply; the actor goes on."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector, Echo

LIMIT = 4096

BAD_BODIES: dict[str, bytes] = {
    "random bytes": bytes(range(256))[::7] * 3,
    "unknown type tag": msgspec.msgpack.encode([99, "x", 1]),
    "wrong field types": msgspec.msgpack.encode([1, "not-an-int", 0]),
    "missing fields": msgspec.msgpack.encode([22, "r1"]),
    "not an array": msgspec.msgpack.encode({"kind": 1, "seq": 1}),
    "empty body": b"",
    "oversized payload": p.encode(p.Payload(seq=1, data=b"z" * (LIMIT + 1))),
}


def _raw_pusher(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


@pytest.mark.parametrize("transport, child", [("inproc", False), ("ipc", True), ("tcp", True)])
async def test_malformed_frames_are_rejected_and_valid_ones_still_served(transport, child, events_file) -> None:
    async with ActorSystem(transport) as system:
        client = Collector("client")
        await system.spawn(client)
        if child:
            address = await system.spawn(ActorSpec(name="echo", cls="specactor.actor.probes:Echo",
                                                   kwargs={"max_message_bytes": LIMIT}))
        else:
            address = await system.spawn(Echo("echo", max_message_bytes=LIMIT))
        ctx = zmq.Context.instance() if transport != "inproc" else system._ctx
        raw = _raw_pusher(ctx, address)
        try:
            for i, (what, body) in enumerate(BAD_BODIES.items()):
                # the raw socket speaks as "client", so replies reach the Collector
                raw.send_multipart([b"client", body])
                _, reply = await asyncio.wait_for(client.received.get(), 10)
                assert isinstance(reply, p.Error), what
                assert reply.code == "bad_message"
                # a valid message sent right after is still served
                raw.send_multipart(p.frames("client", p.Payload(seq=i, data=b"ok")))
                _, echo = await asyncio.wait_for(client.received.get(), 10)
                assert echo == p.Payload(seq=i, data=b"ok"), what
            # frames with no reply address: no reply, but the actor survives
            raw.send_multipart([b"\xff\xfe", b"junk"])
            raw.send_multipart([b"only-one-frame"])
            raw.send_multipart([b"a", b"b", b"c"])
            await client.send("echo", p.Payload(seq=99))
            _, echo = await asyncio.wait_for(client.received.get(), 10)
            assert echo == p.Payload(seq=99)
            assert client.received.empty()
        finally:
            raw.close(linger=0)
    bad = [e for e in events_file() if e["event"] == "actor.bad_message"]
    assert len(bad) == len(BAD_BODIES) + 3
    errors = " | ".join(e["error"] for e in bad)
    for expected in ("unknown message kind 99", "Ping.seq", "Draft", "exceeds the limit", "expected 2 frames",
                     "not UTF-8"):
        assert expected in errors


def test_error_replies_name_the_problem() -> None:
    for body, expected in [
        (BAD_BODIES["wrong field types"], "Ping.seq"),
        (BAD_BODIES["unknown type tag"], "unknown message kind 99"),
        (BAD_BODIES["missing fields"], "Draft"),
    ]:
        with pytest.raises(p.ProtocolError, match=expected):
            p.decode(body)


class _Picky(Collector):
    async def handle(self, sender: str, msg: p.Message) -> None:
        if isinstance(msg, p.Payload) and msg.seq < 0:
            raise ValueError("negative seq")
        await self.send(sender, msg)


async def test_a_failing_handler_replies_with_an_error_and_the_actor_goes_on(events_file) -> None:
    async with ActorSystem("inproc") as system:
        client = Collector("client")
        await system.spawn(client)
        await system.spawn(_Picky("picky"))
        await client.send("picky", p.Payload(seq=-1))
        _, reply = await asyncio.wait_for(client.received.get(), 5)
        assert isinstance(reply, p.Error) and reply.code == "handler_failed" and "negative seq" in reply.message
        await client.send("picky", p.Payload(seq=1))
        assert (await asyncio.wait_for(client.received.get(), 5))[1] == p.Payload(seq=1)
    assert any(e["event"] == "actor.handler_failed" for e in events_file())
