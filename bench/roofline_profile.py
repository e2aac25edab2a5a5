"""A cost profile for hardware this machine does not have, from a roofline: what the policy's
decisions and the replayed ceilings would be on a GPU.

    python bench/roofline_profile.py --preset h100-qwen2.5-7b --out PROFILE.json
    python bench/replay_policy.py ROLLOUT.jsonl --profile PROFILE.json --policies plain,geometric,clairvoyant

A verify step of ``b`` rows fed ``c`` tokens each costs a fixed overhead (scheduling, kernel
launches) plus the longer of reading the weights and the KV cache once (memory) and the step's
matmul and attention FLOPs (compute), each at an achieved share of the device's peak. That is the
shape the SpecActor paper builds on: at small batch a step is memory-bound and extra draft tokens
are nearly free; at large batch the FLOPs of every draft token count. The figures are a model,
not a measurement: a real profile (``bench/cost_profile.py`` on the device) replaces it. The
drafters' costs stay the cost model's CPU ones (ngram and suffix run on the host either way).
The model is :mod:`specactor.bench.roofline`; this script is its command line.

Hardware and model figures are public specifications (H100 SXM: 3.35 TB/s HBM3, 989 dense bf16
TFLOPS; the models' configs, :mod:`specactor.bench.model_shapes`, which ``bench/cost_profile.py
--shape`` builds too); the efficiencies and the overhead are assumptions, printed with the profile
and settable.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specactor.bench.roofline import BATCH_SIZES, CHUNK_LENS, PRESETS, profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", default="h100-qwen2.5-7b", choices=sorted(PRESETS),
                        help="device and model shape")
    parser.add_argument("--context", type=int, default=512, help="tokens of context a row holds")
    parser.add_argument("--bandwidth-share", type=float, default=0.8, help="achieved share of peak bandwidth")
    parser.add_argument("--flops-share", type=float, default=0.6, help="achieved share of peak FLOPs")
    parser.add_argument("--overhead-ms", type=float, default=1.5, help="fixed cost of a step (scheduling, launches)")
    parser.add_argument("--out", type=Path, required=True, help="where the profile JSON goes")
    args = parser.parse_args(argv)
    for name in ("bandwidth_share", "flops_share"):
        if not 0 < getattr(args, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} must be in (0, 1]")
    if args.context < 1 or args.overhead_ms < 0:
        parser.error("--context must be positive and --overhead-ms not negative")
    data = profile(*PRESETS[args.preset], args.context, args.bandwidth_share, args.flops_share, args.overhead_ms)
    args.out.write_text(json.dumps(data, indent=1))
    decode = data["forward_s"]
    for i, b in enumerate(BATCH_SIZES):
        ratios = ", ".join(f"{c} tokens {decode[i][j] / decode[i][0]:.2f}x" for j, c in enumerate(CHUNK_LENS) if c > 1)
        print(f"batch {b:2d}: decode step {decode[i][0] * 1e3:6.2f} ms; a row fed {ratios}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
