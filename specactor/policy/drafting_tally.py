"""A step's drafting time kept up to date while the policy's window search moves one row at a time.

``FastestOfN._allocate`` scores hundreds of allocations of one step, each differing from the last
in one request's window. Recomputing the drafting time from every row (``FastestOfN._drafting_s``)
made a plan cost O(rows^2 x windows): 0.2 s at batch 128 and 0.9 s at batch 256 on a 7B GPU
profile (T=0), where a step takes tens of milliseconds, and the policy shares its event loop with the
cheap drafters, which wait that long. The tally keeps, per method, what the formula
(:func:`drafting_seconds`) needs (rows per window, the log of the product of the longest window's
keep-chances, the largest per-row work) so that moving a row costs a binary search and a list
insertion, and reading the time O(windows). It computes what the formula does, up to rounding;
:class:`FromScratchTally` is the search as it was, for tests and ``bench/policy_plan_time.py``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from specactor.speculation import decoupled_lookahead
from specactor.policy.cost_model import CostModel, decoupled_work


def keep_chance(p, window: int, draft_rate):
    """The chance that a row drafting ``window`` tokens at per-token acceptance ``p`` keeps its
    lookahead through a step (it has no draft at all on a share ``1 - draft_rate`` of the steps).
    Floats or numpy arrays (:mod:`specactor.policy.window_sweep`)."""
    return 1 - draft_rate * (1 - p ** window)


def round_work(cut, longest: int):
    """Tokens a method's drafter drafts a round for rows whose longest window is ``longest``: its
    whole lookahead again where some row at that window was cut (chance ``cut``), the window and
    the step's own token otherwise. Floats or numpy arrays."""
    return cut * decoupled_lookahead(longest) + (1 - cut) * (longest + 1)


def drafting_seconds(cost: CostModel, rows: list[tuple[str, float, int, float]]) -> tuple[float, float, float]:
    """(coupled, decoupled, shared) drafting seconds of a step whose drafting rows are (method, p,
    window, draft rate). A method's drafter serves all its rows in one round, as long as its
    longest: coupled, its longest window; decoupled, a whole lookahead for the longest window
    unless every row drafting that window kept its lookahead (with many rows, nearly always
    some row's draft was cut), and at least what one row is expected to need
    (:func:`decoupled_work`). The methods' drafters run side by side, except those on the
    verifier's own hardware (``CostModel.shared_methods``): their decoupled time is ``shared``."""
    longest: dict[str, int] = {}
    kept: dict[str, float] = {}  # per method: the chance no row at its longest window was cut
    work: dict[str, float] = {}
    count: dict[str, int] = {}
    for method, p, w, q in sorted((r for r in rows if r[2]), key=lambda r: -r[2]):
        if method not in longest:
            longest[method], kept[method] = w, 1.0
        if w == longest[method]:
            kept[method] *= keep_chance(p, w, q)
        work[method] = max(work.get(method, 0.0), decoupled_work(p, w, q))
        count[method] = count.get(method, 0) + 1
    for m, w in longest.items():
        work[m] = max(work[m], round_work(1 - kept[m], w))
    shared_methods = cost.shared_methods
    coupled = max((longest[m] * cost.draft_s(m, count[m]) for m in longest), default=0.0)
    decoupled = max((work[m] * cost.draft_s(m, count[m]) for m in work if m not in shared_methods), default=0.0)
    shared = sum(work[m] * cost.draft_s(m, count[m]) for m in work if m in shared_methods)
    return coupled, decoupled, shared


@dataclass
class _MethodTally:
    """One method's drafting rows, by window."""

    rows: list[int]  # rows drafting each window 0..max_window (index 0 unused)
    #: per window: the sum of the logs of its rows' non-zero chances that their draft is not cut (a
    #: product could underflow to 0, and nothing could be divided out of it again)
    log_keep: list[float]
    zero_keeps: list[int]  # per window: rows certain to be cut (a chance of 0 has no log)
    works: list[float] = field(default_factory=list)  # every row's decoupled_work, sorted
    total: int = 0
    longest: int = 0  # the longest window drafting (0: none)


class DraftingTally:
    """``(coupled, decoupled, shared)`` drafting seconds of the rows ``entries[i] = (method, p,
    draft rate)`` at their current windows, for the methods in ``methods`` (the others' drafting
    is not counted, as ``_allocate`` counts only costly methods)."""

    def __init__(self, cost: CostModel, entries: list[tuple[str, float, float]], methods: set[str],
                 max_window: int) -> None:
        self.cost = cost
        self.entries = entries
        self.tallies = {m: _MethodTally([0] * (max_window + 1), [0.0] * (max_window + 1), [0] * (max_window + 1))
                        for m in methods}

    def move(self, i: int, old: int, new: int) -> None:
        """Row ``i``'s window went from ``old`` to ``new`` (0 = not drafting)."""
        if old == new:
            return
        method, p, q = self.entries[i]
        tally = self.tallies.get(method)
        if tally is None:
            return
        if old:
            self._remove(tally, p, q, old)
        if new:
            self._add(tally, p, q, new)

    @staticmethod
    def _add(tally: _MethodTally, p: float, q: float, w: int) -> None:
        factor = keep_chance(p, w, q)
        if factor > 0:
            tally.log_keep[w] += math.log(factor)
        else:
            tally.zero_keeps[w] += 1
        tally.rows[w] += 1
        tally.total += 1
        tally.longest = max(tally.longest, w)
        bisect.insort(tally.works, decoupled_work(p, w, q))

    @staticmethod
    def _remove(tally: _MethodTally, p: float, q: float, w: int) -> None:
        tally.rows[w] -= 1
        tally.total -= 1
        if not tally.rows[w]:  # start the window afresh: no rounding carried over
            tally.log_keep[w], tally.zero_keeps[w] = 0.0, 0
            if w == tally.longest:
                tally.longest = next((v for v in range(w - 1, 0, -1) if tally.rows[v]), 0)
        else:
            factor = keep_chance(p, w, q)
            if factor > 0:
                tally.log_keep[w] -= math.log(factor)
            else:
                tally.zero_keeps[w] -= 1
        del tally.works[bisect.bisect_left(tally.works, decoupled_work(p, w, q))]

    def seconds(self) -> tuple[float, float, float]:
        """What :func:`drafting_seconds` gives for the rows now drafting."""
        coupled = decoupled = shared = 0.0
        shared_methods = self.cost.shared_methods
        for method, tally in self.tallies.items():
            if not tally.total:
                continue
            longest = tally.longest
            cut = 1 - (0.0 if tally.zero_keeps[longest] else math.exp(tally.log_keep[longest]))
            work = max(tally.works[-1], round_work(cut, longest))
            per_token = self.cost.draft_s(method, tally.total)
            coupled = max(coupled, longest * per_token)
            if method in shared_methods:
                shared += work * per_token
            else:
                decoupled = max(decoupled, work * per_token)
        return coupled, decoupled, shared


class FromScratchTally(DraftingTally):
    """The same answers from every row at each reading: O(rows) a reading, what the window search
    paid before the tally (the reference for tests and ``bench/policy_plan_time.py``)."""

    def __init__(self, cost: CostModel, entries: list[tuple[str, float, float]], methods: set[str],
                 max_window: int) -> None:
        super().__init__(cost, entries, methods, max_window)
        self.windows = [0] * len(entries)

    def move(self, i: int, old: int, new: int) -> None:
        self.windows[i] = new

    def seconds(self) -> tuple[float, float, float]:
        return drafting_seconds(self.cost, [(m, p, w, q) for (m, p, q), w in zip(self.entries, self.windows)
                                            if w and m in self.tallies])
