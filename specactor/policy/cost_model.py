"""The cost model of SpecActor (arXiv 2511.16193, decoupled speculation): what a verify step and a draft token cost, and
how many tokens per second a choice of method, window and mode buys.

Verify time ``V(b, c)`` (batch b, c new tokens per request) is interpolated in
the engine's profile (``bench/cost_profile.py`` writes it; one for the default
model on a 2-core CPU ships with the package) and corrected online by an
exponentially weighted ratio of measured to predicted step times, so a
different machine converges to its own figures after a few steps. Drafting
time per token ``D(b) = b*D' + alpha`` is learnt per method from the drafters'
own timings.

With per-token acceptance p and window w, accepted tokens follow a truncated
geometric law and a verify step makes ``E = (1 - p**(w+1)) / (1 - p)`` tokens
of progress (the verifier's own token included). Coupled iterations take
``w*D + V``, decoupled ones ``max(w*D, V)``. A method that drafts on a share q of
the steps only (no match, no draft) makes ``1 + q*(E - 1)`` tokens of progress
for ``1 + q*w`` tokens verified.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


def expected_progress(p: float, window: int) -> float:
    """Expected tokens committed per verify step: E[min(Geom, w)] + 1."""
    p = min(max(p, 0.0), 1.0)
    if window <= 0:
        return 1.0
    if p >= 1.0:
        return float(window + 1)
    return (1.0 - p ** (window + 1)) / (1.0 - p)


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


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation, extrapolated linearly beyond the ends."""
    if len(xs) == 1:
        return ys[0] * x / xs[0] if xs[0] else ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


@dataclass
class DraftCost:
    """Running estimate of one method's drafting time: per token, ``b*per_row + fixed``."""

    per_row_s: float = 0.0
    fixed_s: float = 0.0
    samples: int = 0

    def seconds(self, batch: int) -> float:
        return batch * self.per_row_s + self.fixed_s

    def observe(self, batch: int, tokens_per_row: float, seconds: float, weight: float = 0.2) -> None:
        """One drafting call for ``batch`` requests that produced ``tokens_per_row`` each."""
        if tokens_per_row <= 0 or batch <= 0:
            return
        per_token = seconds / tokens_per_row
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


#: Defaults before a method has reported any timing (seconds per token, 2-core CPU, 135M model).
DEFAULT_DRAFT_COSTS = {
    "ngram": DraftCost(per_row_s=2e-5, fixed_s=5e-5),
    "suffix": DraftCost(per_row_s=5e-5, fixed_s=1e-4),
    "model": DraftCost(per_row_s=1.5e-3, fixed_s=1.9e-2),
}


@dataclass
class CostModel:
    batch_sizes: list[int]
    chunk_lens: list[int]
    forward_s: list[list[float]]  # [batch index][chunk index], median seconds
    correction: float = 1.0
    draft: dict[str, DraftCost] = field(default_factory=dict)

    @classmethod
    def from_profile(cls, path: str | Path | None = None) -> "CostModel":
        """Load a profile written by ``bench/cost_profile.py`` (the packaged one by default)."""
        if path is None:
            text = resources.files("specactor.policy").joinpath("default_profile.json").read_text()
        else:
            text = Path(path).read_text()
        data = json.loads(text)
        try:
            model = cls(list(data["batch_sizes"]), list(data["chunk_lens"]),
                        [list(map(float, row)) for row in data["forward_s"]])
        except KeyError as exc:
            raise ValueError(f"cost profile {path or 'default'} lacks the field {exc}") from None
        if len(model.forward_s) != len(model.batch_sizes) or any(
                len(row) != len(model.chunk_lens) for row in model.forward_s):
            raise ValueError(f"cost profile {path or 'default'}: forward_s is not batch_sizes x chunk_lens")
        model.draft = {name: DraftCost(c.per_row_s, c.fixed_s) for name, c in DEFAULT_DRAFT_COSTS.items()}
        return model

    # ------------------------------------------------------------------ verify

    def verify_s(self, batch: int, chunk: float) -> float:
        """Predicted seconds of one forward: ``batch`` requests, ``chunk`` new tokens each."""
        if batch <= 0:
            return 0.0
        per_batch = [_interp(self.chunk_lens, row, chunk) for row in self.forward_s]
        return self.correction * _interp(self.batch_sizes, per_batch, batch)

    def observe_step(self, batch: int, tokens: int, seconds: float, weight: float = 0.1) -> None:
        """Refresh the correction from one measured step (``tokens`` fed in all)."""
        if batch <= 0 or seconds <= 0:
            return
        predicted = self.verify_s(batch, tokens / batch) / self.correction
        if predicted > 0:
            self.correction += weight * (seconds / predicted - self.correction)

    # ------------------------------------------------------------------ draft

    def draft_s(self, method: str, batch: int) -> float:
        cost = self.draft.get(method)
        return cost.seconds(batch) if cost is not None else 0.0

    def observe_draft(self, method: str, batch: int, tokens_per_row: float, seconds: float) -> None:
        self.draft.setdefault(method, DraftCost()).observe(batch, tokens_per_row, seconds)

    # ------------------------------------------------------------------ choices

    def step_s(self, batch: int, fed: int, drafting: dict[str, tuple[int, int]], decoupled: bool) -> float:
        """One iteration: verify ``fed`` tokens over ``batch`` rows while each method
        drafts ``w`` tokens for its ``n`` requests (``drafting[m] = (n, w)``)."""
        verify = self.verify_s(batch, fed / batch) if batch else 0.0
        draft = max((w * self.draft_s(m, n) for m, (n, w) in drafting.items() if n), default=0.0)
        return max(verify, draft) if decoupled else verify + draft

    def tokens_per_s(self, p: float, window: int, method: str, batch: int, decoupled: bool,
                     draft_rate: float = 1.0) -> float:
        """Predicted generation speed of one request in a batch of ``batch``.

        ``draft_rate`` is the share of steps on which the method has a draft at all
        (prompt lookup and suffix matching propose only where they find a match): the
        other steps cost and gain what plain decoding does.
        """
        q = min(max(draft_rate, 0.0), 1.0)
        verify = self.verify_s(batch, 1 + q * window)
        drafting = window * self.draft_s(method, batch)
        latency = max(drafting, verify) if decoupled else drafting + verify
        progress = 1.0 + q * (expected_progress(p, window) - 1.0)
        return progress / latency if latency > 0 else 0.0

    def best_window(self, p: float, method: str, batch: int, decoupled: bool,
                    max_window: int = 8, draft_rate: float = 1.0) -> tuple[int, float]:
        """The window (0 = no speculation) maximising predicted tokens/s, and that speed."""
        best = (0, self.tokens_per_s(p, 0, method, batch, decoupled))
        for w in range(1, max_window + 1):
            speed = self.tokens_per_s(p, w, method, batch, decoupled, draft_rate)
            if speed > best[1] * (1 + 1e-9):
                best = (w, speed)
        return best
