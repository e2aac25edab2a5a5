"""Ceilings for the bench's speedups, computed from the same run's data.

A speedup alone does not say how much is left to gain. Beside each one the bench
shows what three idealised drafters would have made of the same samples, in a
deterministic simulation on the policy's cost model:

- **oracle**: per request and per batch size, the single best drafting
  configuration (method, window 0..the run's window; window 0 = no speculation) given the
  acceptance that request actually saw, paying the cost model's drafting time;
- **zero-cost**: the same with drafting free (best method per request, at the
  measured acceptance);
- **perfect**: a free drafter whose every token is accepted (p = 1), with the
  best window for each batch size.

Calibration: autoregressive decoding is simulated on the run's real sample lengths
(all samples start together; the batch shrinks as they finish); ``scale`` =
measured autoregressive makespan / simulated one, and every simulated time is
multiplied by it. Speedups are ratios inside the simulation (simulated
autoregressive over simulated bound), so the scale cancels in them.

The simulation is a fluid one: a request gains its *expected* progress per step
(``1 + q * (E(p, w) - 1)``, with E the truncated-geometric mean and q the share of
steps on which the method had a draft) instead of a random draw, so it needs no
seed and the ordering of the bounds is exact. A stronger drafter can always
imitate a weaker one (the oracle can decline to speculate; a free drafter can make
the oracle's choices at no cost; a perfect drafter can propose the free drafter's
tokens), so each bound is the best of its own greedy plan and the weaker bound's:
``perfect >= zero-cost >= oracle >= 1`` holds by construction, and ``plan`` says
which plan won.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from specactor.bench.measure import phase_split
from specactor.policy.cost_model import CostModel, DraftCost, expected_progress

MAX_WINDOW = 8
PERFECT = "perfect"  # the method name of the perfect drafter
HYPOTHETICAL = "hypothetical"  # the method name of uniform_drafter's


@dataclass(frozen=True)
class Acceptance:
    """What one method showed on one request: per-token acceptance ``p`` and the share
    ``rate`` of verify steps on which it had a draft at all (n-gram and suffix matching
    propose only where they find a match)."""

    p: float
    rate: float = 1.0


@dataclass(frozen=True)
class Config:
    """One request's drafting choice for one step (window 0: no speculation)."""

    method: str = ""
    window: int = 0
    p: float = 0.0
    rate: float = 1.0

    @property
    def progress(self) -> float:
        """Expected tokens committed per verify step."""
        return 1.0 + self.rate * (expected_progress(self.p, self.window) - 1.0) if self.window else 1.0

    @property
    def fed(self) -> float:
        """Expected tokens this request feeds the verifier per step."""
        return 1.0 + self.rate * self.window


NO_DRAFT = Config()
Plan = Callable[[int, int], Config]  # (request index, batch size) -> choice


@dataclass
class SimRun:
    makespan_s: float
    finish_s: list[float]
    plan: Plan
    label: str

    @property
    def phases(self) -> tuple[float, float]:
        return phase_split(self.finish_s, self.makespan_s)


# ---------------------------------------------------------------------------- acceptance


def accepted_per_draft(p: float, window: float) -> float:
    """Mean accepted tokens of a ``window``-token draft at per-token acceptance ``p``
    (truncated geometric): ``p (1 - p^w) / (1 - p)``. ``window`` may be a mean, so fractional."""
    if window <= 0 or p <= 0:
        return 0.0
    if p >= 1:
        return float(window)
    return p * (1.0 - p ** window) / (1.0 - p)


def acceptance_from_counts(drafted: int, accepted: int, steps: int, iterations: int = 100) -> float:
    """The per-token acceptance that explains ``accepted`` tokens over ``steps`` drafts of
    ``drafted`` tokens in all: inverts :func:`accepted_per_draft` at the mean window by
    bisection (it increases with p from 0 to the window)."""
    if steps <= 0 or drafted <= 0:
        return 0.0
    window = drafted / steps
    mean = accepted / steps
    if mean <= 0:
        return 0.0
    if mean >= window:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if accepted_per_draft(mid, window) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def pool_acceptance(samples: Iterable[Mapping[str, Any]]) -> dict[str, Acceptance]:
    """One request's acceptance per method, pooled over several runs of the same sample
    (lossless modes commit the same tokens, so each run is more evidence about it).

    Each sample is ``{"verify_steps": n, "per_method": {method: {"drafted", "accepted",
    "steps"}}}``. Counts are summed; ``rate`` is the highest share of a run's verify steps
    on which the method drafted (a policy that used the method less says nothing about
    how often it could have drafted)."""
    totals: dict[str, list[int]] = {}
    rates: dict[str, float] = {}
    for sample in samples:
        verify_steps = int(sample.get("verify_steps") or 0)
        for method, counts in (sample.get("per_method") or {}).items():
            steps = int(counts.get("steps", 0))
            if steps <= 0:
                continue
            total = totals.setdefault(method, [0, 0, 0])
            total[0] += int(counts.get("drafted", 0))
            total[1] += int(counts.get("accepted", 0))
            total[2] += steps
            rate = min(steps / verify_steps, 1.0) if verify_steps > 0 else 1.0
            rates[method] = max(rates.get(method, 0.0), rate)
    return {m: Acceptance(acceptance_from_counts(*t), rates[m]) for m, t in sorted(totals.items())}


# ---------------------------------------------------------------------------- simulation


def step_s(cost: CostModel, batch: int, configs: Iterable[Config], decoupled: bool, free: bool) -> float:
    """One verify iteration for these choices, on the cost model (``free``: drafting costs nothing).
    A row that drafts on a share q of the steps counts as q drafting rows (the expectation)."""
    fed, rows, drafting = 0.0, 0.0, {}
    for c in configs:
        fed += c.fed
        if c.window:
            rows += c.rate
            if not free:
                n, w = drafting.get(c.method, (0, 0))
                drafting[c.method] = (n + 1, max(w, c.window))
    return cost.step_s(batch, fed, drafting, decoupled, rows=rows)


def simulate(lengths: list[int], plan: Plan, cost: CostModel, decoupled: bool = True, free: bool = False,
             label: str = "") -> SimRun:
    """Every request starts at once; each step every running request makes its planned
    choice for the current batch size and gains its expected progress. Choices only
    change when the batch does, so the loop jumps from one finish to the next."""
    remaining = {i: float(n) for i, n in enumerate(lengths) if n > 0}
    finish = [0.0] * len(lengths)
    clock = 0.0
    while remaining:
        batch = len(remaining)
        configs = {i: plan(i, batch) for i in remaining}
        step = step_s(cost, batch, configs.values(), decoupled, free)
        steps = {i: max(1, math.ceil(remaining[i] / configs[i].progress - 1e-9)) for i in remaining}
        k = min(steps.values())
        # the stretch's last step: a request that finishes in it drafts no further than its end (the
        # engine caps a draft at what a request may still generate, Engine.max_draft)
        shrunk = {}
        for i in remaining:
            if steps[i] == k:
                left = remaining[i] - (k - 1) * configs[i].progress
                window = min(configs[i].window, max(0, math.ceil(left - 1e-9) - 1))
                if window < configs[i].window:
                    shrunk[i] = replace(configs[i], window=window)
        last = step_s(cost, batch, [shrunk.get(i, c) for i, c in configs.items()], decoupled, free) if shrunk else step
        clock += (k - 1) * step + last
        for i in list(remaining):
            if steps[i] == k:
                del remaining[i]
                finish[i] = clock
            else:
                remaining[i] -= k * configs[i].progress
    return SimRun(clock, finish, plan, label)


def speed(cost: CostModel, config: Config, batch: int, decoupled: bool, free: bool) -> float:
    """Tokens/s of one request if the whole batch made the same choice (the cost model's view)."""
    seconds = step_s(cost, batch, [config] * batch, decoupled, free)
    return config.progress / seconds if seconds > 0 else 0.0


def best_config(methods: Mapping[str, Acceptance], batch: int, cost: CostModel, decoupled: bool = True,
                free: bool = False, max_window: int = MAX_WINDOW) -> Config:
    """The choice maximising this request's tokens/s at this batch size. Speculation must
    win strictly, and a method that gains nothing (p or rate 0) is never picked: a profile
    whose bigger chunks happen to be measured faster must not make drafting look useful."""
    best, fastest = NO_DRAFT, speed(cost, NO_DRAFT, batch, decoupled, free)
    for method, acc in sorted(methods.items()):
        if acc.p <= 0 or acc.rate <= 0:
            continue
        for window in range(1, max_window + 1):
            config = Config(method, window, acc.p, acc.rate)
            s = speed(cost, config, batch, decoupled, free)
            if s > fastest * (1 + 1e-9):
                best, fastest = config, s
    return best


def greedy_plan(requests: list[Mapping[str, Acceptance]], cost: CostModel, decoupled: bool = True,
                free: bool = False, max_window: int = MAX_WINDOW) -> Plan:
    """Each request's best choice per batch size, computed once per (request, batch size)."""
    cache: dict[tuple[int, int], Config] = {}

    def plan(i: int, batch: int) -> Config:
        if (i, batch) not in cache:
            cache[(i, batch)] = best_config(requests[i], batch, cost, decoupled, free, max_window)
        return cache[(i, batch)]

    return plan


def _best(runs: list[SimRun]) -> SimRun:
    """The shortest makespan; on a tie the later candidate (the bound's own plan) wins."""
    best = runs[0]
    for run in runs[1:]:
        if run.makespan_s <= best.makespan_s * (1 + 1e-12):
            best = run
    return best


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _figures(run: SimRun, ar: SimRun, scale: float) -> dict[str, Any]:
    p1, p2 = run.phases
    a1, a2 = ar.phases
    return {"makespan_s": run.makespan_s * scale, "phase1_s": p1 * scale, "phase2_s": p2 * scale,
            "speedup": _ratio(ar.makespan_s, run.makespan_s), "phase1_speedup": _ratio(a1, p1),
            "phase2_speedup": _ratio(a2, p2), "plan": run.label}


def ceilings(lengths: list[int], acceptance: list[Mapping[str, Acceptance]], cost: CostModel,
             measured_autoregressive_s: float, decoupled: bool = True,
             max_window: int = MAX_WINDOW) -> dict[str, Any]:
    """Oracle, zero-cost and perfect-drafter makespans (calibrated) and speedups for one
    epoch: ``lengths`` and ``acceptance`` per request, in the same order."""
    if len(lengths) != len(acceptance):
        raise ValueError(f"{len(lengths)} lengths but {len(acceptance)} acceptance entries")
    ar = simulate(lengths, lambda i, b: NO_DRAFT, cost, decoupled, label="autoregressive")
    scale = measured_autoregressive_s / ar.makespan_s if ar.makespan_s > 0 and measured_autoregressive_s > 0 \
        else 1.0
    own = simulate(lengths, greedy_plan(acceptance, cost, decoupled, False, max_window), cost, decoupled,
                   label="oracle")
    oracle = _best([ar, own])
    imitated = simulate(lengths, oracle.plan, cost, decoupled, free=True, label=oracle.label)
    free = simulate(lengths, greedy_plan(acceptance, cost, decoupled, True, max_window), cost, decoupled,
                    free=True, label="zero-cost")
    zero = _best([oracle, imitated, free])
    perfect_acc = [{PERFECT: Acceptance(1.0, 1.0)}] * len(lengths)
    perfect = _best([zero, simulate(lengths, greedy_plan(perfect_acc, cost, decoupled, True, max_window), cost,
                                    decoupled, free=True, label="perfect")])
    return {"scale": scale, "simulated_autoregressive_s": ar.makespan_s,
            "autoregressive": _figures(ar, ar, scale), "oracle": _figures(oracle, ar, scale),
            "zero_cost": _figures(zero, ar, scale), "perfect": _figures(perfect, ar, scale)}


def uniform_drafter(lengths: list[int], cost: CostModel, p: float, draft: DraftCost | None = None,
                    max_window: int = MAX_WINDOW) -> tuple[float, float]:
    """(makespan, tail) speedups of the oracle over autoregressive for a hypothetical drafter
    that accepts ``p`` a token on every sample and step, and whose drafting of one token for
    n rows costs ``draft.seconds(n)`` (None: free), added to the verify step (on shared cores a
    drafter's compute is not hidden): what a drafter would have to be for a target, on a run's
    own lengths and cost profile."""
    drafter = replace(cost, draft={HYPOTHETICAL: draft or DraftCost()})
    ar = simulate(lengths, lambda i, b: NO_DRAFT, drafter, decoupled=False)
    plan = greedy_plan([{HYPOTHETICAL: Acceptance(p, 1.0)}] * len(lengths), drafter, decoupled=False,
                       max_window=max_window)
    run = _best([ar, simulate(lengths, plan, drafter, decoupled=False)])
    (_, ar_tail), (_, tail) = ar.phases, run.phases
    return ar.makespan_s / run.makespan_s, (ar_tail / tail if tail > 0 else 1.0)


def from_samples(runs: Mapping[str, Mapping[str, Mapping[str, Any]]], cost: CostModel,
                 measured_autoregressive_s: float, baseline: str = "autoregressive",
                 max_window: int = MAX_WINDOW) -> dict[str, Any]:
    """Ceilings for one epoch from the per-sample records of every mode that ran it
    (``runs[mode][sample id] = {"tokens", "verify_steps", "per_method"}``): lengths from
    the baseline, acceptance pooled over every mode that drafted on the sample."""
    samples = runs[baseline]
    ids = list(samples)
    lengths = [int(samples[s]["tokens"]) for s in ids]
    acceptance = [pool_acceptance(run[s] for run in runs.values() if s in run) for s in ids]
    out = ceilings(lengths, acceptance, cost, measured_autoregressive_s, max_window=max_window)
    out["max_window"] = max_window
    methods = sorted({m for acc in acceptance for m in acc})
    out["acceptance_from"] = sorted(mode for mode, run in runs.items()
                                    if any(v.get("per_method") for v in run.values()))
    out["methods"] = {m: {"mean_p": sum(a[m].p for a in acceptance if m in a) / sum(m in a for a in acceptance),
                          "mean_rate": sum(a[m].rate for a in acceptance if m in a)
                          / sum(m in a for a in acceptance),
                          "requests": sum(m in a for a in acceptance)} for m in methods}
    return out
