"""Forward time of a mixed step: a few rows verifying drafts among decode rows.

    python bench/attention_parts.py [--batch 32] [--context 256] [--repeats 7]

Rows verifying drafts get an attention part of their own when they are at most
half the batch (``StepLayout.parts``); before, every row padded its queries to
the longest chunk. Prints the median forward time of the default model for
each batch composition.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specactor.engine.model_registry import resolve_model
from specactor.engine.kv_cache import KVCache
from specactor.engine.weights import load_causal_lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    b, ctx = args.batch, args.context
    model = load_causal_lm(resolve_model(None))
    vocab = model.cfg.vocab_size
    cache = KVCache(model.cfg, b, ctx + 20)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        model(torch.randint(0, vocab, (b * ctx,), generator=g), [ctx] * b, cache, torch.tensor([0]))

    def run(q_lens: list[int]) -> float:
        times = []
        for r in range(args.repeats + 1):
            cache.lengths[:b] = [ctx - (i % 7) * 3 for i in range(b)]  # ragged contexts, as in a rollout
            tokens = torch.randint(0, vocab, (sum(q_lens),), generator=g)
            t0 = time.perf_counter()
            with torch.inference_mode():
                model(tokens, q_lens, cache)
            if r:  # the first is a warm-up
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    cases = {"all rows 1 token": [1] * b, "one row 9 tokens": [9] + [1] * (b - 1),
             "four rows 5 tokens": [5] * 4 + [1] * (b - 4), "all rows 2 tokens": [2] * b, "all rows 5 tokens": [5] * b}
    print(f"| batch {b}, context {ctx} | tokens | median forward ms |\n|---|---|---|")
    for name, q_lens in cases.items():
        print(f"| {name} | {sum(q_lens)} | {run(q_lens):.1f} |")


if __name__ == "__main__":
    main()
