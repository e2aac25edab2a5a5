"""The verifier's book of drafts: the freshest usable draft per request.

Drafts arrive asynchronously and may be stale. A draft covers output
positions ``start ..``; it is *usable* when it agrees with every token committed
since ``start`` (then it is trimmed to what follows), and it is dropped for good
when it disagrees (it continues a future that did not happen). A chunk that
continues a stored draft of the same method is appended to it, so a drafter
that streams its lookahead in pieces is verified as one draft.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StoredDraft:
    method: str
    start: int
    tokens: list[int]


class DraftBook:
    def __init__(self) -> None:
        self._drafts: dict[str, dict[str, StoredDraft]] = {}

    def add(self, request_id: str, method: str, start: int, tokens: list[int]) -> None:
        if start < 0:
            raise ValueError(f"draft for {request_id!r} starts at negative position {start}")
        by_method = self._drafts.setdefault(request_id, {})
        old = by_method.get(method)
        if old is not None and old.start + len(old.tokens) == start:
            old.tokens.extend(tokens)
        elif old is None or start >= old.start or not tokens:
            # a fresher base replaces the old draft (empty drafts carry no news)
            if tokens:
                by_method[method] = StoredDraft(method, start, list(tokens))
        # else: an older, non-contiguous chunk arrived late: ignore it

    def usable(self, request_id: str, committed: list[int], window: int) -> tuple[str, list[int]]:
        """The longest usable draft (method, tokens) trimmed to ``window`` tokens."""
        by_method = self._drafts.get(request_id)
        best: tuple[str, list[int]] = ("", [])
        if not by_method:
            return best
        now = len(committed)
        for method in list(by_method):
            draft = by_method[method]
            if draft.start > now:
                continue  # drafted past an unverified lookahead: not yet usable
            overlap = now - draft.start
            if draft.tokens[:overlap] != committed[draft.start:now]:
                del by_method[method]  # contradicted: can never become usable
                continue
            if overlap >= len(draft.tokens):
                continue  # all of it is committed already; a continuing chunk may still extend it
            tokens = draft.tokens[overlap:overlap + window]
            if len(tokens) > len(best[1]):
                best = (method, tokens)
        return best

    def forget(self, request_id: str) -> None:
        self._drafts.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._drafts
