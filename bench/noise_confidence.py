"""Does a draft token's own position-keyed noise say whether it will be accepted (T > 0)?

    python bench/noise_confidence.py ROLLOUT.jsonl --seed 7 [--drafter suffix] [--window 8]
                                     [--out bench/results/noise_confidence.json]

Under specactor's sampler the target picks ``argmax(log p + g)`` with Gumbel noise ``g`` that is a
pure function of (sample seed, position, token), so a drafter can know the noise of the token it
proposes. If the model gives that token probability p, it wins with probability
``u ** ((1 - p) / p)`` where u is its uniform (the rest of the vocabulary's best score is a Gumbel
located at log(1 - p)): a draft token with a high u is likelier to be accepted, and one with a low
u could be cut from the draft before anyone verifies it. How much that is worth depends on how
the drafted tokens' p are spread (a token at p ~ 1 is accepted whatever its u, one at p ~ 0.01
is rejected whatever it is), so it is measured: a rollout's samples are replayed through a drafter
that drafts every step (``specactor.bench.replay``; exact, since a draft token is accepted iff it
is the committed one), and every draft token that was checked is binned by its own uniform.

``--seed`` is the rollout's ``--seed`` (sample i of line X used the seed derived from it, X and i;
a prompt line that named a seed of its own used that one: run such lines apart, with that --seed).
The script checks it: the committed tokens' mean uniform is above 0.5 when the seed is right
(the noise helped pick them) and 0.5 when it is not, or when the rollout was greedy (T = 0, where
the noise plays no part and this question does not arise).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


#: the committed tokens' mean uniform below which the seed (or the temperature) cannot be right
LEAST_COMMITTED_MEAN = 0.52


def main() -> None:
    from specactor.cli.main import HelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("rollout", type=Path, help="a `specactor rollout` output file (JSON lines) sampled at T > 0")
    parser.add_argument("--seed", type=int, default=0, help="the rollout's --seed")
    parser.add_argument("--drafter", default="suffix", help="ngram, suffix or arctic (see bench/drafter_steps.py)")
    parser.add_argument("--window", type=int, default=8, help="the most tokens a draft may have")
    parser.add_argument("--vocab", type=int, default=None, help="the model's vocabulary (default: the default model's)")
    parser.add_argument("--out", default="bench/results/noise_confidence.json", help="where the JSON goes")
    args = parser.parse_args()
    if args.window < 1:
        parser.error(f"--window must be at least 1 (got {args.window})")
    from specactor.bench.replay import load_rollout

    try:
        rows = [(r["id"], r["sample"], r["prompt_ids"], r["token_ids"]) for r in load_rollout(args.rollout)]
    except ValueError as exc:
        parser.error(str(exc))
    rows = [r for r in rows if r[3]]
    if not rows:
        parser.error(f"{args.rollout} holds no sample with tokens")

    import torch

    from specactor.bench.replay import DRAFTERS, replay_steps
    from specactor.seeds import sample_seed
    from specactor.engine.sampler import token_uniforms
    from specactor.vllm_backend import suffix_decoding_missing

    if args.drafter not in DRAFTERS:
        parser.error(f"unknown --drafter {args.drafter!r}: choose from {', '.join(DRAFTERS)}")
    missing = suffix_decoding_missing() if args.drafter == "arctic" else None
    if missing:
        parser.error(f"--drafter arctic: {missing}")
    vocab = args.vocab or _default_vocab()
    largest = max(max(r[2] + r[3]) for r in rows)
    if largest >= vocab:
        parser.error(f"token id {largest} is outside a vocabulary of {vocab} (--vocab)")

    # the seed first: with the wrong one every figure below would be noise
    seeds = {(rid, sample): sample_seed(args.seed, rid, sample) for rid, sample, _, _ in rows}
    committed_u: list[float] = []
    for rid, sample, _, out in rows:
        positions = torch.arange(len(out))
        committed_u += token_uniforms(torch.full((len(out),), seeds[rid, sample], dtype=torch.int64), positions,
                                      torch.tensor(out), vocab).tolist()
    mean_committed = sum(committed_u) / len(committed_u)
    if mean_committed < LEAST_COMMITTED_MEAN:
        sys.exit(f"the committed tokens' mean uniform is {mean_committed:.3f}, as if the noise played no part: "
                 f"--seed {args.seed} is not the rollout's seed, or it was sampled greedily (T=0)")

    checked: list[tuple[float, bool]] = []  # (uniform, accepted) of every draft token that was checked
    for rid, sample, prompt, out in rows:
        positions, tokens, right = [], [], []
        for t, draft, ok in replay_steps(prompt, out, args.drafter, args.window):
            n = min(ok + 1, len(draft), len(out) - t)  # the right ones and the first wrong one
            positions += range(t, t + n)
            tokens += draft[:n]
            right += [j < ok for j in range(n)]
        if tokens:
            u = token_uniforms(torch.full((len(tokens),), seeds[rid, sample], dtype=torch.int64),
                               torch.tensor(positions), torch.tensor(tokens), vocab)
            checked += zip(u.tolist(), right)
    if not checked:
        sys.exit(f"{args.drafter} drafted nothing on these samples")

    by_bin: list[list[bool]] = [[] for _ in range(10)]
    for u, ok in checked:
        by_bin[min(int(u * 10), 9)].append(ok)
    bins = []
    for b, inside in enumerate(by_bin):
        bins.append({"uniform": [b / 10, (b + 1) / 10], "checked": len(inside),
                     "acceptance": round(sum(inside) / len(inside), 4) if inside else None})
    accepted_all = sum(ok for _, ok in checked)
    cuts = []
    for least in (0.0, 0.3, 0.5, 0.7, 0.9):
        kept = [ok for u, ok in checked if u >= least]
        cuts.append({"least_uniform": least, "checked": len(kept),
                     "acceptance": round(sum(kept) / len(kept), 4) if kept else None,
                     "accepted_kept": round(sum(kept) / accepted_all, 4) if accepted_all else None})
    report = {"date": time.strftime("%Y-%m-%d %H:%M"),
              "command": "python bench/noise_confidence.py " + " ".join(sys.argv[1:]),
              "rollout": str(args.rollout), "drafter": args.drafter, "window": args.window,
              "samples": len(rows), "committed_mean_uniform": round(mean_committed, 4),
              "checked": len(checked), "accepted": accepted_all, "by_uniform": bins, "cuts": cuts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(rows)} samples, committed tokens' mean uniform {mean_committed:.3f}; {args.drafter} "
          f"(window {args.window}): {len(checked)} draft tokens checked, {accepted_all} accepted")
    for b in bins:
        if b["checked"]:
            print(f"  uniform {b['uniform'][0]:.1f}-{b['uniform'][1]:.1f}: {b['checked']:6d} checked, "
                  f"{b['acceptance']:.2f} accepted")
    for c in cuts:
        if c["checked"]:
            print(f"  drafting only tokens with uniform >= {c['least_uniform']:.1f}: acceptance {c['acceptance']:.2f}, "
                  f"{c['accepted_kept']:.0%} of the accepted tokens kept")
    print(f"wrote {args.out}")


def _default_vocab() -> int:
    """The default model's vocabulary size, from its config (no weights loaded)."""
    from specactor.engine.model_registry import resolve_model
    from specactor.engine.config import ModelConfig

    return ModelConfig.from_dir(resolve_model("smollm2-135m")).vocab_size


if __name__ == "__main__":
    main()
