"""How many verify steps a rollout's samples would take if a drafter drafted on every step.

    python bench/drafter_steps.py ROLLOUT.jsonl [--window 16] [--ids HumanEval/5,HumanEval/1]
                                  [--out bench/results/drafter_steps.json]

ROLLOUT.jsonl is what ``specactor rollout`` writes (any mode, any temperature). Under
specactor's position-keyed sampling a draft token is accepted iff it equals the token the
sample committed at that position, so replaying a sample's own tokens gives every drafter's
exact acceptance, step by step: each step the drafter proposes up to ``--window`` tokens from
the context so far, the matching prefix is committed with the verifier's own token, and so on
to the end. The count of steps is what that drafter would need with no policy at all (drafting
always, whatever the batch), against the ``verify_steps`` the rollout itself took; the
difference is what the policy chose not to draft (or could not: it drafts only where the cost
profile says a draft pays at the step's batch size).

Drafters: specactor's ``ngram`` and ``suffix`` (on the sample's own prompt and output; the
siblings and earlier epochs a live suffix drafter also reads are not replayed), and, where
``arctic-inference`` is installed (``bash scripts/setup.sh --vllm-suffix``), Arctic Inference's
suffix tree as vLLM's ``suffix`` method uses it (its defaults: depth 24, spec factor 1,
minimum token probability 0.1).

A second table gives, per draft position k over all the samples replayed, the chance that draft
token k is right given that the tokens before it were: one number for every k if acceptance
were geometric (the policy's cost model assumes so), rising with k where a sample falls into
repeating itself (a draft whose first tokens are right is then right to its end). A third
splits the drafts by what the step before made of its own: after a draft right to its end, the
next is right far more often than after a miss (the policy's per-request acceptance is one
decayed rate, not conditioned on the last draft).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

def main() -> None:
    from specactor.cli.main import HelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("rollout", type=Path, help="a `specactor rollout` output file (JSON lines)")
    parser.add_argument("--window", type=int, default=16, help="the most tokens a draft may have")
    parser.add_argument("--ids", default=None, help="comma-separated prompt ids to replay (default: every one)")
    parser.add_argument("--samples", default="0", help="comma-separated sample numbers of each prompt, or 'all'")
    parser.add_argument("--out", default="bench/results/drafter_steps.json", help="where the JSON goes")
    args = parser.parse_args()
    if args.window < 1:
        parser.error(f"--window must be at least 1 (got {args.window})")
    from specactor.bench.replay import load_rollout

    try:
        rows = load_rollout(args.rollout)
        ids = {i for i in (args.ids or "").split(",") if i}
        samples = None if args.samples == "all" else {int(s) for s in args.samples.split(",") if s}
    except ValueError as exc:
        parser.error(f"cannot read the rollout or --samples: {exc}")
    rows = [r for r in rows if (not ids or r["id"] in ids) and (samples is None or r["sample"] in samples)]
    if not rows:
        parser.error("no sample of the rollout matches --ids / --samples")
    from specactor.bench.replay import DRAFTERS, replay

    from specactor.vllm_backend import suffix_decoding_missing

    drafters = [d for d in DRAFTERS if d != "arctic" or not suffix_decoding_missing()]
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "window": args.window, "drafters": drafters,
                    "command": "python bench/drafter_steps.py " + " ".join(sys.argv[1:]), "samples": []}
    print("| sample | tokens | rollout's verify steps | " + " | ".join(f"{d}: steps (accepted / drafted)"
                                                              for d in drafters) + " |")
    print("|---" * (3 + len(drafters)) + "|")
    for row in rows:
        entry = {"id": row["id"], "sample": row["sample"], "tokens": len(row["token_ids"]),
                 "rollout_verify_steps": row["stats"].get("verify_steps")}
        for drafter in drafters:
            entry[drafter] = replay(row["prompt_ids"], row["token_ids"], drafter, args.window)
        report["samples"].append(entry)
        print(f"| {row['id']}#{row['sample']} | {entry['tokens']} | {entry['rollout_verify_steps']} | "
              + " | ".join(f"{entry[d]['steps']} ({entry[d]['accepted']} / {entry[d]['drafted']})"
                           for d in drafters) + " |", flush=True)
    # per draft position over every sample: the chance that token k is right given the ones
    # before it were (a geometric acceptance model, the policy's, takes them all to be one p)
    report["by_position"] = {}
    print("\n| drafter | one p (right / reached) | " + " | ".join(f"k={k + 1}" for k in range(args.window))
          + " |")
    print("|---" * (2 + args.window) + "|")
    for drafter in drafters:
        reached = [sum(e[drafter]["reached"][k] for e in report["samples"]) for k in range(args.window)]
        right = [sum(e[drafter]["right"][k] for e in report["samples"]) for k in range(args.window)]
        report["by_position"][drafter] = {"reached": reached, "right": right}
        pooled = sum(right) / sum(reached) if sum(reached) else 0.0
        print(f"| {drafter} | {pooled:.2f} | " + " | ".join(
            f"{r / n:.2f} ({n})" if n else "-" for r, n in zip(right, reached)) + " |")
    # by what the step before made of its draft: a sample in a repeat stays in it
    from specactor.bench.replay import OUTCOMES

    labels = {"none": "no draft", "miss": "wrong from its first token", "partial": "partly right",
              "full": "right to its end"}
    report["after"] = {}
    print("\n| drafter | " + " | ".join(f"after a draft {labels[o]}: share right (drafts)" if o != "none"
                                        else "after no draft: share right (drafts)" for o in OUTCOMES) + " |")
    print("|---" * (1 + len(OUTCOMES)) + "|")
    for drafter in drafters:
        after = {o: [sum(e[drafter]["after"][o][i] for e in report["samples"]) for i in range(3)] for o in OUTCOMES}
        report["after"][drafter] = {o: dict(zip(("drafts", "drafted", "accepted"), c)) for o, c in after.items()}
        print(f"| {drafter} | " + " | ".join(f"{c[2] / c[1]:.2f} ({c[0]})" if c[1] else "-"
                                           for c in after.values()) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
