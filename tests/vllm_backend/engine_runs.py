"""Driving a VllmEngine (or our Engine) to the end, as the verifier actor does, with a drafts function."""

from __future__ import annotations

from typing import Callable

from specactor.drafters.base import DraftState
from specactor.drafters.ngram import NgramDrafter
from specactor.protocol import SamplingParams
from specactor.engine.sequence import Sequence


def sequences(prompts: list[list[int]], temperature: float, max_tokens: int = 40, seed: int = 11) -> list[Sequence]:
    """One sample per prompt, seeded ``seed``, ``seed + 1``, ..."""
    return [Sequence(f"r{i}", list(p), SamplingParams(temperature=temperature, max_tokens=max_tokens), seed=seed + i)
            for i, p in enumerate(prompts)]


def run_to_end(engine, seqs: list[Sequence], drafter: Callable[[Sequence], list[int]] | None = None) -> list[Sequence]:
    """Add ``seqs``, step until all finish; before each step ``drafter`` drafts for every running request."""
    for seq in seqs:
        engine.add(seq)
    for _ in range(10_000):
        if not engine.has_work:
            break
        drafts = {s.request_id: ("x", drafter(s)) for s in engine.running} if drafter else None
        engine.step(drafts)
    assert not engine.has_work
    return seqs


def ngram_drafts(seq: Sequence, k: int = 4) -> list[int]:
    """specactor's ngram drafter on the sample's own tokens (what followed the last earlier
    occurrence of its last two tokens): code repeats itself, so some drafts are right even at T=1."""
    drafter, state = NgramDrafter(min_n=2, max_n=2), DraftState(seq.request_id, seq.prompt_ids,
                                                                 committed=list(seq.output_ids))
    drafter.start(state)
    return drafter.propose([state], k)[0]
