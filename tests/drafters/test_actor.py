"""DraftActor: how far a decoupled drafter runs ahead, and in how many rounds."""

from __future__ import annotations

import asyncio

import pytest

from specactor import protocol as p
from specactor.actor import ActorSystem
from specactor.actor.probes import Collector
from specactor.drafters.actor import DraftActor
from specactor.drafters.base import decoupled_lookahead
from specactor.drafters.ngram import NgramDrafter

WINDOW = 8
#: 40 distinct tokens, twice: prompt lookup continues the second copy with the first's tokens
SEGMENT = list(range(100, 140))


async def _drafts(verifier: Collector, quiet_s: float = 0.3) -> list[p.Draft]:
    """Every Draft the drafter sends until it has been quiet for ``quiet_s``."""
    out: list[p.Draft] = []
    while True:
        try:
            _, msg = await asyncio.wait_for(verifier.received.get(), quiet_s)
        except asyncio.TimeoutError:
            return out
        assert isinstance(msg, p.DraftBatch)
        out.extend(d for d in msg.drafts if d.tokens)


async def _start(system: ActorSystem, k: int = 4) -> Collector:
    verifier = Collector("verifier")
    await system.spawn(verifier)
    await system.spawn(DraftActor("draft-ngram", "ngram", verifier="verifier", k=k, window=WINDOW))
    return verifier


def _track(mode: p.DraftMode, window: int) -> p.Track:
    return p.Track(request_id="r", context_ids=SEGMENT + SEGMENT[:4], prompt_len=len(SEGMENT) + 4,
                   window=window, mode=mode)


async def test_a_decoupled_lookup_drafter_fills_the_step_in_flight_and_the_next_in_one_round() -> None:
    lookahead = decoupled_lookahead(WINDOW)
    async with ActorSystem("inproc") as system:
        verifier = await _start(system)
        await verifier.send("draft-ngram", _track(p.DraftMode.DECOUPLED, lookahead))
        drafts = await _drafts(verifier)
        # a step verifies WINDOW tokens and commits one of its own: the next step's WINDOW come after
        assert [(d.start, d.tokens) for d in drafts] == [(0, SEGMENT[4:4 + lookahead])]
        # a step commits 9 of them: the drafter tops the run-ahead up again, from where it stood
        await verifier.send("draft-ngram", p.VerdictBatch(step=1, verdicts=[
            p.Verdict(request_id="r", start=0, tokens=SEGMENT[4:13], accepted=8, drafted=8)]))
        drafts = await _drafts(verifier)
        assert [(d.start, d.tokens) for d in drafts] == [(lookahead, SEGMENT[4 + lookahead:4 + 9 + lookahead])]


async def test_a_drafter_that_is_not_a_lookup_drafts_k_tokens_a_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NgramDrafter, "lookup", False)
    lookahead = decoupled_lookahead(WINDOW)
    async with ActorSystem("inproc") as system:
        verifier = await _start(system, k=4)
        await verifier.send("draft-ngram", _track(p.DraftMode.DECOUPLED, lookahead))
        drafts = await _drafts(verifier)
    assert [len(d.tokens) for d in drafts] == [4, 4, 4, 4, 1]
    assert sum((d.tokens for d in drafts), []) == SEGMENT[4:4 + lookahead]


async def test_a_coupled_request_drafts_at_most_the_window_and_waits() -> None:
    async with ActorSystem("inproc") as system:
        verifier = await _start(system)
        await verifier.send("draft-ngram", _track(p.DraftMode.COUPLED, decoupled_lookahead(WINDOW)))
        drafts = await _drafts(verifier)
    assert [(d.start, d.tokens) for d in drafts] == [(0, SEGMENT[4:4 + WINDOW])]
