"""A roofline cost profile: what an engine step would cost on hardware this machine does not
have (``bench/roofline_profile.py`` is its command line).

A verify step of ``b`` rows fed ``c`` tokens each costs a fixed overhead (scheduling, kernel
launches) plus the longer of reading the weights and the KV cache once (memory) and the step's
matmul and attention FLOPs (compute), each at an achieved share of the device's peak. That is the
shape the SpecActor paper builds on: at small batch a step is memory-bound and extra draft tokens
are nearly free; at large batch the FLOPs of every draft token count. The figures are a model,
not a measurement: a real profile (``bench/cost_profile.py`` on the device) replaces it.

Hardware and model figures are public specifications (H100 SXM: 3.35 TB/s HBM3, 989 dense bf16
TFLOPS; the models' configs, :mod:`specactor.bench.model_shapes`); the efficiencies and the
overhead are assumptions, recorded in the profile. No torch here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date

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
