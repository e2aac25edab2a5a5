"""Cost profile of the target engine: forward time by batch size and chunk length.

    python bench/cost_profile.py [--model smollm2-135m] [--context 128] [--repeats 5]

For each batch size B and chunk length C, every row has ``--context`` tokens
already in its KV cache and feeds C new tokens (C=1 is a decode step, C=k+1
verifies k draft tokens); logits are computed for all B*C positions, as
verification needs. The median over ``--repeats`` timed forwards is saved,
together with the sampler's time for B*C rows at temperature 1.

Output (bench/results/cost_profile.json), the format the policy's cost model
fits:
    {"model": str, "context": int, "threads": int, "batch_sizes": [B...],
     "chunk_lens": [C...], "forward_s": [[median seconds for B, C]...],
     "sample_s": [[median seconds for B*C rows]...], "date": str, "machine": str}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from specactor.models import resolve_model
from specactor.verifier.kv_cache import KVCache
from specactor.verifier.sampler import SamplingBatch, sample
from specactor.verifier.weights import load_causal_lm


def profile(model, batch_sizes, chunk_lens, context, repeats):
    vocab = model.cfg.vocab_size
    cache = KVCache(model.cfg, max(batch_sizes), context + max(chunk_lens) + 1)
    g = torch.Generator().manual_seed(0)
    forward, sampling = [], []
    for b in batch_sizes:
        cache.lengths = [0] * cache.num_slots
        model(torch.randint(0, vocab, (b * context,), generator=g), [context] * b, cache, torch.tensor([0]))
        f_row, s_row = [], []
        for c in chunk_lens:
            tokens = torch.randint(0, vocab, (b * c,), generator=g)
            times, stimes = [], []
            for r in range(repeats + 1):
                t0 = time.perf_counter()
                logits = model(tokens, [c] * b, cache)
                t1 = time.perf_counter()
                rows = [(1.0, 0, 1.0, i, context + j) for i in range(b) for j in range(c)]
                sample(logits, SamplingBatch.build(rows))
                t2 = time.perf_counter()
                cache.lengths[:b] = [context] * b  # roll back
                if r:  # first run is warm-up
                    times.append(t1 - t0)
                    stimes.append(t2 - t1)
            f_row.append(statistics.median(times))
            s_row.append(statistics.median(stimes))
            print(f"B={b:3d} C={c:2d}: forward {f_row[-1] * 1000:8.1f} ms  sample {s_row[-1] * 1000:6.1f} ms",
                  flush=True)
        forward.append(f_row)
        sampling.append(s_row)
    return forward, sampling


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
    parser.add_argument("--chunk-lens", default="1,2,4,8,16")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cost_profile.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_causal_lm(resolve_model(args.model))
    bs = [int(x) for x in args.batch_sizes.split(",")]
    cs = [int(x) for x in args.chunk_lens.split(",")]
    forward, sampling = profile(model, bs, cs, args.context, args.repeats)
    result = {"model": args.model or "smollm2-135m", "context": args.context, "threads": args.threads,
              "batch_sizes": bs, "chunk_lens": cs, "forward_s": forward, "sample_s": sampling,
              "date": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print()
    print("Median forward ms (ratio to C=1):")
    print(table(result))
