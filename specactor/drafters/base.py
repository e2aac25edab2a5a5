"""The Drafter protocol and the per-request state every drafter shares.

A drafter proposes tokens for the *output* positions after a request's
committed tokens. In decoupled mode it drafts ahead of the last verdict: each
proposal continues from ``committed + lookahead`` (assuming its earlier
proposals will be accepted) and extends the lookahead. A verdict then either
confirms a prefix of the lookahead (kept, the rest goes on) or contradicts
it (the lookahead is discarded: a rollback). In coupled mode the lookahead is
empty whenever a proposal is made, because the caller waits for each verdict.

Drafters never affect the output, only speed: the verifier accepts a draft
token only where it equals the target's own choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class DraftState:
    """What a drafter knows about one request."""

    request_id: str
    prompt_ids: list[int]
    committed: list[int] = field(default_factory=list)  # output tokens the verifier committed
    lookahead: list[int] = field(default_factory=list)  # proposed, not yet verified
    seed: int = 0
    temperature: float = 1.0
    rollbacks: int = 0

    @property
    def lookahead_start(self) -> int:
        """Output position of ``lookahead[0]``."""
        return len(self.committed)

    def context(self) -> list[int]:
        """Prompt, committed output and the lookahead, the sequence to continue."""
        return self.prompt_ids + self.committed + self.lookahead

    def observe(self, start: int, tokens: list[int]) -> bool:
        """Apply a verdict: ``tokens`` were committed at output position ``start``.

        Returns False (and discards the lookahead) when the verdict contradicts it.
        """
        if start != len(self.committed):
            # A verdict we missed or a repeat: resynchronise on the verdict.
            if start > len(self.committed):
                raise ValueError(f"{self.request_id}: verdict at {start} skips output beyond {len(self.committed)}")
            tokens = tokens[len(self.committed) - start:]
        self.committed.extend(tokens)
        # The verdict may go past the lookahead (the verifier's own token) or
        # stop inside it: only the overlap has to agree.
        overlap = min(len(tokens), len(self.lookahead))
        if self.lookahead[:overlap] == tokens[:overlap]:
            del self.lookahead[:overlap]
            return True
        self.lookahead.clear()
        self.rollbacks += 1
        return False


class Drafter(Protocol):
    """One drafting method serving many requests.

    A drafter may set ``lookup = True`` when a proposal costs next to nothing per token (a
    lookup in text already seen, not a model): its actor then drafts all the room a request has
    in one round instead of ``k`` tokens at a time. A drafter may have ``ready`` False while it
    can propose nothing at all (a learned drafter before its first training round): its actor
    reports that, and the policy assigns it to no request meanwhile."""

    name: str

    def start(self, state: DraftState) -> None:
        """Begin drafting for a request (called once, before any proposal)."""

    def propose(self, states: list[DraftState], k: int) -> list[list[int]]:
        """Up to ``k`` tokens continuing each state's context (may be empty)."""

    def observe(self, state: DraftState, start: int, tokens: list[int]) -> None:
        """A verdict arrived for ``state`` (after ``state.observe`` ran)."""

    def finish(self, state: DraftState) -> None:
        """The request is done: free what the drafter holds for it."""
