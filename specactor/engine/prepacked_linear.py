"""Linear layers with weights prepacked once for oneDNN (CPU, float32 inference).

Why: MKL's ``sgemm`` repacks the weight matrix on every call. A decode step
feeds each matrix one row per request and a verify step a few more, so the
repacking is a large share of the work: on a 2-core AVX2 machine the default
model's gate/up projection takes 0.35 ms for 1 row and 0.78 ms for 5, and
verifying 4 drafted tokens at batch 1 costs 1.9x a decode step, which leaves
speculation nothing to gain. Packed once (what torch.compile's CPU "freezing"
does), the same projection takes 0.18 ms for 1 row and 0.31 ms for 5.
With the batch-size hint used here, each row's result is also independent of
how many rows are fed with it (measured: bit-identical from 1 to 1000 rows),
which is what lossless speculation wants.

Only the packed copy is kept: :meth:`PackedLinear.load` repacks from a new
dense weight (weight updates), and :meth:`PackedLinear.dense` rebuilds it.
"""

from __future__ import annotations

import torch

#: Rows the packing is tuned for: decode and verify steps feed a few to a few dozen per matrix.
PACK_ROWS_HINT = 16


def packing_available(weight: torch.Tensor) -> bool:
    """True where oneDNN can prepack ``weight``: a CPU float32 tensor on a torch built with it."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(torch.nn.Module):
    """``y = x @ W.T + b`` with ``W`` held in oneDNN's blocked layout (inference only)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.empty(0)
        self.bias = None if bias is None else bias.detach().clone()
        self.load(weight)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "PackedLinear":
        return cls(linear.weight.detach(), linear.bias)

    def load(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Repack from a dense ``[out, in]`` weight (and bias, if the layer has one)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {tuple(weight.shape)} for a packed linear of "
                             f"{(self.out_features, self.in_features)}")
        dense = weight.detach().to(torch.float32).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(dense, PACK_ROWS_HINT)
        if bias is not None and self.bias is not None:
            self.bias = bias.detach().to(torch.float32).clone()

    def dense(self) -> torch.Tensor:
        """The weight as a plain ``[out, in]`` tensor (rebuilt: for inspection and tests)."""
        eye = torch.eye(self.in_features)
        return torch.ops.mkldnn._linear_pointwise(eye, self.packed, None, "none", [], "").t().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed, self.bias, "none",
                                                 [], "")
        return out.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
