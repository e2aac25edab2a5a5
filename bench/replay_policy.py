"""Policies run on a finished rollout's real acceptance, in simulation: which one the workload rewards.

    python bench/replay_policy.py ROLLOUT.jsonl [--profile PROFILE.json] [--policies plain,geometric,markov]

The rollout's own tokens are replayed through the real drafters
(:mod:`specactor.bench.replay_workload`): every draft's verdict is the one the engine would give
(a draft token is accepted iff it equals the sample's token there, at any temperature), the step
times come from the cost profile (the packaged one unless ``--profile``; the policy's own copy is
corrected online from them, as live). So two policies meet the same workload with none of the
machine's noise, and the acceptance process is the drafters' own (runs, misses, siblings), not
the geometric law the synthetic simulator draws from. What it leaves out is listed in that
module: its makespans are the policy's, on an ideal engine, not a measured run's.

Policies: ``plain`` (no speculation), ``geometric`` and ``markov`` (Fastest-of-N with that
acceptance model, every other setting the engine's default), ``fixed:METHOD:WINDOW`` (every
request drafts with one method and window, decoupled), ``perfect`` (a drafter right on every
token with the full window: the ceiling of any drafter, at zero drafting cost), ``clairvoyant``
(each step, every token the methods' drafts have right and no wrong one: the ceiling of a policy
over these drafters; see :mod:`specactor.bench.replay_workload`). ``--option
KEY=VALUE`` sets one of Fastest-of-N's settings (``caution=2``), ``--drafter-option
METHOD.KEY=VALUE`` one of a drafter's (``ngram.min_n=3``); ``--seeds N`` runs each
Fastest-of-N policy with N seeds of its own (its Thompson draws and explorations) and reports the
run with the median makespan, and every makespan in the JSON. Phase 1 lasts until half the samples
have finished (large batch), phase 2 is the tail, as in ``specactor bench``. Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from specactor.bench.replay_workload import REPLAY_METHODS, ReplayRequest, replay_workload
from specactor.drafters.base import DEFAULT_WINDOW
from specactor.policy.bandit import ACCEPTANCE_MODELS, FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.simulation import FixedPolicy, PlainPolicy, Simulator


class _Perfect(ReplayRequest):
    """Every draft right to its end (the ceiling of any drafter)."""

    def draft(self, method: str, committed: int, window: int, rng: random.Random) -> tuple[int, int]:
        return window, window


def _policy(name: str, methods: list[str], profile: str | None, window: int, options: dict | None = None,
            seed: int = 0):
    if name in ("plain", "perfect", "clairvoyant"):
        return PlainPolicy() if name == "plain" else FixedPolicy(methods[0], window)
    if name in ACCEPTANCE_MODELS:
        return FastestOfN(methods, CostModel.from_profile(profile), max_window=window, acceptance=name, seed=seed,
                          **(options or {}))
    parts = name.split(":")
    if len(parts) == 3 and parts[0] == "fixed" and parts[1] in methods and parts[2].isdigit() and int(parts[2]) > 0:
        return FixedPolicy(parts[1], int(parts[2]))
    raise ValueError(f"unknown policy {name!r}: plain, perfect, clairvoyant, {', '.join(ACCEPTANCE_MODELS)} or "
                     f"fixed:METHOD:WINDOW with METHOD one of {', '.join(methods)}")


def run(path: str, name: str, methods: list[str], profile: str | None, window: int, plan_every: int,
        lag: int, options: dict | None = None, seed: int = 0, drafter_options: dict | None = None) -> dict:
    requests = replay_workload(path, methods, drafter_options=drafter_options)
    if name == "perfect":
        requests = [_Perfect(r.request_id, [], r.output, {}) for r in requests]
    elif name == "clairvoyant":
        requests = replay_workload(path, methods, clairvoyant=True, drafter_options=drafter_options)
    policy = _policy(name, methods, profile, window, options, seed)
    result = Simulator(CostModel.from_profile(profile), plan_every=plan_every, lag=lag).run(requests, policy)
    one, two = result.phases
    return {"makespan_s": result.makespan_s, "steps": result.steps, "tokens": result.tokens,
            "phase1_s": one, "phase2_s": two}


def median_run(path: str, name: str, methods: list[str], profile: str | None, window: int, plan_every: int,
               lag: int, options: dict | None = None, seeds: int = 1, drafter_options: dict | None = None) -> dict:
    """The run with the median makespan over ``seeds`` policy seeds (one run for the policies
    without draws of their own), with every seed's makespan."""
    runs = [run(path, name, methods, profile, window, plan_every, lag, options, seed, drafter_options)
            for seed in range(seeds if name in ACCEPTANCE_MODELS else 1)]
    runs.sort(key=lambda r: r["makespan_s"])
    return {**runs[(len(runs) - 1) // 2], "makespans_s": [r["makespan_s"] for r in runs]}


def _value(text: str) -> object:
    """A setting's value as Python reads it (2, 0.5, False), or else the word itself."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_options(items: list[str]) -> dict:
    """``KEY=VALUE`` settings of FastestOfN."""
    import inspect

    known = set(inspect.signature(FastestOfN).parameters) - {"methods", "cost", "max_window", "acceptance", "seed"}
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--option {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        options[key] = _value(value)
    return options


def parse_drafter_options(items: list[str]) -> dict[str, dict]:
    """``METHOD.KEY=VALUE`` settings of the replayed drafters (their constructors' arguments)."""
    import inspect

    options: dict[str, dict] = {}
    for item in items:
        name, sep, value = item.partition("=")
        method, dot, key = name.partition(".")
        known = set(inspect.signature(REPLAY_METHODS[method]).parameters) if method in REPLAY_METHODS else set()
        if not sep or not dot or key not in known:
            raise ValueError(f"--drafter-option {item!r}: expected METHOD.KEY=VALUE with METHOD one of "
                             f"{', '.join(REPLAY_METHODS)} and KEY one of its settings"
                             + (f" ({', '.join(sorted(known))})" if known else ""))
        options.setdefault(method, {})[key] = _value(value)
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("rollouts", nargs="+", help="`specactor rollout` output files (JSON lines)")
    parser.add_argument("--profile", help="cost profile JSON (default: the packaged one)")
    parser.add_argument("--methods", default="ngram,suffix", help="drafters the policy chooses from "
                        f"(replayable: {', '.join(REPLAY_METHODS)})")
    parser.add_argument("--policies", default="plain,geometric,markov,perfect",
                        help="comma-separated: plain, perfect, geometric, markov, fixed:METHOD:WINDOW")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="longest draft (default %(default)s)")
    parser.add_argument("--plan-every", type=int, default=4, help="steps between plans (live: 4)")
    parser.add_argument("--lag", type=int, default=2, help="steps before a plan takes effect (live: about 2)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a Fastest-of-N setting, e.g. caution=2 (repeatable)")
    parser.add_argument("--drafter-option", action="append", default=[], metavar="METHOD.KEY=VALUE",
                        help="a replayed drafter's setting, e.g. ngram.min_n=3 (repeatable)")
    parser.add_argument("--seeds", type=int, default=1, help="policy seeds per Fastest-of-N run (default 1)")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    names = [n for n in args.policies.split(",") if n]
    if args.window < 1:
        parser.error(f"--window must be at least 1 (got {args.window})")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1 (got {args.seeds})")
    try:
        options = parse_options(args.option)
        drafter_options = parse_drafter_options(args.drafter_option)
        for name in names:
            _policy(name, methods, args.profile, args.window, options)
        for path in args.rollouts:
            replay_workload(path, methods, drafter_options=drafter_options)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "profile": args.profile or "packaged", "options": options,
                    "drafter_options": drafter_options,
                    "command": "python bench/replay_policy.py " + " ".join(sys.argv[1:]), "rollouts": {}}
    print("| rollout | policy | makespan | phase 1: batch | phase 2: tail | verify steps |")
    print("|---|---|---|---|---|---|")
    for path in args.rollouts:
        rows = report["rollouts"][path] = {}
        for name in names:
            rows[name] = median_run(path, name, methods, args.profile, args.window, args.plan_every, args.lag,
                                    options, args.seeds, drafter_options)
        plain = rows.get("plain")
        for name, row in rows.items():
            def x(key: str) -> str:
                return f" ({plain[key] / row[key]:.2f}x)" if plain and row[key] else ""
            print(f"| {Path(path).name} | {name} | {row['makespan_s']:.2f} s{x('makespan_s')} | "
                  f"{row['phase1_s']:.2f} s{x('phase1_s')} | {row['phase2_s']:.2f} s{x('phase2_s')} | "
                  f"{row['steps']} |", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
