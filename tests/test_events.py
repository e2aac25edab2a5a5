"""Structured events: fields, multi-process files, and a complete catalogue."""

from __future__ import annotations

import re
from pathlib import Path

import structlog

from specactor import protocol as p
from specactor.actor import ActorSpec, ActorSystem
from specactor.actor.probes import Collector
from specactor.events import CATALOGUE, catalogue_markdown, get_logger

ROOT = Path(__file__).resolve().parents[1]


def test_every_event_has_timestamp_actor_and_name(events_file) -> None:
    log = get_logger(actor="verifier")
    with structlog.contextvars.bound_contextvars(request_id="r7"):
        log.info("actor.started", address="inproc://x")
    [event] = events_file()
    assert event["event"] == "actor.started"
    assert event["actor"] == "verifier"
    assert event["request_id"] == "r7"
    assert isinstance(event["ts"], float) and event["ts"] > 1.6e9
    assert event["address"] == "inproc://x"


async def test_child_processes_append_to_the_same_file(events_file) -> None:
    async with ActorSystem("ipc") as system:
        await system.spawn(Collector("c"))
        for i in range(3):
            await system.spawn(ActorSpec(name=f"echo{i}", cls="specactor.actor.probes:Echo"))
        pids = {system.pid(f"echo{i}") for i in range(3)}
        for i in range(3):
            await system.send(f"echo{i}", p.Payload(seq=i))
    events = events_file()  # every line parsed as JSON: no interleaving
    started = {e["pid"] for e in events if e["event"] == "actor.started"}
    assert pids <= started
    assert {e["actor"] for e in events if e["event"] == "actor.stopped"} >= {"echo0", "echo1", "echo2", "c"}


def test_every_emitted_event_name_is_catalogued() -> None:
    pattern = re.compile(r'\.(?:debug|info|warning|error|critical)\(\s*"([a-z_]+\.[a-z_.]+)"')
    emitted = set()
    for path in (ROOT / "specactor").rglob("*.py"):
        emitted |= set(pattern.findall(path.read_text()))
    assert emitted, "no events found: the pattern is wrong"
    assert emitted - set(CATALOGUE) == set()


def test_docs_match_the_catalogue() -> None:
    assert (ROOT / "docs" / "events.md").read_text() == catalogue_markdown()
