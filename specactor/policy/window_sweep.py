"""The first phase of the policy's window search, every batch prefix at once.

``FastestOfN._allocate`` first tries, for each window w, the k requests of highest acceptance
drafting w tokens, for every k. Scored one allocation at a time that is windows x rows calls of
the step's cost model in Python: most of a plan at batch 256 (~70 ms on a GPU profile, where
steps take 15-50 ms). Every quantity of a prefix is a running sum, product or maximum over its
rows, so numpy gives all k of one window in a few array operations. The arithmetic is the
scalar search's, in the same order, so the two agree to the last bits or so; a speed must beat
the best by a relative 1e-12 to count, which no rounding difference reaches.
"""

from __future__ import annotations

import numpy as np

from specactor.policy.cost_model import CostModel, StepCosts, decoupled_work, rows_between
from specactor.policy.drafting_tally import keep_chance, round_work


def _interp(xs: list[float], ys: list[float], x: np.ndarray) -> np.ndarray:
    """:func:`specactor.policy.cost_model._interp` over an array of x."""
    if len(xs) == 1:
        return ys[0] * x / xs[0] if xs[0] else np.full_like(x, ys[0])
    ax, ay = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    i = np.clip(np.searchsorted(ax, x, side="left"), 1, len(xs) - 1)
    x0, x1, y0, y1 = ax[i - 1], ax[i], ay[i - 1], ay[i]
    return np.maximum(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


def verify_many(steps: StepCosts, fed: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """:meth:`StepCosts.verify` for arrays of ``fed`` tokens and drafting ``rows`` (not None)."""
    b, plain = steps.batch, steps.decode
    if b <= 0:
        raw = np.zeros_like(fed)
    elif steps.one_row is None:
        raw = _interp(steps.chunks, steps.uniform, fed / b)
    else:
        extra = fed - b
        r = np.minimum(rows, float(b))
        safe_r = np.where(r > 1e-9, r, 1.0)
        chunk = 1.0 + extra / safe_r
        one = _interp(steps.chunks, steps.one_row, chunk)
        half = None if steps.half_rows is None else _interp(steps.chunks, steps.half_rows, chunk)
        spread = rows_between(r, float(b), one, half, _interp(steps.chunks, steps.uniform, chunk))
        raw = np.where(r < 1.0, plain + r * (one - plain), spread)
        raw = np.where((extra <= 1e-9) | (rows <= 1e-9), plain, raw)
    added = raw - plain
    drafting = np.minimum(np.maximum(rows, 0.0), 1.0)
    return np.where(fed <= b + 1e-9, plain + added, plain + drafting * steps.draft_fixed + steps.extra_scale * added)


class WindowSweep:
    """Speeds of the allocations "the first k requests of ``order`` draft w tokens, the others
    none", for one step's cost model and requests ``entries[i] = (method, p, draft rate)``;
    ``gains[i][w]``: request i's expected extra tokens at window w; ``costly``: the methods whose
    drafting time counts (as ``_allocate`` decides); ``decoupled``: the policy's drafting mode
    (its step time, ``FastestOfN._latency``)."""

    def __init__(self, steps: StepCosts, cost: CostModel, entries: list[tuple[str, float, float]],
                 order: list[int], gains: list[list[float]], costly: set[str], base_fed: float,
                 decoupled: bool) -> None:
        self.steps, self.cost, self.order = steps, cost, order
        self.gains, self.costly = gains, costly
        self.base_fed, self.decoupled = base_fed, decoupled
        self.q = np.array([entries[i][2] for i in order], dtype=float)
        self.p = np.array([entries[i][1] for i in order], dtype=float)
        self.methods = [entries[i][0] for i in order]
        self.n = float(len(entries))

    def speeds(self, w: int, reach: int) -> list[float]:
        """The batch's predicted tokens per second for k = 1..reach."""
        q, p = self.q[:reach], self.p[:reach]
        gains = np.array([self.gains[i][w] for i in self.order[:reach]], dtype=float)
        progress = np.cumsum(np.concatenate(([self.n], gains)))[1:]
        fed = np.cumsum(np.concatenate(([self.base_fed], q * w)))[1:]
        rows = np.cumsum(np.concatenate(([0.0], q)))[1:]
        verify = verify_many(self.steps, fed, rows)
        if self.costly:
            coupled, decoupled, shared = self._drafting(w, reach, p, q)
            if self.decoupled:
                latency = np.maximum(verify + shared, decoupled)
            else:
                latency = np.maximum(verify + coupled, 0.0)
        else:
            latency = verify
        safe = np.where(latency > 0, latency, 1.0)
        return np.where(latency > 0, progress / safe, 0.0).tolist()

    def _drafting(self, w: int, reach: int, p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, ...]:
        """:class:`~specactor.policy.drafting_tally.DraftingTally`'s (coupled, decoupled, shared)
        for every prefix, all its rows at window w."""
        factor = keep_chance(p, w, q)
        work_row = decoupled_work(p, w, q)
        coupled = np.zeros(reach)
        decoupled = np.zeros(reach)
        shared = np.zeros(reach)
        names = np.array(self.methods[:reach])
        for method in self.costly:
            mask = names == method
            if not mask.any():
                continue
            count = np.cumsum(mask)
            positive = mask & (factor > 0)
            log_keep = np.cumsum(np.where(positive, np.log(np.where(positive, factor, 1.0)), 0.0))
            zeros = np.cumsum(mask & ~(factor > 0))
            rowmax = np.maximum.accumulate(np.where(mask, work_row, -np.inf))
            cut = 1 - np.where(zeros > 0, 0.0, np.exp(log_keep))
            work = np.maximum(rowmax, round_work(cut, w))
            cost = self.cost.draft.get(method)
            per_token = count * cost.per_row_s + cost.fixed_s if cost is not None else np.zeros(reach)
            present = count > 0
            coupled = np.maximum(coupled, np.where(present, w * per_token, 0.0))
            spent = np.where(present, work * per_token, 0.0)
            if method in self.cost.shared_methods:
                shared = shared + spent
            else:
                decoupled = np.maximum(decoupled, spent)
        return coupled, decoupled, shared
