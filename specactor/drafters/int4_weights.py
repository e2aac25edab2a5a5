"""A 4-bit weight-only copy of the target on torch's own int4 kernels (``--draft-quant int4w``).

Each Linear's weights are quantised in groups of :data:`GROUP` along the input, asymmetrically
(a scale and a zero a group, gpt-fast's layout), and multiplied by torch's int4 kernels:
``_weight_int4pack_mm_for_cpu`` on a CPU, ``_weight_int4pack_mm`` (tinygemm) on a GPU. A quarter
of bf16's bytes a step: on a GPU, whose small-batch steps are bound by reading the weights, the
cheapest copy torch can make. It is right less often than an 8-bit one (llama.cpp's 4-bit copy of
the default model matched the target on 70-78% of T=1 positions; bench/RESULTS.md, "Drafters").

The packed layout differs between the CPU and the GPU kernels, so the 4-bit values are kept on the
host and packed for the device the first time the layer runs there (again after a move). The GPU
path follows torch's documented packing and has not been run here (no GPU was lent to this work).
"""

from __future__ import annotations

import copy

import torch

#: input features sharing one scale and zero (the kernels take 32, 64, 128 or 256)
GROUP = 32


def _quantize(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] int32 in 0..15, scales_and_zeros [K / group, N, 2]) of float weights ``w`` [N, K]."""
    n, k = w.shape
    grouped = w.reshape(n, k // group, group)
    high, low = grouped.amax(-1, keepdim=True), grouped.amin(-1, keepdim=True)
    scale = (high - low).clamp(min=1e-8) / 15
    q = ((grouped - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = low + 8 * scale  # the kernels compute (q - 8) * scale + zero
    return q, torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous()


def _inner_k_tiles(k: int) -> int:
    return next(t for t in (8, 4, 2) if k % (t * 16) == 0)


class Int4WeightLinear(torch.nn.Module):
    """y = x @ dequantised(int4 weight).T (+ bias), bf16 activations."""

    def __init__(self, linear: torch.nn.Linear, group: int = GROUP) -> None:
        super().__init__()
        n, k = linear.out_features, linear.in_features
        if k % group or k % 32 or n % 8:
            raise ValueError(f"int4 weights need in_features divisible by {max(group, 32)} and out_features by 8 "
                             f"(got {k} -> {n})")
        q, scales_and_zeros = _quantize(linear.weight.detach().float(), group)
        self.q = q  # host copy of the 4-bit values (packed per device on first use)
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(torch.bfloat16))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))
        self.in_features, self.out_features, self.group = k, n, group
        self._packed: torch.Tensor | None = None

    def _pack(self, device: torch.device) -> torch.Tensor:
        if self._packed is None or self._packed.device != device:
            if device.type == "cuda":
                pairs = (self.q[:, ::2] << 4 | self.q[:, 1::2]).to(torch.uint8).to(device)
                self._packed = torch._convert_weight_to_int4pack(pairs, _inner_k_tiles(self.in_features))
            else:
                self._packed = torch._convert_weight_to_int4pack_for_cpu(self.q.to(device), 1)
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        packed = self._pack(x2.device)
        sz = self.scales_and_zeros.to(x2.device)
        if x2.device.type == "cuda":
            y = torch._weight_int4pack_mm(x2, packed, self.group, sz)
        else:
            y = torch._weight_int4pack_mm_for_cpu(x2, packed, self.group, sz)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)


def quantize_int4_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A bf16 copy of ``model`` whose Linear layers hold 4-bit weights (``quant="int4w"``); the
    embedding, norms, activations and KV cache are bf16."""
    quantized = copy.deepcopy(model)
    for module in list(quantized.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Int4WeightLinear(child))
    quantized = quantized.to(torch.bfloat16).eval()
    probe = torch.zeros(1, model.cfg.hidden_size, dtype=torch.bfloat16)  # a torch without the kernel fails here
    quantized.layers[0].qkv(probe)
    return quantized
