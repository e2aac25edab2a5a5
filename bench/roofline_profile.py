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

Hardware and model figures are public specifications (H100 SXM: 3.35 TB/s HBM3, 989 dense bf16
TFLOPS; the models' configs, :mod:`specactor.bench.model_shapes`, which ``bench/cost_profile.py
--shape`` builds too); the efficiencies and the overhead are assumptions, printed with the profile
and settable.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

from specactor.bench.model_shapes import SHAPES, ModelShape, model_shape


@dataclass(frozen=True)
class Device:
    bandwidth_tb_s: float  # peak memory bandwidth
    tflops: float  # peak dense bf16 matmul throughput


DEVICES = {"h100": Device(3.35, 989.0), "a100": Device(2.04, 312.0)}
MODELS = {name: model_shape(name) for name in SHAPES}
PRESETS = {f"{d}-{m}": (d, m) for d in DEVICES for m in MODELS}
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64]
CHUNK_LENS = [1, 2, 4, 8, 9, 16, 17]


def step_s(device: Device, model: ModelShape, rows: int, tokens: int, context: int, *, bandwidth_share: float,
           flops_share: float, overhead_s: float) -> float:
    """Seconds of one forward over ``rows`` sequences of ``context`` tokens that feeds ``tokens`` new ones."""
    kv_bytes = 2 * model.layers * model.kv_dim * model.bytes_per_param * rows * context  # K and V, every row
    memory_s = (model.params_b * 1e9 * model.bytes_per_param + kv_bytes) / (device.bandwidth_tb_s * 1e12 * bandwidth_share)
    flops = tokens * (2 * model.params_b * 1e9 + 4 * context * model.q_dim * model.layers)
    compute_s = flops / (device.tflops * 1e12 * flops_share)
    return overhead_s + max(memory_s, compute_s)


def profile(device_name: str, model_name: str, context: int, bandwidth_share: float, flops_share: float,
            overhead_ms: float) -> dict:
    """The profile in ``bench/cost_profile.py``'s format: every row fed the chunk, and one row fed it."""
    device, model = DEVICES[device_name], MODELS[model_name]
    opts = dict(bandwidth_share=bandwidth_share, flops_share=flops_share, overhead_s=overhead_ms / 1e3)
    forward = [[step_s(device, model, b, b * c, context, **opts) for c in CHUNK_LENS] for b in BATCH_SIZES]
    one_row = [[step_s(device, model, b, b - 1 + c, context, **opts) for c in CHUNK_LENS] for b in BATCH_SIZES]
    return {"model": model_name, "context": context, "batch_sizes": BATCH_SIZES, "chunk_lens": CHUNK_LENS,
            "forward_s": forward, "one_row_s": one_row, "backend": "roofline", "device": f"{device_name} (modelled)",
            "date": date.today().isoformat(),
            "roofline": {"device": asdict(device), "model": asdict(model), "bandwidth_share": bandwidth_share,
                         "flops_share": flops_share, "overhead_ms": overhead_ms}}


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
