"""Named policies run on a replayed rollout: what speculation would make of a workload, and its ceilings.

Shared by ``specactor replay`` (a user's own rollouts), ``bench/replay_policy.py`` (policy
settings side by side) and ``specactor bench`` (the replayed line under each table). The
workload and what a replay leaves out: :mod:`specactor.bench.replay_workload`.

Policies:

- ``plain``: no speculation (autoregressive decoding);
- ``geometric`` / ``markov``: Fastest-of-N, as the engine runs it, with that acceptance model;
- ``fixed:METHOD:WINDOW``: every request drafts with one method and window on every step;
- ``clairvoyant``: each step, every token the methods' drafts have right and no wrong one (the
  ceiling of a policy over these drafters);
- ``perfect``: a drafter right on every token, drafting the full window (the drafters' ceiling).

The two ceilings run at the best of a few fixed windows (:func:`ceiling_windows`) and of no
drafting at all: a policy may always decline to draft, so no ceiling of one is below plain.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, replace
from typing import Any

from specactor.bench.measure import phase_split
from specactor.bench.replay_workload import ReplayRequest, replay_requests
from specactor.speculation import DEFAULT_WINDOW
from specactor.policy.bandit import FastestOfN
from specactor.policy.bandit_state import ACCEPTANCE_MODELS, DORMANT_SLOWDOWN
from specactor.policy.cost_model import CostModel
from specactor.policy.simulation import FixedPolicy, PlainPolicy, Simulator

Sample = tuple[str, list[int], list[int]]  # (request id, prompt ids, output ids)
PLAIN_NAMES = ("plain", "clairvoyant", "perfect")


@dataclass
class ReplaySettings:
    """What a replay runs on: the step times (``cost``, the truth; a policy gets a copy, corrected
    online as live), the drafting methods and their settings, and the policy's settings."""

    cost: CostModel
    methods: list[str] = field(default_factory=lambda: ["ngram", "suffix"])
    window: int = DEFAULT_WINDOW
    plan_every: int = 4  # live: the policy actor plans every 4 verify steps
    lag: int = 2  # live: a plan reaches the drafts about 2 steps later
    options: dict[str, Any] = field(default_factory=dict)  # FastestOfN settings
    drafter_options: dict[str, dict] = field(default_factory=dict)
    seeds: int = 1  # policy seeds (Thompson draws, explorations) per Fastest-of-N run
    reported: float = 1.0  # the share of a step's time the policy is told (see Simulator)
    dormant: int = DORMANT_SLOWDOWN  # live: plans that much less often while every request is off
    limit: int | None = None  # the rollout's max_tokens, which the policy is told (None: not known)
    greedy: bool = False  # the rollout decoded at temperature 0, which the policy is told


class _Perfect(ReplayRequest):
    """Every draft right to its end."""

    def draft(self, method: str, committed: int, window: int, rng: random.Random) -> tuple[int, int]:
        return window, window


def make_policy(name: str, settings: ReplaySettings, seed: int = 0):
    """The policy ``name`` stands for (module docstring); ValueError naming the choices otherwise."""
    methods, window = settings.methods, settings.window
    if name in PLAIN_NAMES:
        return PlainPolicy() if name == "plain" else FixedPolicy(methods[0], window)
    if name in ACCEPTANCE_MODELS:
        return FastestOfN(list(methods), copy.deepcopy(settings.cost), max_window=window, acceptance=name,
                          seed=seed, **settings.options)
    parts = name.split(":")
    if len(parts) == 3 and parts[0] == "fixed" and parts[1] in methods and parts[2].isdigit() and int(parts[2]) > 0:
        return FixedPolicy(parts[1], int(parts[2]))
    raise ValueError(f"unknown policy {name!r}: {', '.join(PLAIN_NAMES)}, {', '.join(ACCEPTANCE_MODELS)} or "
                     f"fixed:METHOD:WINDOW with METHOD one of {', '.join(methods)}")


def run(samples: list[Sample], name: str, settings: ReplaySettings, history: list[tuple[list[int], list[int]]] = (),
        seed: int = 0) -> dict[str, float]:
    """One replay of policy ``name`` on ``samples``: makespan, its phases (until half the samples
    finished, and the tail) and verify steps, in the cost model's seconds."""
    if name == "perfect":  # its drafts need no drafter
        requests = [_Perfect(rid, [], output, {}) for rid, _, output in samples if output]
    else:
        requests = replay_requests(samples, settings.methods, history, name == "clairvoyant",
                                   settings.drafter_options, settings.limit, settings.greedy)
    result = Simulator(settings.cost, plan_every=settings.plan_every, lag=settings.lag,
                       reported=settings.reported, dormant=settings.dormant).run(
        requests, make_policy(name, settings, seed))
    one, two = phase_split(list(result.finish_s.values()), result.makespan_s)
    return {"makespan_s": result.makespan_s, "phase1_s": one, "phase2_s": two, "steps": result.steps,
            "tokens": result.tokens}


#: the ceilings whose drafts are known right: each runs at the best of a few fixed windows
CEILINGS = ("clairvoyant", "perfect")


def ceiling_windows(window: int) -> list[int]:
    """The fixed windows a ceiling tries, up to ``window``: where a step is short beside drafting
    (a GPU), a drafter drafting 16 tokens a row bounds the step, and a ceiling at window 16 is none
    (clairvoyant drafts replayed on an H100-shaped profile: 0.44x at window 16, 1.06x at 2)."""
    return sorted({w for w in (1, 2, 4, 8, window) if 0 < w <= window})


def median_run(samples: list[Sample], name: str, settings: ReplaySettings,
               history: list[tuple[list[int], list[int]]] = (), plain: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run with the median makespan over ``settings.seeds`` policy seeds (one run for the
    policies without draws of their own), with every seed's makespan; a ceiling's run is the best
    of :func:`ceiling_windows` and of no drafting (``window`` says which; 0: no drafting, where
    drafting costs a step more than its right tokens save, as at T=1 on a GPU's profile); ``plain``,
    when given, is that run already made."""
    if name in CEILINGS:
        runs = [{**(plain or run(samples, "plain", settings, history)), "window": 0}]
        runs += [{**run(samples, name, replace(settings, window=w), history), "window": w}
                 for w in ceiling_windows(settings.window)]
        best = min(runs, key=lambda r: r["makespan_s"])
        return {**best, "makespans_s": [best["makespan_s"]]}
    runs = [run(samples, name, settings, history, seed)
            for seed in range(settings.seeds if name in ACCEPTANCE_MODELS else 1)]
    runs.sort(key=lambda r: r["makespan_s"])
    return {**runs[(len(runs) - 1) // 2], "makespans_s": [r["makespan_s"] for r in runs]}


def compare(samples: list[Sample], names: list[str], settings: ReplaySettings,
            history: list[tuple[list[int], list[int]]] = (), measured_plain_s: float | None = None) -> dict[str, Any]:
    """``median_run`` of every policy in ``names`` (``plain`` added first if missing), with each one's
    speedup over ``plain``; given ``measured_plain_s`` (a real autoregressive run of the same
    samples), every time is scaled so that replayed plain takes it."""
    names = ["plain"] + [n for n in names if n != "plain"]
    out: dict[str, Any] = {"plain": median_run(samples, "plain", settings, history)}
    for name in names[1:]:  # a ceiling's no-drafting candidate is this plain run
        out[name] = median_run(samples, name, settings, history, out["plain"])
    simulated = out["plain"]["makespan_s"]
    scale = measured_plain_s / simulated if measured_plain_s and simulated > 0 else 1.0
    for row in out.values():
        for key in ("phase1", "phase2"):
            plain_phase = out["plain"][f"{key}_s"]
            row[f"{key}_speedup"] = plain_phase / row[f"{key}_s"] if row[f"{key}_s"] > 0 else None
        row["speedup"] = simulated / row["makespan_s"] if row["makespan_s"] > 0 else None
        for key in ("makespan_s", "phase1_s", "phase2_s"):
            row[key] *= scale
        row["makespans_s"] = [m * scale for m in row["makespans_s"]]
    return {"methods": list(settings.methods), "scale": scale, "runs": out}


def replay_ceilings(samples: list[Sample], methods: list[str], cost: CostModel, measured_autoregressive_s: float,
                    window: int = DEFAULT_WINDOW,
                    history: list[tuple[list[int], list[int]]] = (), limit: int | None = None,
                    greedy: bool = False) -> dict[str, Any]:
    """What ``specactor bench`` reports under each table: autoregressive, the policy (its defaults,
    as the engine runs it) and clairvoyant drafts replayed on a run's own tokens, calibrated so that
    replayed autoregressive takes the measured time. The policy's figure is what it would make of
    the run on an ideal engine (no drafter lookahead, prefill or messaging): beside the measured
    run, the difference is the engine's; beside clairvoyant, the policy's."""
    settings = ReplaySettings(cost, list(methods), window, limit=limit, greedy=greedy)
    got = compare(samples, ["geometric", "clairvoyant"], settings, history, measured_autoregressive_s)
    runs = got["runs"]
    return {"methods": got["methods"], "scale": got["scale"], "autoregressive": runs["plain"],
            "policy": runs["geometric"], "clairvoyant": runs["clairvoyant"]}


def table_rows(label: str, compared: dict[str, Any]) -> list[str]:
    """Markdown rows (after :data:`TABLE_HEADER`) for one rollout's :func:`compare`."""
    def cell(row: dict, key: str) -> str:
        x = row["speedup"] if key == "makespan" else row[f"{key}_speedup"]
        return f"{row[f'{key}_s']:.2f} s" + (f" ({x:.2f}x)" if x else "")

    def named(name: str, row: dict) -> str:
        if "window" not in row:
            return name
        return f"{name} (window {row['window']})" if row["window"] else f"{name} (no drafting pays)"

    return [f"| {label} | {named(name, row)} | {cell(row, 'makespan')} | {cell(row, 'phase1')} | "
            f"{cell(row, 'phase2')} | {row['steps']} |" for name, row in compared["runs"].items()]


TABLE_HEADER = ["| rollout | policy | makespan (x plain) | phase 1: batch | phase 2: tail | verify steps |",
                "|---|---|---|---|---|---|"]
