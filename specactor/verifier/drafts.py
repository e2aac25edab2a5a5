"""The verifier's book of drafts: the freshest usable draft per request and method.

Drafts arrive asynchronously and may be stale. A draft covers output
positions ``start ..``; it is *usable* when it agrees with every token committed
since ``start`` (then it is trimmed to what follows), and it is dropped for good
when it disagrees (it continues a future that did not happen). A chunk that
continues a stored draft of the same method is appended to it, so a drafter
that streams its lookahead in pieces is verified as one draft. Each method's
drafts come from one drafter over one ordered channel, so a chunk that does not
continue the stored draft is the fresher one, even where it starts earlier: the
drafter rolled its lookahead back after a verdict and drafts again from the
committed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from specactor.engine.tree import matched


@dataclass
class StoredDraft:
    method: str
    start: int
    tokens: list[int]


def _agrees(draft: StoredDraft, committed: list[int]) -> bool:
    """Whether ``draft`` agrees with every committed token it covers."""
    overlap = min(len(committed) - draft.start, len(draft.tokens))
    return overlap <= 0 or draft.tokens[:overlap] == committed[draft.start:draft.start + overlap]


class DraftBook:
    def __init__(self) -> None:
        self._drafts: dict[str, dict[str, StoredDraft]] = {}

    def add(self, request_id: str, method: str, start: int, tokens: list[int],
            committed: list[int] | None = None) -> None:
        """Store a chunk. ``committed``: the request's output so far, against which a stored draft
        that the chunk would continue is checked first (a contradicted one is dropped, so that a
        fresh lookahead is not appended to a dead one). Before this, a piece of lookahead drafted
        just before a verdict that rolled it back, arriving after that verdict's step, was kept,
        and the drafter's fresh draft, which starts earlier, was ignored as late: the request's
        drafts of that method were blocked until the output reached the stale piece."""
        if start < 0:
            raise ValueError(f"draft for {request_id!r} starts at negative position {start}")
        by_method = self._drafts.setdefault(request_id, {})
        old = by_method.get(method)
        if old is not None and committed is not None and not _agrees(old, committed):
            del by_method[method]
            old = None
        if old is not None and old.start + len(old.tokens) == start:
            old.tokens.extend(tokens)
        elif tokens:  # the fresher draft replaces the stored one (an empty one carries no news)
            by_method[method] = StoredDraft(method, start, list(tokens))

    def candidates(self, request_id: str, committed: list[int], window: int,
                   methods: list[str] | None = None) -> list[tuple[str, list[int]]]:
        """Every usable draft (method, tokens), trimmed to ``window`` tokens, in
        the order of ``methods`` (None: any method, in arrival order)."""
        by_method = self._drafts.get(request_id)
        if not by_method:
            return []
        now = len(committed)
        out = []
        for method in list(by_method) if methods is None else [m for m in methods if m in by_method]:
            draft = by_method[method]
            if draft.start > now:
                continue  # drafted past an unverified lookahead: not yet usable
            if not _agrees(draft, committed):
                del by_method[method]  # contradicted: can never become usable
                continue
            overlap = now - draft.start
            if overlap >= len(draft.tokens):
                continue  # all of it is committed already; a continuing chunk may still extend it
            if overlap:  # what is committed need not be checked again (by add() either)
                del draft.tokens[:overlap]
                draft.start = now
            out.append((method, draft.tokens[:window]))
        return out

    def settle(self, request_id: str, committed: list[int], methods: list[str]) -> dict[str, list[int]]:
        """Score each of ``methods``' stored drafts on the tokens the output has passed since it was
        stored or last settled, ``[drafted, accepted]`` (all agreed: censored, ``drafted`` is what
        was checked), then trim what was scored, or drop the draft where it disagreed. For a draft
        nobody verifies (a shadow-scored request): one that arrived after the output passed its
        start is scored on that part too, where :meth:`candidates` would have dropped a wrong one
        unscored and trimmed a right one (scoring only the drafts whose passed part was right
        counted a lookup's runs and not its misses)."""
        by_method = self._drafts.get(request_id)
        if not by_method:
            return {}
        now = len(committed)
        scores = {}
        for method in [m for m in methods if m in by_method]:
            draft = by_method[method]
            overlap = min(now - draft.start, len(draft.tokens))
            if overlap <= 0:
                continue
            got = matched(draft.tokens[:overlap], committed[draft.start:now])
            if got < overlap:
                scores[method] = [got + 1, got]
                del by_method[method]
            else:
                scores[method] = [overlap, overlap]
                del draft.tokens[:overlap]
                draft.start += overlap
        return scores

    def drop_method(self, request_id: str, method: str) -> None:
        self._drafts.get(request_id, {}).pop(method, None)

    def methods(self, request_id: str) -> list[str]:
        return list(self._drafts.get(request_id, {}))

    def forget(self, request_id: str) -> None:
        self._drafts.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._drafts
