"""Preallocated per-request slot KV cache.

One tensor per K and V for all layers: ``[layers, slots, kv_heads, max_len,
head_dim]``. A request owns a slot; its length is how many positions are
valid, so rolling back rejected draft tokens is just lowering the length.
Nothing is reallocated or concatenated per step, and memory is fixed up front.

Active requests always occupy slots ``0..B-1`` (see :meth:`move`), so the
attention kernel reads ``k[layer, :B, :, :Lk]``, a strided view, with no gather.
"""

from __future__ import annotations

import torch

from specactor.engine.config import ModelConfig


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots < 1 or max_len < 2:
            raise ValueError(f"KV cache needs >= 1 slot and max_len >= 2 (got {num_slots}, {max_len})")
        shape = (cfg.num_layers, num_slots, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_len = max_len
        self.lengths = [0] * num_slots

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @staticmethod
    def bytes_needed(cfg: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype = torch.float32) -> int:
        per = torch.finfo(dtype).bits // 8
        return 2 * cfg.num_layers * num_slots * cfg.num_kv_heads * max_len * cfg.head_dim * per

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src`` (its valid prefix) into ``dst``; used to keep slots compact."""
        n = self.lengths[src]
        if src != dst and n:
            self.k[:, dst, :, :n] = self.k[:, src, :, :n]
            self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n
        self.lengths[src] = 0

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Give slot ``dst`` the first ``n`` positions of slot ``src`` (a prompt both share), and
        that length; ``src`` keeps its own."""
        if not 0 < n <= self.lengths[src]:
            raise ValueError(f"slot {src} holds {self.lengths[src]} positions, cannot share {n}")
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n

    def keep_path(self, slot: int, start: int, offsets: list[int]) -> None:
        """After a token-tree step: keep the root at ``start`` and the accepted
        nodes (chunk ``offsets``, in path order) right after it, drop the rest."""
        n = len(offsets)
        if offsets != list(range(1, n + 1)):  # the first draft's chain is already in place
            src = torch.tensor([start + o for o in offsets], device=self.k.device)
            self.k[:, slot, :, start + 1 : start + 1 + n] = self.k[:, slot, :, src]
            self.v[:, slot, :, start + 1 : start + 1 + n] = self.v[:, slot, :, src]
        self.lengths[slot] = start + 1 + n
