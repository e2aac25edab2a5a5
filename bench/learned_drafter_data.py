"""The learned drafter's acceptance against how much rollout data it trained on: its learning curve.

    python bench/learned_drafter_data.py --train R1.jsonl,R2.jsonl,... --eval R.jsonl:1:8,H.jsonl:1:7
                                         [--sizes 1,2,4,8] [--layers 2] [--vocab 4096]
                                         [--out bench/results/learned_drafter_data.json]

Each ``--train`` file is one RL epoch's rollout (``specactor rollout`` output); a size of k trains
a fresh student, one round with the product's settings (or ``--epochs``/``--lr``), on the first k
of them, as the drafter would after k epochs of a run whose policy did not move. Each ``--eval``
rollout is FILE:T:SEED (its temperature and rollout seed: the drafter samples with the target's
noise for them). Measured on every output position of the eval samples, teacher-forced
(:mod:`specactor.bench.replay_learned`, exact for a token-only drafter under position-keyed noise):
the share right (a one-token draft's acceptance), the share of drafts started there whose first
j tokens are all right (j = 1..k), and the tokens a k-token draft gets accepted on average.

Why: a T=1 speedup needs a drafter right on ~55% of tokens on an H200 7B profile and ~80%
on this 2-core CPU (``bench/required_acceptance.py``); the student trained on one or three epochs
is right on 21-28%. Whether more data closes that, and at what rate, is what this measures.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

from specactor.bench import replay_learned
from specactor.bench.replay import load_rollout
from specactor.drafters.learned import DEFAULT_LAYERS, DEFAULT_VOCAB, TRAIN_EPOCHS, TRAIN_LR, LearnedDrafter
from specactor.engine.model_registry import resolve_model
from specactor.engine.weights import load_causal_lm


def draft_acceptance(predictions: dict[str, list[int]], rows: list[dict], k: int) -> tuple[list[float], float]:
    """Per draft position j (1..k), the share of output positions from which a k-token draft's first
    j tokens are all right; and the mean accepted tokens of such a draft."""
    hits, starts = [0] * k, 0
    for row in rows:
        pred, truth = predictions.get(replay_learned.sample_key(row), []), row["token_ids"]
        right = [a == b for a, b in zip(pred, truth)]
        run = 0  # right positions in a row ending at i, scanned backwards: the run starting at i
        runs = [0] * len(right)
        for i in range(len(right) - 1, -1, -1):
            run = run + 1 if right[i] else 0
            runs[i] = run
        for r in runs:
            for j in range(min(r, k)):
                hits[j] += 1
        starts += len(truth)
    per = [h / starts if starts else 0.0 for h in hits]
    return per, sum(per)


def parse_eval(item: str) -> tuple[str, float, int]:
    path, sep, rest = item.partition(":")
    t, sep2, seed = rest.partition(":")
    try:
        if not (sep and sep2):
            raise ValueError
        return path, float(t), int(seed)
    except ValueError:
        raise SystemExit(f"--eval {item!r}: expected FILE:T:SEED, e.g. rollout.jsonl:1:8") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--train", required=True, help="comma-separated rollouts, one an epoch, in order")
    parser.add_argument("--eval", required=True, help="comma-separated FILE:T:SEED rollouts to measure on")
    parser.add_argument("--sizes", default="", help="how many of the --train files each student trains on "
                        "(default: 1, 2, 4, ... and all)")
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="student depth (default %(default)s)")
    parser.add_argument("--vocab", type=int, default=DEFAULT_VOCAB, help="student head size (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=TRAIN_EPOCHS, help="passes a round (default %(default)s)")
    parser.add_argument("--lr", type=float, default=TRAIN_LR, help="learning rate (default %(default)s)")
    parser.add_argument("--k", type=int, default=4, help="draft length for the per-position figures")
    parser.add_argument("--model", default=None, help="target (default: the packaged model)")
    parser.add_argument("--out", default="bench/results/learned_drafter_data.json")
    args = parser.parse_args()

    train_paths = [p for p in args.train.split(",") if p]
    evals = [parse_eval(item) for item in args.eval.split(",") if item]
    if args.sizes:
        try:
            sizes = sorted({int(s) for s in args.sizes.split(",") if s})
        except ValueError:
            raise SystemExit(f"--sizes {args.sizes!r}: expected whole numbers, e.g. 1,2,4") from None
    else:
        sizes = sorted({*[2 ** i for i in range(len(train_paths).bit_length()) if 2 ** i <= len(train_paths)],
                        len(train_paths)})
    if not sizes or sizes[0] < 1 or sizes[-1] > len(train_paths):
        raise SystemExit(f"--sizes must lie in 1..{len(train_paths)} (the --train files), got {sizes}")
    try:
        train_rows = [load_rollout(p) for p in train_paths]
        eval_rows = {path: load_rollout(path) for path, _, _ in evals}
    except (ValueError, OSError) as exc:  # load_rollout names the file and what is wrong with it
        raise SystemExit(f"learned_drafter_data.py: {exc}") from None
    target = load_causal_lm(resolve_model(args.model))

    results = []
    for size in sizes:
        drafter = LearnedDrafter(target, layers=args.layers, vocab=args.vocab, epochs=args.epochs, lr=args.lr,
                                 max_train_s=None, buffer_tokens=10 ** 9)
        rows = [row for rollout in train_rows[:size] for row in rollout]
        report = replay_learned.train_on_rollouts(drafter, rows)
        entry = {"epochs_of_data": size, "samples": len(rows), "report": asdict(report) if report else None,
                 "eval": {}}
        for path, temperature, seed in evals:
            predictions = replay_learned.teacher_forced_predictions(drafter, eval_rows[path], temperature, seed)
            per, mean = draft_acceptance(predictions, eval_rows[path], args.k)
            entry["eval"][path] = {"temperature": temperature, "seed": seed,
                                   "right": round(replay_learned.hit_rate(predictions, eval_rows[path]), 4),
                                   "per_position": [round(x, 4) for x in per], "accepted_per_draft": round(mean, 3)}
        results.append(entry)
        line = ", ".join(f"{Path(p).name} {e['right']:.1%} ({e['accepted_per_draft']:.2f}/{args.k})"
                         for p, e in entry["eval"].items())
        print(f"{size} epoch(s) of data, {report.tokens if report else 0} tokens, "
              f"{report.seconds if report else 0:.0f} s: {line}", flush=True)
    out = {"command": "python bench/learned_drafter_data.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, "")),
           "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
           "date": time.strftime("%Y-%m-%d"), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
