"""A rollout batch's clock: it is done when its last sample is, not when it has made enough tokens.

The allocation (:meth:`specactor.policy.bandit.FastestOfN._allocate`) maximises the batch's tokens
per second, which values a token of every request alike. A closed batch of RL samples is done when
its last sample is, and a token bought for a sample that finishes early anyway saves only that row's
share of the steps it no longer sits in: next to nothing where a step costs the same at any batch
(a GPU; this CPU at batch 1-8). Replayed on an H200's 32B-shaped cost profile, the policy drafted
every one of 32 T=1 requests for the first ~140 steps (35% acceptance paid for the step's extra cost
in tokens per second) and ran 0.96x of plain decoding: the tokens went to samples that end by EOS,
while the five that ran to the 768-token limit (rambling text, drafts rarely right) gained 14 steps
(bench/RESULTS.md, "Policy and ceilings").

:func:`finish_s` prices a plan by the time the batch needs to finish on the assumption that every
request runs to its token limit at the progress the plan gives it: the batch shrinks as the rows that
make faster progress reach their limits, and each stretch costs a step of the rows still there. Under
that assumption drafting shortens the rollout only if it speeds up *every* request that may be last,
and on a step whose cost hardly depends on the batch only if it speeds up the slowest. It is the right
assumption for sampled requests, where any sample can ramble on to the limit and the rollout's tail is
made of those that do (5-9 of 32 in this project's T=1 rollouts, 4 of 5 of them drafted badly); greedy
samples that run long repeat themselves, which drafts predict exactly, so their batches keep the
tokens-per-second objective (:attr:`specactor.policy.bandit.FastestOfN.closed_batch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from specactor.policy.cost_model import CostModel, expected_progress


@dataclass(frozen=True)
class Row:
    """One request under a plan."""

    left: int  # tokens it may still generate (its limit less its output so far; at least 1)
    progress: float = 1.0  # expected tokens a step commits for it
    fed: float = 1.0  # tokens a step feeds it: 1 plus its expected draft tokens
    drafting: float = 0.0  # the share of steps on which it verifies a draft (its draft rate; 0: off)


def finish_s(cost: CostModel, rows: list[Row], stretches: int = 32) -> float:
    """Seconds until every row has reached its limit, each at its own progress per step: row i takes
    ``left / progress`` steps, and until the next row is done every step costs what one over the rows
    still there costs (their fed tokens, their drafting rows). A batch size's step costs are
    interpolated in the profile (90% of this function's time), so at most ``2 * stretches`` are: the
    last ``stretches`` rows to finish, whose steps run at small batch and are most of the time, are
    priced one by one; before them, one batch in every ``n / stretches``, the steps between
    interpolated linearly (at 256 rows on a 7B GPU profile: 4 ms a call -> 1 ms)."""
    order = sorted(rows, key=lambda r: r.left / r.progress)
    n = len(order)
    fed, drafting = [0.0] * (n + 1), [0.0] * (n + 1)  # of the rows still there once k are done
    for k in range(n - 1, -1, -1):
        fed[k], drafting[k] = fed[k + 1] + order[k].fed, drafting[k + 1] + order[k].drafting
    head = max(0, n - stretches)  # while fewer than this many are done, steps are interpolated
    every = max(1, math.ceil(head / max(1, stretches)))
    priced = sorted({*range(0, head, every), *range(head, n)})
    step_at = {k: cost.verify_rows_s(n - k, fed[k], drafting[k]) for k in priced}
    total = done = 0.0
    lower = 0  # index in priced of the last priced k at or below the current one
    for k, row in enumerate(order):
        while lower + 1 < len(priced) and priced[lower + 1] <= k:
            lower += 1
        low = priced[lower]
        if low == k or lower + 1 == len(priced):
            step_s = step_at[low]
        else:
            high = priced[lower + 1]
            step_s = step_at[low] + (step_at[high] - step_at[low]) * (k - low) / (high - low)
        steps = row.left / row.progress
        if steps > done:
            total += (steps - done) * step_s
            done = steps
    return total


class ClosedBatch:
    """One plan round's requests, request i ``lefts[i]`` tokens from its limit and drafting on a share
    ``rates[i]`` of its steps: whether a plan brings their end nearer than plain decoding by
    ``min_gain``. Plain decoding's end is priced once, however many plans are asked about."""

    def __init__(self, cost: CostModel, lefts: list[int], rates: list[float], min_gain: float) -> None:
        self.cost, self.lefts, self.rates, self.min_gain = cost, lefts, rates, min_gain

    @cached_property
    def plain_s(self) -> float:
        """Plain decoding's end (on the cores a model copy lends the verifier while it is off)."""
        return finish_s(self.cost, [Row(left) for left in self.lefts]) * self.cost.lent_ratio

    def sooner(self, windows: list[int], acceptance: list[float]) -> bool:
        """Whether request i drafting ``windows[i]`` tokens at ``acceptance[i]`` ends the batch sooner."""
        rows = [Row(left, 1.0 + q * (expected_progress(p, w) - 1.0), 1.0 + q * w, q) if w else Row(left)
                for left, q, w, p in zip(self.lefts, self.rates, windows, acceptance)]
        return finish_s(self.cost, rows) * (1.0 + self.min_gain) <= self.plain_s
