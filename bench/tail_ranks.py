"""How many sampled tokens the model ranks far down, against how many its own probabilities expect.

    python bench/tail_ranks.py ROLLOUT.jsonl [ROLLOUT2.jsonl ...] [--rank 1000]

For each `specactor rollout` output file (default model, any temperature-1 run): every output
token is scored by the model, teacher-forced; the count of tokens ranked at ``--rank`` or beyond
is printed beside the count the model's own distribution expects there (the sum over positions of
its probability mass beyond that rank). A sampler that picks random tokens now and then shows an
excess; the model's own tail at T=1 is large (a few percent beyond rank 1000), so only a fault of
some size shows in aggregate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    from specactor.cli.main import HelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("rollouts", nargs="+", type=Path, help="`specactor rollout` output files (JSON lines)")
    parser.add_argument("--rank", type=int, default=1000, help="count tokens the model ranks here or beyond (0 = first)")
    args = parser.parse_args()
    if args.rank < 1:
        parser.error(f"--rank must be at least 1 (got {args.rank})")
    missing = [str(p) for p in args.rollouts if not p.is_file()]
    if missing:
        parser.error(f"no rollout file at {', '.join(missing)}")
    import torch

    from specactor.engine.model_registry import resolve_model
    from specactor.engine.kv_cache import KVCache
    from specactor.engine.weights import load_causal_lm

    model = load_causal_lm(resolve_model(None))
    for path in args.rollouts:
        tokens = far = 0
        expected = 0.0
        for line in path.read_text().splitlines():
            row = json.loads(line)
            prompt, output = row["prompt_ids"], row["token_ids"]
            if not output:
                continue
            ids = prompt + output
            with torch.no_grad():
                logits = model(torch.tensor(ids), [len(ids)], KVCache(model.cfg, 1, len(ids)),
                               torch.arange(len(prompt) - 1, len(ids) - 1))
            rank = (logits > logits.gather(1, torch.tensor(output)[:, None])).sum(-1)
            ordered = torch.softmax(logits.double(), -1).sort(-1, descending=True).values
            expected += float(ordered[:, args.rank:].sum())
            tokens += len(output)
            far += int((rank >= args.rank).sum())
        print(f"{path}: {tokens} tokens, {far} ranked at {args.rank} or beyond; "
              f"the model expects {expected:.1f}", flush=True)


if __name__ == "__main__":
    main()
