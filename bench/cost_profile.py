"""Cost profile of the target engine: forward time by batch size and chunk length.

    python bench/cost_profile.py [--model smollm2-135m] [--context 128] [--repeats 5]
    python bench/cost_profile.py --shape qwen2.5-7b --device cuda --dtype bfloat16 [--cuda-graphs] --out P.json

A command line over :func:`specactor.engine.profiling.measure` (the engine
measures a quick profile of its own at start-up and caches it; this one is
the full grid, for RESULTS.md or for ``EngineConfig(profile=...)``). ``--shape``
times randomly initialised weights of a named model's shape instead of a
checkpoint (:func:`specactor.bench.model_shapes.random_model`): a forward's
time does not depend on the weights' values, so a GPU profile of a 7B or 32B
target needs no download (``bench/replay_policy.py --profile`` then replays
the policy on it). For each
batch size B and chunk length C, the rows have ``--context`` tokens already in
their KV cache on average (spread over +-25% when B > 1, as a rollout's rows
differ: equal lengths would let decode rows skip the attention mask) and feed C new tokens (C=1 is a decode step, C=k+1 verifies k
draft tokens); logits are computed for all B*C positions, as verification
needs; and, for B > 1, one row feeds C tokens while the others decode, and half
the rows (B // 2) feed C tokens while the others decode. The
weights are packed as the engine packs them. The median over ``--repeats``
timed forwards is saved, together with the sampler's time for B*C rows at
temperature 1. ``--cuda-graphs`` times the steps as the engine runs them on a GPU by default
(padded to its graph buckets and replayed: :mod:`specactor.engine.cuda_graphs`); without it,
eager forwards. On a CPU it times the padded steps uncaptured.

Output (bench/results/cost_profile.json), the format the policy's cost model
fits:
    {"model": str, "context": int, "threads": int, "batch_sizes": [B...],
     "chunk_lens": [C...], "forward_s": [[median seconds for B, C]...],
     "one_row_s": [[median seconds, one row fed C]...],
     "half_rows_s": [[median seconds, B // 2 rows fed C]...],
     "sample_s": [[median seconds for B*C rows]...], "date": str, "machine": str}
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from specactor.bench.model_shapes import SHAPES, random_model
from specactor.config import DTYPES, check_device, torch_dtype
from specactor.engine.model_registry import resolve_model
from specactor.engine.profiling import measure, write_profile
from specactor.engine.weights import load_causal_lm


def positive_ints(text: str) -> list[int]:
    """``--batch-sizes`` and ``--chunk-lens``: comma-separated integers, each at least 1."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, each at least 1")
    return values


def machine(device: str) -> str:
    """The accelerator's name where the profile ran on one (the CPU's is in the profile already)."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else ""


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
    parser.add_argument("--model", default=None, help="registry name or checkpoint folder (default smollm2-135m)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None,
                        help="time random weights of this model's shape instead of a checkpoint")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-sizes", type=positive_ints, default="1,2,4,8,16,32,48,64")
    parser.add_argument("--chunk-lens", type=positive_ints, default="1,2,4,8,17",
                        help="new tokens a row (a verify step feeds window + 1: 17 at the default window)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="time steps padded and replayed as CUDA graphs, as the engine runs them on a GPU")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "cost_profile.json"))
    args = parser.parse_args()
    if args.shape and args.model:
        parser.error("give --model or --shape, not both")
    if args.repeats < 1 or args.context < 0:
        parser.error("--repeats must be at least 1 and --context not negative")
    try:
        check_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    torch.set_num_threads(args.threads)
    dtype = torch_dtype(args.dtype)
    if args.shape:
        model = random_model(args.shape, dtype, args.device)
    else:
        model = load_causal_lm(resolve_model(args.model), dtype=dtype, device=args.device)
    result = measure(model, args.batch_sizes, args.chunk_lens, args.context, args.repeats, sample=True,
                     progress=lambda line: print(line, flush=True), cuda_graphs=args.cuda_graphs)
    result["model"] = args.shape or args.model or "smollm2-135m"
    if args.cuda_graphs:
        result["cuda_graphs"] = True
    if args.shape:
        result["weights"] = "random"
    accelerator = machine(args.device)
    if accelerator:
        result["machine"] = f"{accelerator}; host {result['machine']}"
    write_profile(args.out, result)
    print()
    print("Median forward ms (ratio to C=1):")
    print(table(result))
