"""Cost profile of the target engine: forward time by batch size and chunk length.

    python bench/cost_profile.py [--model smollm2-135m] [--context 128] [--repeats 5]

A command line over :func:`specactor.policy.profiling.measure` (the engine
measures a quick profile of its own at start-up and caches it; this one is
the full grid, for RESULTS.md or for ``EngineConfig(profile=...)``). For each
batch size B and chunk length C, every row has ``--context`` tokens already in
its KV cache and feeds C new tokens (C=1 is a decode step, C=k+1 verifies k
draft tokens); logits are computed for all B*C positions, as verification
needs; and, for B > 1, one row feeds C tokens while the others decode. The
weights are packed as the engine packs them. The median over ``--repeats``
timed forwards is saved, together with the sampler's time for B*C rows at
temperature 1.

Output (bench/results/cost_profile.json), the format the policy's cost model
fits:
    {"model": str, "context": int, "threads": int, "batch_sizes": [B...],
     "chunk_lens": [C...], "forward_s": [[median seconds for B, C]...],
     "one_row_s": [[median seconds, one row fed C]...],
     "sample_s": [[median seconds for B*C rows]...], "date": str, "machine": str}
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from specactor.models import resolve_model
from specactor.policy.profiling import measure, write_profile
from specactor.verifier.weights import load_causal_lm


def table(result) -> str:
    cs = result["chunk_lens"]
    head = "| batch | " + " | ".join(f"C={c}" for c in cs) + " | sampler at C=1 |"
    lines = [head, "|" + "---|" * (len(cs) + 2)]
    for b, f_row, s_row in zip(result["batch_sizes"], result["forward_s"], result["sample_s"]):
        base = f_row[0]
        cells = [f"{f_row[0] * 1000:.0f}"] + [f"{t * 1000:.0f} ({t / base:.1f}x)" for t in f_row[1:]]
        lines.append(f"| {b} | " + " | ".join(cells) + f" | {s_row[0] * 1000:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,48,64")
    parser.add_argument("--chunk-lens", default="1,2,4,8,17",
                        help="new tokens a row (a verify step feeds window + 1: 17 at the default window)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cost_profile.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_causal_lm(resolve_model(args.model))
    result = measure(model, [int(x) for x in args.batch_sizes.split(",")], [int(x) for x in args.chunk_lens.split(",")],
                     args.context, args.repeats, sample=True, progress=lambda line: print(line, flush=True))
    result["model"] = args.model or "smollm2-135m"
    write_profile(args.out, result)
    print()
    print("Median forward ms (ratio to C=1):")
    print(table(result))
