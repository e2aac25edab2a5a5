"""Prompt lookup (n-gram) drafting.

Find the longest suffix of the request's tokens (n from ``max_n`` down to
``min_n``) that occurred earlier in its prompt or output, and propose what
followed its most recent occurrence. The index is updated incrementally as
tokens are committed: each n-gram maps to the position right after its most
recent *earlier* occurrence, so a lookup never matches the suffix itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specactor.drafters.base import DraftState


@dataclass
class _Index:
    tokens: list[int] = field(default_factory=list)
    follow: dict[tuple[int, ...], int] = field(default_factory=dict)


class NgramDrafter:
    name = "ngram"
    lookup = True  # a proposal is a lookup, not a model: the actor drafts all the room in one round

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes must satisfy 1 <= min_n <= max_n (got {min_n}, {max_n})")
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[str, _Index] = {}

    def _extend(self, index: _Index, tokens: list[int]) -> None:
        for tok in tokens:
            index.tokens.append(tok)
            end = len(index.tokens) - 1  # the new token's position
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    # the n-gram ending just before the new token is followed by it
                    index.follow[tuple(index.tokens[end - n:end])] = end

    def start(self, state: DraftState) -> None:
        index = _Index()
        self._extend(index, state.prompt_ids + state.committed)
        self._index[state.request_id] = index

    def observe(self, state: DraftState, start: int, tokens: list[int]) -> None:
        index = self._index[state.request_id]
        known = len(index.tokens) - len(state.prompt_ids)
        self._extend(index, state.committed[known:])

    def propose(self, states: list[DraftState], k: int) -> list[list[int]]:
        return [self._propose_one(s, k) for s in states]

    def _propose_one(self, state: DraftState, k: int) -> list[int]:
        index = self._index[state.request_id]
        context = index.tokens + state.lookahead
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            follow = index.follow.get(tuple(context[-n:]))
            if follow is not None:
                # continue through the lookahead too, so drafting ahead works
                return context[follow:follow + k]
        return []

    def finish(self, state: DraftState) -> None:
        self._index.pop(state.request_id, None)
