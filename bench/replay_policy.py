"""Policies run on a finished rollout's real acceptance, in simulation: which one the workload rewards.

    python bench/replay_policy.py ROLLOUT.jsonl [--profile PROFILE.json] [--policies plain,geometric,markov]

``specactor replay`` does the same for one rollout with the default policy; this script compares
settings: several rollouts, any policies, Fastest-of-N's and the drafters' settings.

The rollout's own tokens are replayed through the real drafters
(:mod:`specactor.bench.replay_workload`): every draft's verdict is the one the engine would give
(a draft token is accepted iff it equals the sample's token there, at any temperature), the step
times come from the cost profile (the packaged one unless ``--profile``; the policy's own copy is
corrected online from them, as live). So two policies meet the same workload with none of the
machine's noise, and the acceptance process is the drafters' own (runs, misses, siblings), not
the geometric law the synthetic simulator draws from. What it leaves out is listed in that
module: its makespans are the policy's, on an ideal engine, not a measured run's.

Policies: those of :mod:`specactor.bench.replay_runs` (plain, geometric, markov,
fixed:METHOD:WINDOW, clairvoyant, perfect). ``--option
KEY=VALUE`` sets one of Fastest-of-N's settings (``caution=2``), ``--drafter-option
METHOD.KEY=VALUE`` one of a drafter's (``ngram.min_n=3``); ``--seeds N`` runs each
Fastest-of-N policy with N seeds of its own (its Thompson draws and explorations) and reports the
run with the median makespan, and every makespan in the JSON. Phase 1 lasts until half the samples
have finished (large batch), phase 2 is the tail, as in ``specactor bench``. Writes JSON (``--out``).

The learned drafter (``--learned TRAIN.jsonl[,...]``): a student of the packaged model (``--model``
for another) trains one round, with the product's settings, on those rollouts' samples (earlier RL
epochs), and is replayed as method ``learned`` from its teacher-forced predictions
(:mod:`specactor.bench.replay_learned`), which need each replayed rollout's temperature and seed
(``--sampling 1:7,0:7``, in the rollouts' order). Its drafting time per token is ``--learned-cost``
target decode steps at the same batch; ``--learned-on-verifier`` adds its time to the step's (it
runs on the verifier's own GPU, or its 2 CPU cores) instead of hiding it beside the verify step (a
drafter on hardware of its own); the cheap drafters run on spare CPU cores either way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from specactor.bench import replay_learned
from specactor.bench.replay import load_rollout
from specactor.bench.replay_learned import LEARNED
from specactor.bench.replay_runs import TABLE_HEADER, ReplaySettings, compare, make_policy, table_rows
from specactor.bench.replay_workload import REPLAY_METHODS, samples_of, told_of
from specactor.speculation import DEFAULT_WINDOW
from specactor.policy.bandit import FastestOfN
from specactor.policy.bandit_state import DORMANT_SLOWDOWN
from specactor.policy.cost_model import CostModel


def _value(text: str) -> object:
    """A setting's value as Python reads it (2, 0.5, False), or else the word itself."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _keyword_settings(items: list[str], flag: str, cls: type, fixed: set[str]) -> dict:
    """``KEY=VALUE`` items as keyword arguments of ``cls`` (any but ``fixed``); ValueError naming ``flag``."""
    import inspect

    known = set(inspect.signature(cls).parameters) - fixed
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        options[key] = _value(value)
    return options


def parse_options(items: list[str]) -> dict:
    """``KEY=VALUE`` settings of FastestOfN."""
    return _keyword_settings(items, "--option", FastestOfN, {"methods", "cost", "max_window", "acceptance", "seed"})


def parse_drafter_options(items: list[str]) -> dict[str, dict]:
    """``METHOD.KEY=VALUE`` settings of the replayed drafters (their constructors' arguments)."""
    import inspect

    options: dict[str, dict] = {}
    for item in items:
        name, sep, value = item.partition("=")
        method, dot, key = name.partition(".")
        settable = method in REPLAY_METHODS and method != LEARNED  # its predictions come from --learned
        known = set(inspect.signature(REPLAY_METHODS[method]).parameters) if settable else set()
        if not sep or not dot or key not in known:
            raise ValueError(f"--drafter-option {item!r}: expected METHOD.KEY=VALUE with METHOD one of "
                             f"{', '.join(m for m in REPLAY_METHODS if m != LEARNED)} and KEY one of its settings"
                             + (f" ({', '.join(sorted(known))})" if known else ""))
        options.setdefault(method, {})[key] = _value(value)
    return options


def parse_learned_options(items: list[str]) -> dict:
    """``KEY=VALUE`` settings of the learned drafter (its constructor's arguments: layers, vocab,
    epochs, lr, max_train_s, buffer_tokens)."""
    from specactor.drafters.learned import LearnedDrafter

    return _keyword_settings(items, "--learned-option", LearnedDrafter, {"target", "max_slots", "max_len", "device"})


def parse_sampling(text: str | None, rollouts: int) -> list[tuple[float, int]]:
    """``T:SEED`` per replayed rollout, comma-separated, in their order."""
    items = [i for i in (text or "").split(",") if i]
    if len(items) != rollouts:
        raise ValueError(f"--sampling needs one T:SEED per rollout ({rollouts}), got {len(items)}: "
                         "the learned drafter samples with each rollout's temperature and seed")
    out = []
    for item in items:
        t, sep, seed = item.partition(":")
        try:
            out.append((float(t), int(seed)))
        except ValueError:
            raise ValueError(f"--sampling {item!r}: expected T:SEED, e.g. 1:7") from None
        if not sep or out[-1][0] < 0:
            raise ValueError(f"--sampling {item!r}: expected T:SEED with T >= 0, e.g. 1:7")
    return out


def learned_settings(args: argparse.Namespace, settings: ReplaySettings, sampling: list[tuple[float, int]],
                     rows_of: dict[str, list[dict]], options: dict) -> tuple[dict[str, ReplaySettings], dict]:
    """Train the learned drafter on ``--learned`` and give each rollout settings that replay its
    predictions there (``rows_of``: each replayed rollout's rows); also what it trained on and its
    one-token hit rate on each rollout. ``options``: the student's settings (``--learned-option``)."""
    from dataclasses import asdict, replace

    from specactor.drafters.learned import LearnedDrafter
    from specactor.engine.model_registry import resolve_model
    from specactor.engine.weights import load_causal_lm

    drafter = LearnedDrafter(load_causal_lm(resolve_model(args.model)), **options)
    paths = [path for path in args.learned.split(",") if path]
    train = [row for path in paths for row in load_rollout(path)]
    trained = replay_learned.train_on_rollouts(drafter, train)
    info: dict = {"train": paths, "report": asdict(trained) if trained else None,
                  "cost_steps_per_token": args.learned_cost, "hit_rate": {}}
    print(f"learned drafter: trained on {len(train)} samples: {info['report']}", flush=True)
    out = {}
    for path, (temperature, seed) in zip(args.rollouts, sampling):
        rows = rows_of[path]
        predictions = replay_learned.teacher_forced_predictions(drafter, rows, temperature, seed)
        info["hit_rate"][path] = round(replay_learned.hit_rate(predictions, rows), 4)
        print(f"{Path(path).name}: learned drafter right on {info['hit_rate'][path]:.1%} of positions", flush=True)
        options = {**settings.drafter_options, LEARNED: {"predictions": predictions}}
        out[path] = replace(settings, drafter_options=options)
    return out, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("rollouts", nargs="+", help="`specactor rollout` output files (JSON lines)")
    parser.add_argument("--profile", help="cost profile JSON (default: the packaged one)")
    parser.add_argument("--methods", default="ngram,suffix", help="drafters the policy chooses from "
                        f"(replayable: {', '.join(REPLAY_METHODS)})")
    parser.add_argument("--policies", default="plain,geometric,markov,perfect",
                        help="comma-separated: plain, clairvoyant, perfect, geometric, markov, fixed:METHOD:WINDOW")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="longest draft (default %(default)s)")
    parser.add_argument("--plan-every", type=int, default=4, help="steps between plans (live: 4)")
    parser.add_argument("--lag", type=int, default=2, help="steps before a plan takes effect (live: about 2)")
    parser.add_argument("--dormant", type=int, default=DORMANT_SLOWDOWN,
                        help=f"how many times less often the policy plans while every request is off "
                             f"(live: {DORMANT_SLOWDOWN}; 1: the cadence of earlier replays)")
    parser.add_argument("--reported", type=float, default=1.0,
                        help="the share of a step's time the policy is told: 1 = the truth (default); ~0.1 "
                             "replays a GPU whose steps were timed by the host's clock, their launch only")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a Fastest-of-N setting, e.g. caution=2 (repeatable)")
    parser.add_argument("--drafter-option", action="append", default=[], metavar="METHOD.KEY=VALUE",
                        help="a replayed drafter's setting, e.g. ngram.min_n=3 (repeatable)")
    parser.add_argument("--seeds", type=int, default=1, help="policy seeds per Fastest-of-N run (default 1)")
    parser.add_argument("--learned", metavar="TRAIN.jsonl[,...]",
                        help="train the learned drafter on these rollouts and replay it as method 'learned'")
    parser.add_argument("--sampling", metavar="T:SEED[,...]",
                        help="each replayed rollout's temperature and --seed, in order (needed by --learned; "
                             "without it, a rollout counts as greedy if every prompt's samples are the same)")
    parser.add_argument("--learned-cost", type=float, default=1 / 16,
                        help="the learned drafter's time per token, in target decode steps (default 1/16)")
    parser.add_argument("--learned-on-verifier", action="store_true",
                        help="the learned drafter runs on the verifier's own hardware (one GPU, a 2-core "
                             "CPU): its time adds to the step's instead of hiding beside it")
    parser.add_argument("--learned-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a learned drafter setting, e.g. max_train_s=None to train on many epochs' rollouts "
                             "without the product's 120 s cap a round (repeatable)")
    parser.add_argument("--model", help="the target model folder for --learned (default: the packaged model)")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    if args.learned and LEARNED not in methods:
        # last: a ceiling pays the first method's drafting time only, so with the learned drafter
        # last its right tokens come free there, and the ceiling stays a bound on any policy
        methods.append(LEARNED)
    if LEARNED in methods and not args.learned:
        parser.error(f"method {LEARNED!r} needs --learned (rollouts to train it on)")
    try:
        sampling = parse_sampling(args.sampling, len(args.rollouts)) if args.learned or args.sampling else []
    except ValueError as exc:
        parser.error(str(exc))
    names = [n for n in args.policies.split(",") if n]
    if args.window < 1:
        parser.error(f"--window must be at least 1 (got {args.window})")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1 (got {args.seeds})")
    if args.dormant < 1:
        parser.error(f"--dormant must be at least 1 (got {args.dormant})")
    if not 0 < args.reported <= 10:
        parser.error(f"--reported must be in (0, 10] (got {args.reported})")
    try:
        settings = ReplaySettings(CostModel.from_profile(args.profile), methods, args.window, args.plan_every,
                                  args.lag, parse_options(args.option), parse_drafter_options(args.drafter_option),
                                  args.seeds, args.reported, args.dormant)
        if args.learned_on_verifier:
            settings.cost.shared_methods.add(LEARNED)
        if args.learned:
            settings.cost.draft[LEARNED] = replay_learned.learned_draft_cost(settings.cost, args.learned_cost)
        for name in names:
            make_policy(name, settings)
        learned_options = parse_learned_options(args.learned_option)
        rows_of = {path: load_rollout(path) for path in args.rollouts}
        rollouts = {path: samples_of(rows) for path, rows in rows_of.items()}
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "profile": args.profile or "packaged",
                    "options": settings.options, "drafter_options": settings.drafter_options,
                    "learned_on_verifier": args.learned_on_verifier,
                    "command": "python bench/replay_policy.py " + " ".join(sys.argv[1:]), "rollouts": {}}
    per_rollout = {path: settings for path in rollouts}
    if args.learned:
        per_rollout, report["learned"] = learned_settings(args, settings, sampling, rows_of, learned_options)
    # what the policy is told of each rollout: its max_tokens and whether it decoded greedily (--sampling's
    # temperatures, else what its rows show)
    temperatures = [t for t, _ in sampling] or [None] * len(rollouts)
    for (path, rows), temperature in zip(rows_of.items(), temperatures):
        limit, greedy = told_of(rows, temperature)
        per_rollout[path] = replace(per_rollout[path], limit=limit, greedy=greedy)
    print("\n".join(TABLE_HEADER))
    for path, samples in rollouts.items():
        compared = report["rollouts"][path] = compare(samples, names, per_rollout[path])
        print("\n".join(table_rows(Path(path).name, compared)), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
