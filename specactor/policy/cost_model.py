"""The cost model of SpecActor (arXiv 2511.16193, decoupled speculation): what a verify step and a draft token cost, and
how many tokens per second a choice of method, window and mode buys.

Verify time ``V(b, c)`` (batch b, c new tokens per request) is interpolated in
the engine's profile: this machine's, measured once at start-up and cached
(:mod:`specactor.engine.profiling`), else the packaged one (the default model
on another 2-core CPU), corrected online in two parts, both per profiled batch size (a profile's error
depends on the batch: on the 2-core machine one measured at another time said
94 ms for a decode step at batch 4 and 166 at batch 12, where the machine then
took 135 and 180): plain steps by the median ratio of measured to profiled
time over its last plain steps (with the ratio over all batch sizes as prior:
one slow step moves nothing, and a batch that drafts on nearly every step
keeps the plain steps it saw), and what drafts add to a step by a fit (:class:`DraftOverhead`: a fixed cost
of having drafts at all, plus a scale on what the profile says they add). The
second part decides whether to speculate, and its error depends on the batch:
on the 2-core AVX2 machine one drafted token in a batch of 32 adds 15-90 ms
where the profile says 0-4 ms, while at batch 4 the profile is near the truth;
one scalar learnt in the large-batch phase made the tail (where speculation
pays) draft 1-token windows at 100% acceptance.
Drafting time per token ``D(b) = b*D' + alpha`` is learnt per method from the
drafters' own timings.

A step where only some rows verify drafts does not cost the uniform ``V(b, fed/b)``:
the engine gives those rows an attention part of their own, whose fixed cost
the first drafting row pays alone (on a 2-core AVX2 CPU, one row verifying 4
tokens in a batch of 12 adds 50-80 ms to a 145 ms decode step, a third of what
all twelve rows doing so add). A profile may therefore also hold ``one_row_s``
(one row fed c tokens, the others one) and ``half_rows_s`` (half the rows fed c
tokens); a step with r drafting rows is then interpolated between the one-row,
half-rows and uniform figures (:meth:`CostModel.verify_rows_s`). The cost is not
linear in r: past a few drafting rows the engine pads every row's queries to the
longest chunk, and the step costs nearly what every row drafting costs (on this
2-core CPU at batch 32, 16 rows drafting one token took 88 ms where a decode step
took 66 and every row drafting 90; interpolated between one row and every row,
the profile said 77). Without the half-rows figure (an older or vLLM profile),
the interpolation is straight from one row to every row.

With per-token acceptance p and window w, accepted tokens follow a truncated
geometric law and a verify step makes ``E = (1 - p**(w+1)) / (1 - p)`` tokens
of progress (the verifier's own token included). Coupled iterations take
``w*D + V``, decoupled ones ``max(w*D, V)``. A method that drafts on a share q of
the steps only (no match, no draft) makes ``1 + q*(E - 1)`` tokens of progress
for ``1 + q*w`` tokens verified.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from itertools import accumulate
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from specactor.engine.profiling import HALF_ROWS_FROM, check_profile
from specactor.speculation import DRAFT_COST_STATS, DRAFT_PREFILL_STATS, decoupled_lookahead


#: a draft token accepted with less probability than this buys next to nothing
NEGLIGIBLE = 0.02


def useful_window(p: float, max_window: int) -> int:
    """The longest window (at most ``max_window``) whose last token is accepted with probability
    at least NEGLIGIBLE (``p ** w``): tokens past it add to a step's cost and nearly nothing to its
    progress, so a search for the best window stops there (at T=1, p ~ 0.3-0.5: 3-5 of 16)."""
    if p >= 1.0:
        return max_window
    if p < NEGLIGIBLE:
        return 0
    return min(max_window, int(math.log(NEGLIGIBLE) / math.log(p)))


def expected_progress(p: float, window: int) -> float:
    """Expected tokens committed per verify step: E[min(Geom, w)] + 1."""
    p = min(max(p, 0.0), 1.0)
    if window <= 0:
        return 1.0
    if p >= 1.0:
        return float(window + 1)
    return (1.0 - p ** (window + 1)) / (1.0 - p)


def decoupled_work(p: float, window: int, draft_rate: float = 1.0) -> float:
    """Tokens a decoupled drafter drafts a step for one request verifying up to ``window`` of them
    at per-token acceptance ``p``: the ``window + 1`` the step used while the whole lookahead
    survives (``p**window``), and its whole lookahead (:func:`decoupled_lookahead`) again after a
    step that cut it, since a rollback discards everything past the first wrong token; one token's
    worth (a lookup that found nothing) on the steps without a draft (``1 - draft_rate``).
    Coupled drafting drafts ``window`` a step, after the verdict: no waste, but on the critical path."""
    if window <= 0:
        return 0.0
    survive = p ** window
    return draft_rate * (survive * (window + 1) + (1 - survive) * decoupled_lookahead(window)) + (1 - draft_rate)


def iteration_s(verify: float, beside: float = 0.0, added: float = 0.0) -> float:
    """Seconds of one step: the verify step plus the drafting that runs on its hardware or waits
    for it (``added``: coupled drafting, or a drafter on the verifier's own hardware), or the
    drafting beside it on hardware of its own (``beside``: decoupled), whichever ends last."""
    return max(verify + added, beside)


def progress_by_window(p: float, max_window: int) -> list[float]:
    """``expected_progress(p, w)`` for w = 0..max_window, in one pass (the policy's allocation
    needs every window of every request at each plan)."""
    p = min(max(p, 0.0), 1.0)
    return list(accumulate((p ** j for j in range(1, max_window + 1)), initial=1.0))


def race_progress(ps: list[float], window: int) -> float:
    """Expected progress when several independent drafts are verified and the longest kept."""
    if window <= 0 or not ps:
        return 1.0
    total = 1.0
    for j in range(1, window + 1):
        miss = 1.0
        for p in ps:
            miss *= 1.0 - min(max(p, 0.0), 1.0) ** j
        total += 1.0 - miss
    return total


def rows_between(r: float, b: float, one: float, half: float | None, every: float) -> float:
    """A step's seconds with ``r`` of its ``b`` rows drafting (1 <= r <= b), piecewise linear
    through one row (``one``), half the rows (``half``; None: not measured, a straight line) and
    every row (``every``). Works on floats and numpy arrays alike (the window sweep's)."""
    if half is None:
        return one + (r - 1.0) / (b - 1.0) * (every - one)
    h = b / 2.0
    low = one + (r - 1.0) / (h - 1.0) * (half - one)
    high = half + (r - h) / (b - h) * (every - half)
    return low * (r <= h) + high * (r > h)


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation, extrapolated linearly beyond the ends."""
    if len(xs) == 1:
        return ys[0] * x / xs[0] if xs[0] else ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


def _isotonic(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def monotone(table: list[list[float]]) -> list[list[float]]:
    """A profile table made non-decreasing in batch size and in chunk length.

    A forward never gets cheaper with more rows or more tokens, but a timing of a few repeats
    on a noisy machine can say so (measured here: batch 8 decoding in 180 ms, batch 16 in
    153 ms, and 2 tokens a row at batch 8 in 165 ms), and a policy that believes it verifies
    drafts for less than a decode step. Each batch column is fitted isotonically, then each
    row is made non-decreasing in chunk length."""
    columns = [_isotonic(list(column)) for column in zip(*table)]
    return [list(accumulate(row, max)) for row in zip(*columns)]


@dataclass
class DraftCost:
    """Running estimate of one method's drafting time per token: ``b*per_row + fixed``, or, for a
    drafter that measured itself (:meth:`adopt_table`), its table interpolated over batch sizes
    times a scale learnt from what it then reports (a model copy's cost is far from a line in the
    batch: llama.cpp's 8-bit kernel takes 6.5 ms for one row and 15 for two on a 2-core CPU)."""

    per_row_s: float = 0.0
    fixed_s: float = 0.0
    samples: int = 0
    table: dict[int, float] | None = None  # batch -> seconds of a round giving each row a token
    scale: float = 1.0  # measured / table, learnt online
    prefill_s: float = 0.0  # seconds per context token a first proposal feeds (0: nothing to feed)

    def seconds(self, batch: int) -> float:
        if self.table:
            return self.scale * _table_at(self.table, batch)
        return batch * self.per_row_s + self.fixed_s

    def adopt_table(self, table: dict[int, float]) -> None:
        """Price from now on by ``table`` (the drafter's profile); the online scale starts at 1."""
        self.table, self.scale = dict(sorted(table.items())), 1.0

    def observe(self, batch: int, tokens_per_row: float, seconds: float, weight: float = 0.2) -> None:
        """One drafting call for ``batch`` requests that produced ``tokens_per_row`` each."""
        if tokens_per_row <= 0 or batch <= 0:
            return
        per_token = seconds / tokens_per_row
        if self.table:
            ratio = min(max(per_token / _table_at(self.table, batch), 0.25), 4.0)
            self.scale += weight * (ratio - self.scale)
            self.samples += 1
            return
        # Split the observation between the two terms in proportion to the current guess.
        guess = self.seconds(batch)
        share = (batch * self.per_row_s / guess) if guess > 0 else 0.5
        per_row, fixed = per_token * share / batch, per_token * (1 - share)
        if self.samples == 0:
            self.per_row_s, self.fixed_s = per_row, fixed
        else:
            self.per_row_s += weight * (per_row - self.per_row_s)
            self.fixed_s += weight * (fixed - self.fixed_s)
        self.samples += 1


def _table_at(table: dict[int, float], batch: float) -> float:
    """``table`` (batch -> seconds) interpolated at ``batch``; past its largest batch size, the
    last segment's slope (at least flat); below its smallest, its first figure."""
    sizes = list(table)
    if batch <= sizes[0] or len(sizes) == 1:
        return table[sizes[0]] if batch <= sizes[0] else table[sizes[0]] * batch / sizes[0]
    if batch >= sizes[-1]:
        a, b = sizes[-2], sizes[-1]
        slope = max(0.0, (table[b] - table[a]) / (b - a))
        return table[b] + slope * (batch - b)
    return _interp([float(s) for s in sizes], [table[s] for s in sizes], batch)


def table_from_stats(values: dict[str, float]) -> dict[int, float]:
    """The drafter's cost table a StatsReply carries (``draft_cost_s/<batch>``); {} when it
    carries none, or one with a malformed key or a time that is not a positive number."""
    out: dict[int, float] = {}
    for name, seconds in values.items():
        if not name.startswith(DRAFT_COST_STATS) or name == DRAFT_PREFILL_STATS:
            continue
        try:
            batch = int(name[len(DRAFT_COST_STATS):])
        except ValueError:
            return {}
        if batch < 1 or not 0 < seconds < 3600:
            return {}
        out[batch] = float(seconds)
    return dict(sorted(out.items()))


@dataclass
class DraftOverhead:
    """What drafts add to a step at one profiled batch size, learnt from measured steps:
    ``added = fixed + scale * profiled`` (a drafting row's attention part has a fixed cost
    that the profile may get wrong by more than its per-token cost). A ridge fit pulled
    towards the profile (fixed 0, scale 1) by ``fixed_prior`` observations and, for the
    scale, ``scale_prior`` observations whose drafts the profile says add a quarter of a
    decode step, on exponentially discounted sums: a few noisy steps cannot swing it, a
    machine that changes is followed, and steps whose drafts the profile says cost next to
    nothing inform the fixed cost rather than the scale."""

    fixed_prior: float = 1.0
    scale_prior: float = 4.0
    decay: float = 0.98
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, profiled: float, measured: float, weight: float = 1.0) -> None:
        """One drafting step: the profile said it adds ``profiled`` seconds, it added ``measured``."""
        if weight <= 0:
            return
        d = self.decay ** weight
        self.n = self.n * d + weight
        self.sx = self.sx * d + weight * profiled
        self.sy = self.sy * d + weight * measured
        self.sxx = self.sxx * d + weight * profiled * profiled
        self.sxy = self.sxy * d + weight * profiled * measured

    def fit(self, decode_s: float) -> tuple[float, float]:
        """(fixed seconds, scale) for a batch whose decode step takes ``decode_s``: the
        regularised least-squares fit, fixed in [0, 2 decode steps] and scale in [0.25, 8]."""
        if self.n <= 0:
            return 0.0, 1.0
        max_fixed = 2.0 * decode_s
        prior = self.scale_prior * (0.25 * decode_s) ** 2
        a11, a12, a22 = self.n + self.fixed_prior, self.sx, self.sxx + prior
        b1, b2 = self.sy, self.sxy + prior
        det = a11 * a22 - a12 * a12
        fixed, scale = (b1 * a22 - a12 * b2) / det, (a11 * b2 - a12 * b1) / det
        if not (0.0 <= fixed <= max_fixed and 0.25 <= scale <= 8.0):
            # the best fit with one of them held at its bound: the other one given it
            fixed = min(max(fixed, 0.0), max_fixed)
            scale = min(max((b2 - a12 * fixed) / a22, 0.25), 8.0)
            fixed = min(max((b1 - a12 * scale) / a11, 0.0), max_fixed)
        return fixed, scale


#: plain steps a profiled batch size keeps (their measured / profiled ratios; the median counts)
PLAIN_WINDOW = 9
#: copies of the ratio over every batch size added to a batch size's own before the median (and
#: copies of 1, the profile as measured, to the ratio over every batch size's): one
#: slow step (the first decode after a prefill of 32 prompts took 522 ms where the next took 289)
#: moves nothing, and a batch that drafts on nearly every step keeps the plain steps it saw
PLAIN_PRIOR = 2

#: Defaults before a method has reported any timing (seconds per token, 2-core CPU, 135M model).
DEFAULT_DRAFT_COSTS = {
    "ngram": DraftCost(per_row_s=2e-5, fixed_s=5e-5),
    "suffix": DraftCost(per_row_s=5e-5, fixed_s=1e-4),
    "model": DraftCost(per_row_s=1.5e-3, fixed_s=1.9e-2),
}


class StepCosts:
    """Verify time at one batch size, the profile interpolated over batch sizes once
    (the policy evaluates hundreds of allocations of one step)."""

    def __init__(self, cost: "CostModel", batch: int) -> None:
        self.batch = batch
        self.chunks = [float(c) for c in cost.chunk_lens]
        scale = cost.plain_scale_at(batch)

        def column(table: list[list[float]], ci: int) -> float:
            return scale * _interp(cost.batch_sizes, [row[ci] for row in table], batch)

        self.uniform = [column(cost.forward_s, ci) for ci in range(len(self.chunks))]
        # one row alone never costs more than every row doing the same (a measurement's noise could
        # say so, and the policy would then add useless drafts to make a step "cheaper")
        self.one_row = None if cost.one_row_s is None or batch <= 1 else \
            [min(column(cost.one_row_s, ci), u) for ci, u in enumerate(self.uniform)]
        # half the rows: between one row and every row (noise could put it outside)
        self.half_rows = None if self.one_row is None or cost.half_rows_s is None or batch < HALF_ROWS_FROM else \
            [min(max(column(cost.half_rows_s, ci), o), u)
             for ci, (o, u) in enumerate(zip(self.one_row, self.uniform))]
        self.decode = _interp(self.chunks, self.uniform, 1.0)
        self.draft_fixed, self.extra_scale = cost.overhead_at(batch, self.decode)
        self.memo: dict[float, float] = {}  # fed -> uniform verify seconds, for callers that repeat themselves

    def verify(self, fed: float, rows: float | None = None) -> float:
        """Seconds of one forward fed ``fed`` tokens in all, ``rows`` of the rows verifying
        drafts (None: the tokens spread evenly over every row, the profile's own shape): a
        plain step, plus what the drafts add (their fixed cost and the profile's added time,
        as learnt at this batch size)."""
        plain = self.decode
        added = self._verify(fed, rows) - plain
        if fed <= self.batch + 1e-9:
            return plain + added
        drafting = 1.0 if rows is None else min(max(rows, 0.0), 1.0)  # rows < 1: drafts on a share of steps
        return plain + drafting * self.draft_fixed + self.extra_scale * added

    def _verify(self, fed: float, rows: float | None = None) -> float:
        b = self.batch
        if b <= 0:
            return 0.0
        extra = fed - b
        if rows is None or self.one_row is None:
            return _interp(self.chunks, self.uniform, fed / b)
        if extra <= 1e-9 or rows <= 1e-9:
            return self.decode
        r = min(rows, float(b))
        chunk = 1.0 + extra / r
        one = _interp(self.chunks, self.one_row, chunk)
        if r < 1.0:  # a row that drafts on a share of the steps only: the expectation
            return self.decode + r * (one - self.decode)
        every = _interp(self.chunks, self.uniform, chunk)
        half = None if self.half_rows is None else _interp(self.chunks, self.half_rows, chunk)
        return rows_between(r, float(b), one, half, every)

    def tokens_per_s(self, p: float, window: int, draft_per_token_s: float, draft_rate: float,
                     decoupled: bool) -> float:
        """Predicted speed of one request when every row of the batch drafts ``window`` tokens
        on a share ``draft_rate`` of the steps at acceptance ``p`` (see :meth:`CostModel.tokens_per_s`)."""
        q = min(max(draft_rate, 0.0), 1.0)
        fed = self.batch * (1 + q * window)
        verify = self.memo.get(fed)
        if verify is None:
            verify = self.memo[fed] = self.verify(fed)
        drafting = window * draft_per_token_s
        latency = iteration_s(verify, beside=drafting) if decoupled else iteration_s(verify, added=drafting)
        progress = 1.0 + q * (expected_progress(p, window) - 1.0)
        return progress / latency if latency > 0 else 0.0

    def best_window(self, p: float, draft_per_token_s: float, draft_rate: float, max_window: int,
                    decoupled: bool) -> tuple[int, float]:
        """The window (0 = no speculation) maximising :meth:`tokens_per_s`, and that speed."""
        best = (0, self.tokens_per_s(p, 0, draft_per_token_s, draft_rate, decoupled))
        for w in range(1, useful_window(p, max_window) + 1):
            speed = self.tokens_per_s(p, w, draft_per_token_s, draft_rate, decoupled)
            if speed > best[1] * (1 + 1e-9):
                best = (w, speed)
        return best


@dataclass
class CostModel:
    batch_sizes: list[int]
    chunk_lens: list[int]
    forward_s: list[list[float]]  # [batch index][chunk index], median seconds, every row fed the chunk
    correction: float = 1.0  # measured / profiled plain decode steps: the median over every batch size
    #: per profiled batch size, its last plain steps' measured / profiled ratios (the last of all: [-1])
    plain_ratios: list[deque[float]] = field(default_factory=list)
    #: what drafts add to a step, learnt per profiled batch size (online): the profile's shape can
    #: be off by more than its scale, and by different amounts at different batch sizes
    overheads: list[DraftOverhead] = field(default_factory=list)
    draft: dict[str, DraftCost] = field(default_factory=dict)
    #: [batch index][chunk index]: one row fed the chunk, the others one token (optional)
    one_row_s: list[list[float]] | None = None
    #: [batch index][chunk index]: half the rows (batch // 2) fed the chunk, the others one (optional)
    half_rows_s: list[list[float]] | None = None
    source: str = "packaged"  # where the profile came from (a path, or "packaged")
    #: measured / predicted plain steps run while no request drafted with a model copy, which then lends
    #: the verifier its cores (1.0: none seen); what plain decoding costs against what drafting steps do
    lent_ratio: float = 1.0
    #: methods whose drafters run on the verifier's own hardware (a model drafter on the one GPU, or
    #: beside it on a 2-core CPU): their time adds to the step's even decoupled, where the others'
    #: (the cheap drafters, on spare CPU cores) hides beside the verify step
    shared_methods: set[str] = field(default_factory=set)

    @classmethod
    def from_profile(cls, path: str | Path | None = None) -> "CostModel":
        """Load a profile written by :func:`specactor.engine.profiling.measure` (``bench/cost_profile.py``);
        the packaged one for None or ``"packaged"``."""
        if path is None or str(path) == "packaged":
            text = resources.files("specactor.policy").joinpath("default_profile.json").read_text()
            path = None
        else:
            text = Path(path).read_text()
        name = str(path) if path is not None else "packaged"
        tables = check_profile(text, name)
        model = cls(tables.batch_sizes, tables.chunk_lens, tables.forward_s)
        model.source = name
        if tables.one_row_s is not None:
            model.one_row_s = monotone(tables.one_row_s)
        if tables.half_rows_s is not None:
            model.half_rows_s = monotone(tables.half_rows_s)
        model.forward_s = monotone(model.forward_s)
        model.draft = {name: DraftCost(c.per_row_s, c.fixed_s) for name, c in DEFAULT_DRAFT_COSTS.items()}
        return model

    def adopt(self, other: "CostModel") -> None:
        """Take ``other``'s verify profile (a better one for this machine); drafting costs
        learnt so far stay, and the online correction starts afresh."""
        self.batch_sizes, self.chunk_lens, self.forward_s = other.batch_sizes, other.chunk_lens, other.forward_s
        self.one_row_s, self.half_rows_s = other.one_row_s, other.half_rows_s
        self.source, self.correction = other.source, 1.0
        self.overheads, self.plain_ratios = [], []

    # ------------------------------------------------------------------ verify

    def verify_s(self, batch: int, chunk: float) -> float:
        """Predicted seconds of one forward: ``batch`` requests, ``chunk`` new tokens each."""
        if batch <= 0:
            return 0.0
        return self.at_batch(batch).verify(batch * chunk)

    def at_batch(self, batch: int) -> StepCosts:
        return StepCosts(self, batch)

    def _neighbours(self, batch: int) -> list[tuple[int, float]]:
        """The profiled batch sizes around ``batch`` with their weights (linear in log batch)."""
        sizes = self.batch_sizes
        if len(self.overheads) != len(sizes):
            self.overheads = [DraftOverhead() for _ in sizes]
        if len(self.plain_ratios) != len(sizes) + 1:
            self.plain_ratios = [deque(maxlen=PLAIN_WINDOW) for _ in sizes] + [deque(maxlen=2 * PLAIN_WINDOW)]
        if batch <= sizes[0]:
            return [(0, 1.0)]
        if batch >= sizes[-1]:
            return [(len(sizes) - 1, 1.0)]
        i = bisect.bisect_right(sizes, batch) - 1
        if sizes[i] == batch:
            return [(i, 1.0)]
        t = math.log(batch / sizes[i]) / math.log(sizes[i + 1] / sizes[i])
        return [(i, 1.0 - t), (i + 1, t)]

    def plain_scale_at(self, batch: int) -> float:
        """Measured / profiled time of a plain step at ``batch``: its neighbours' own ratios, each
        each the median of its last plain steps and ``PLAIN_PRIOR`` copies of the ratio over all."""
        scale = 0.0
        for i, w in self._neighbours(batch):
            scale += w * statistics.median([*self.plain_ratios[i], *[self.correction] * PLAIN_PRIOR])
        return scale

    def overhead_at(self, batch: int, decode_s: float) -> tuple[float, float]:
        """(fixed seconds, scale) of what drafts add to a step at ``batch`` (see :class:`DraftOverhead`)."""
        fixed = scale = 0.0
        for i, w in self._neighbours(batch):
            f, s = self.overheads[i].fit(decode_s)
            fixed, scale = fixed + w * f, scale + w * s
        return fixed, scale

    def verify_rows_s(self, batch: int, fed: float, rows: float | None = None) -> float:
        """Predicted seconds of one forward over ``batch`` rows fed ``fed`` tokens in all, of which
        ``rows`` rows verify drafts (None: every row fed ``fed / batch``, as the profile was measured)."""
        return self.at_batch(batch).verify(fed, rows)

    def observe_step(self, batch: int, tokens: int, seconds: float, weight: float = 0.1,
                     rows: int | None = None) -> None:
        """Refresh the correction from one measured step (``tokens`` fed in all, ``rows`` rows with drafts)."""
        if batch <= 0 or seconds <= 0:
            return
        steps = self.at_batch(batch)
        if tokens <= batch or rows == 0:  # a plain step: the profile's scale, here and overall
            profiled = steps.decode / self.plain_scale_at(batch)
            if profiled > 0:
                ratio = seconds / profiled
                nearest = max(self._neighbours(batch), key=lambda iw: iw[1])[0]
                self.plain_ratios[nearest].append(ratio)
                self.plain_ratios[-1].append(ratio)
                self.correction = statistics.median([*self.plain_ratios[-1], *[1.0] * PLAIN_PRIOR])
            return
        profiled = steps._verify(tokens, rows) - steps.decode  # what the profile says the drafts add
        for i, w in self._neighbours(batch):
            self.overheads[i].observe(max(profiled, 0.0), seconds - steps.decode, w)

    def observe_lent_step(self, batch: int, seconds: float, weight: float = 0.1) -> None:
        """A plain step run on lent cores (VerifyActor.lend_threads): learn what plain decoding
        costs then, against the profile (on 2 cores split 1+1: 19 ms where one core takes 24)."""
        predicted = self.at_batch(batch).decode if batch > 0 else 0.0
        if predicted > 0 and seconds > 0:
            ratio = min(max(seconds / predicted, 0.2), 2.0)
            self.lent_ratio += weight * (ratio - self.lent_ratio)

    # ------------------------------------------------------------------ draft

    def draft_s(self, method: str, batch: int) -> float:
        cost = self.draft.get(method)
        return cost.seconds(batch) if cost is not None else 0.0

    def observe_draft(self, method: str, batch: int, tokens_per_row: float, seconds: float) -> None:
        self.draft.setdefault(method, DraftCost()).observe(batch, tokens_per_row, seconds)

    def adopt_draft_table(self, method: str, table: dict[int, float], prefill_s: float = 0.0) -> bool:
        """Price ``method`` by its measured table from now on (and ``prefill_s`` per context token a
        first proposal feeds); False if it already was."""
        cost = self.draft.setdefault(method, DraftCost())
        cost.prefill_s = max(0.0, prefill_s)
        if cost.table == dict(sorted(table.items())):
            return False
        cost.adopt_table(table)
        return True

    def first_draft_s(self, method: str, context: int) -> float:
        """How long ``method``'s first proposal for a request of ``context`` tokens takes to feed it."""
        cost = self.draft.get(method)
        return cost.prefill_s * context if cost is not None else 0.0

    def feeds_context(self, method: str) -> bool:
        """Whether ``method``'s drafter feeds a request's context before its first draft (a model
        copy that measured its feeding rate): its explorations and draft rate are treated apart."""
        return self.first_draft_s(method, 1) > 0

    # ------------------------------------------------------------------ choices

    def step_s(self, batch: int, fed: float, drafting: dict[str, tuple[int, int]], decoupled: bool,
               rows: float | None = None) -> float:
        """One iteration: verify ``fed`` tokens over ``batch`` rows (``rows`` of them verifying
        drafts; None: spread evenly) while each method drafts ``w`` tokens for its ``n``
        requests (``drafting[m] = (n, w)``); a method of ``shared_methods`` adds its time to the
        verify step's even decoupled."""
        verify = self.verify_rows_s(batch, fed, rows) if batch else 0.0
        times = {m: w * self.draft_s(m, n) for m, (n, w) in drafting.items() if n}
        if not decoupled:
            return iteration_s(verify, added=max(times.values(), default=0.0))
        beside = max((t for m, t in times.items() if m not in self.shared_methods), default=0.0)
        return iteration_s(verify, beside, sum(t for m, t in times.items() if m in self.shared_methods))

    def tokens_per_s(self, p: float, window: int, method: str, batch: int, decoupled: bool,
                     draft_rate: float = 1.0) -> float:
        """Predicted generation speed of one request in a batch of ``batch``.

        ``draft_rate`` is the share of steps on which the method has a draft at all
        (prompt lookup and suffix matching propose only where they find a match): the
        other steps cost and gain what plain decoding does.
        """
        return self.at_batch(batch).tokens_per_s(p, window, self.draft_s(method, batch), draft_rate,
                                                 decoupled and method not in self.shared_methods)

    def best_window(self, p: float, method: str, batch: int, decoupled: bool,
                    max_window: int = 8, draft_rate: float = 1.0) -> tuple[int, float]:
        """The window (0 = no speculation) maximising predicted tokens/s, and that speed."""
        return self.at_batch(batch).best_window(p, self.draft_s(method, batch), draft_rate, max_window,
                                                decoupled and method not in self.shared_methods)
