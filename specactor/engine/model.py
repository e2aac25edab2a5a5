"""A compact Llama / Qwen2 forward over a ragged batch with a slot KV cache.

One call processes, for B requests in slots ``0..B-1``, a chunk of new tokens
each: the whole prompt at prefill, 1 token at decode, k+1 at verification.
Tokens of all requests are packed into one flat ``[T]`` sequence for the
matmuls (no padding waste); only attention sees a padded ``[B, Lq]`` layout.
Logits are computed only for the positions asked for, since the LM head is the
single largest matmul of a small model.

Weights keep the Hugging Face names on load (``load_hf_state_dict``) and are
fused on the fly: q/k/v into one projection, gate/up into another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from specactor.engine.config import ModelConfig, rope_inv_freq
from specactor.engine.kv_cache import KVCache
from specactor.engine.prepacked_linear import PackedLinear, packing_available


#: Attention kernels a step may use. Not cuDNN's: on Hopper torch prefers it for bfloat16, and it
#: builds a graph for every new shape, while a decode step's key length grows by one every step:
#: a 135M model's bf16 step took 55 ms on an H200 against 15 ms in float32. The CPU's own choices (flash or math) are both in the list.
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class AttentionPart:
    """Rows whose queries attend together, padded to the longest chunk among them."""

    rows: torch.Tensor | None  # [Bp] batch rows of the part (None: all rows, in order)
    tokens: torch.Tensor | None  # [Tp] flat indices of the tokens whose output it gives (None: all)
    q_rows: torch.Tensor  # [Tp] row of each of those tokens within the part
    q_offsets: torch.Tensor  # [Tp] index of each within its row's padded queries
    mask: torch.Tensor | None  # [Bp, 1, G*Lq, Lk] bool, None if no masking needed
    max_q: int
    #: every row feeds exactly max_q tokens, rows in order (a padded step, specactor.engine.cuda_graphs):
    #: the flat queries are already the padded layout, so attention neither pads nor gathers them
    dense: bool = False


#: What a drafting row costs in an attention part of its own, in padded query positions of a one-part
#: step: the part is used where it saves more padding (``batch * (longest chunk - 1)``) than its rows
#: cost. On a 2-core CPU at batch 32, 16 rows drafting one token each
#: took 112 ms apart and 90 ms padded; one row drafting four, 76 ms apart and 94 ms padded; this
#: weight picks the faster layout in all nine cases measured there.
PART_ROW_COST = 10


@dataclass
class StepLayout:
    """Index tensors describing one ragged step, shared by every layer."""

    q_lens: list[int]
    starts: list[int]
    positions: torch.Tensor  # [T] RoPE position of each new token (its depth, for a token tree)
    slots: torch.Tensor  # [T] KV cache index of each new token (start + offset)
    rows: torch.Tensor  # [T] batch row (= slot) of each new token
    offsets: torch.Tensor  # [T] index of each token within its row's chunk
    parts: list[AttentionPart]
    max_q: int
    max_k: int

    @classmethod
    def build(cls, q_lens: list[int], starts: list[int], group: int, device: torch.device,
              parents: list[list[int] | None] | None = None) -> "StepLayout":
        """``parents[b]``, when given, makes row b's chunk a token tree: token i
        follows token ``parents[b][i]`` of the same chunk (-1: the cached context),
        so it sits at position start + depth and attends to its ancestors only.

        Attention pads every row's queries to the longest chunk. When only a few
        rows verify drafts, that would make every decode row pay for the longest
        draft, so those few rows get a part of their own (see :meth:`CausalLM._attention`),
        where the padding it saves outweighs the part's own cost (:data:`PART_ROW_COST`).
        """
        b = len(q_lens)
        q = torch.tensor(q_lens, device=device)
        s = torch.tensor(starts, device=device)
        rows = torch.repeat_interleave(torch.arange(b, device=device), q)
        first = torch.cumsum(q, 0) - q
        offsets = torch.arange(int(q.sum()), device=device) - first[rows]
        slots = s[rows] + offsets
        max_q, max_k = max(q_lens), max(a + c for a, c in zip(starts, q_lens))
        trees = parents is not None and any(t is not None for t in parents)
        positions = slots
        if trees:
            assert parents is not None
            depths = []
            for row, tree in enumerate(parents):
                depths.extend(range(q_lens[row]) if tree is None else _ancestry(tree).sum(1).sub(1).tolist())
            positions = s[rows] + torch.tensor(depths, device=device)
        multi = [i for i, n in enumerate(q_lens) if n > 1 or (parents is not None and parents[i] is not None)]
        if max_q > 1 and 2 * len(multi) <= b and PART_ROW_COST * len(multi) < b * (max_q - 1):
            # every row's first token together (one query each), then the drafting rows padded among themselves
            decode = AttentionPart(None, first, torch.arange(b, device=device), torch.zeros(b, dtype=torch.long,
                                   device=device), _mask(starts, [1] * b, None, group, max_k, device), 1)
            picked = torch.tensor(multi, device=device)
            local = torch.repeat_interleave(torch.arange(len(multi), device=device), q[picked])
            tokens = torch.cat([first[i] + torch.arange(q_lens[i], device=device) for i in multi])
            sub_parents = None if parents is None else [parents[i] for i in multi]
            drafting = AttentionPart(picked, tokens, local, offsets[tokens],
                                     _mask([starts[i] for i in multi], [q_lens[i] for i in multi], sub_parents,
                                           group, max_k, device), max(q_lens[i] for i in multi))
            parts = [decode, drafting]
        else:
            need_mask = not (max_q == 1 and all(a == starts[0] for a in starts)) or trees
            mask = _mask(starts, q_lens, parents, group, max_k, device) if need_mask else None
            parts = [AttentionPart(None, None, rows, offsets, mask, max_q)]
        return cls(q_lens, starts, positions, slots, rows, offsets, parts, max_q, max_k)


def _mask(starts: list[int], q_lens: list[int], parents: list[list[int] | None] | None, group: int, max_k: int,
          device: torch.device) -> torch.Tensor:
    """[B, 1, G*Lq, Lk] bool: query i of row b (at start + i, or in a token tree) may see key j."""
    b, max_q = len(q_lens), max(q_lens)
    s = torch.tensor(starts, device=device)
    key_pos = torch.arange(max_k, device=device)
    query_pos = s[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, Lq]
    allowed = key_pos[None, None, :] <= query_pos[:, :, None]  # [B, Lq, Lk]
    for row, tree in enumerate(parents or []):
        if tree is not None:
            n, start = len(tree), starts[row]
            # [q, q] bool: j is i or an ancestor of i
            allowed[row, :n, start:start + n] = _ancestry(tree).to(allowed.device)
    return allowed[:, None, None].expand(b, 1, group, max_q, max_k).reshape(b, 1, group * max_q, max_k)


def _ancestry(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: entry (i, j) says token j is token i or one of its ancestors."""
    n = len(parents)
    out = torch.zeros(n, n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"token {i} of a tree has parent {parent}: parents must come first")
        if parent >= 0:
            out[i] = out[parent]
        out[i, i] = True
    return out


class Layer(torch.nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.eps = cfg.rms_norm_eps
        qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * hd
        self.input_norm = torch.nn.Parameter(torch.ones(d), requires_grad=False)
        self.qkv = torch.nn.Linear(d, qkv_rows, bias=cfg.attention_bias)
        self.o = torch.nn.Linear(cfg.num_heads * hd, d, bias=False)
        self.post_norm = torch.nn.Parameter(torch.ones(d), requires_grad=False)
        self.gate_up = torch.nn.Linear(d, 2 * cfg.intermediate_size, bias=False)
        self.down = torch.nn.Linear(cfg.intermediate_size, d, bias=False)


def _load_linear(linear: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    if isinstance(linear, PackedLinear):
        linear.load(weight, bias)
        return
    linear.weight.copy_(weight)
    if bias is not None:
        linear.bias.copy_(bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As in transformers: normalise in float32, scale in the input dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, 1, D] (the rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face weight name a model of ``cfg`` reads, with its shape (``lm_head.weight``
    included even when tied: checkpoints often carry it). Known from the config alone, so a
    weight update can be checked before any model or buffer exists."""
    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, d),
                                          "model.norm.weight": (d,), "lm_head.weight": (cfg.vocab_size, d)}
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        shapes.update({pre + "input_layernorm.weight": (d,), pre + "post_attention_layernorm.weight": (d,),
                       pre + "self_attn.q_proj.weight": (q, d), pre + "self_attn.k_proj.weight": (kv, d),
                       pre + "self_attn.v_proj.weight": (kv, d), pre + "self_attn.o_proj.weight": (d, q),
                       pre + "mlp.gate_proj.weight": (inter, d), pre + "mlp.up_proj.weight": (inter, d),
                       pre + "mlp.down_proj.weight": (d, inter)})
        if cfg.attention_bias:
            shapes.update({pre + "self_attn.q_proj.bias": (q,), pre + "self_attn.k_proj.bias": (kv,),
                           pre + "self_attn.v_proj.bias": (kv,)})
    return shapes


class CausalLM(torch.nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = torch.nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = torch.nn.Parameter(torch.ones(cfg.hidden_size), requires_grad=False)
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.requires_grad_(False)
        self._rope_len = 0
        self._cos = self._sin = torch.empty(0)

    # ------------------------------------------------------------------ weights

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every Hugging Face weight name :meth:`load_hf_state_dict` reads, with its shape."""
        return hf_shapes(self.cfg)

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face-named weights (fusing q/k/v and gate/up)."""
        cfg = self.cfg

        def take(name: str) -> torch.Tensor:
            if name not in sd:
                raise KeyError(f"weight {name!r} missing from the checkpoint")
            return sd[name]

        dtype = self.embed.weight.dtype
        with torch.no_grad():
            self.embed.weight.copy_(take("model.embed_tokens.weight").to(dtype))
            for i, layer in enumerate(self.layers):
                pre = f"model.layers.{i}."
                layer.input_norm.copy_(take(pre + "input_layernorm.weight"))
                layer.post_norm.copy_(take(pre + "post_attention_layernorm.weight"))
                qkv_bias = torch.cat([take(pre + f"self_attn.{n}_proj.bias") for n in "qkv"]) \
                    if cfg.attention_bias else None
                _load_linear(layer.qkv, torch.cat([take(pre + f"self_attn.{n}_proj.weight") for n in "qkv"]),
                             qkv_bias)
                _load_linear(layer.o, take(pre + "self_attn.o_proj.weight"))
                _load_linear(layer.gate_up, torch.cat([take(pre + "mlp.gate_proj.weight"),
                                                       take(pre + "mlp.up_proj.weight")]))
                _load_linear(layer.down, take(pre + "mlp.down_proj.weight"))
            self.norm.copy_(take("model.norm.weight"))
            if not cfg.tie_word_embeddings:
                _load_linear(self.lm_head, take("lm_head.weight"))
            elif isinstance(self.lm_head, PackedLinear):  # packing untied the head: repack the new embedding
                self.lm_head.load(self.embed.weight)

    def pack(self) -> bool:
        """Prepack every linear layer for oneDNN where that works (CPU, float32; see
        :mod:`specactor.engine.prepacked_linear`); returns whether the model is packed. Inference only:
        only the packed copies are kept, and weight updates repack them."""
        if isinstance(self.lm_head, PackedLinear):
            return True
        if not packing_available(self.embed.weight):
            return False
        for layer in self.layers:
            for name in ("qkv", "o", "gate_up", "down"):
                setattr(layer, name, PackedLinear.from_linear(getattr(layer, name)))
        self.lm_head = PackedLinear.from_linear(self.lm_head)
        return True

    # ------------------------------------------------------------------ forward

    def _rope(self, positions: torch.Tensor, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        if max_pos > self._rope_len:
            n = max(max_pos, 2 * self._rope_len, 1024)
            inv_freq = rope_inv_freq(self.cfg).to(positions.device)
            freqs = torch.outer(torch.arange(n, device=positions.device).float(), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            dtype = self.embed.weight.dtype
            self._cos, self._sin = emb.cos().to(dtype), emb.sin().to(dtype)
            self._rope_len = n
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        q_lens: list[int],
        cache: KVCache,
        logit_index: torch.Tensor | None = None,
        parents: list[list[int] | None] | None = None,
    ) -> torch.Tensor:
        """Run one ragged step for slots ``0..len(q_lens)-1`` and extend the cache.

        ``tokens`` holds the new tokens of every row back to back; row b's
        chunk starts at position ``cache.lengths[b]``. Returns logits for the
        flat positions in ``logit_index`` (all positions if None), as float32.
        ``parents`` turns rows into token trees (see :meth:`StepLayout.build`);
        the cache then holds every node, and the caller compacts the path it keeps.
        """
        cfg = self.cfg
        b = len(q_lens)
        if tokens.shape[0] != sum(q_lens) or min(q_lens) < 1:
            raise ValueError(f"{tokens.shape[0]} tokens given for chunks {q_lens} (each >= 1, summing to the count)")
        starts = cache.lengths[:b]
        if max(a + c for a, c in zip(starts, q_lens)) > cache.max_len:
            raise ValueError(f"a request would exceed the KV cache length {cache.max_len}")
        group = cfg.num_heads // cfg.num_kv_heads
        layout = StepLayout.build(q_lens, starts, group, tokens.device, parents)
        cos, sin = self._rope(layout.positions, layout.max_k)
        x = self.embed(tokens)
        with sdpa_kernel(ATTENTION_BACKENDS):
            x = self._layers(x, cache, layout, cos, sin, group)
        for row, (start, n) in enumerate(zip(starts, q_lens)):
            cache.lengths[row] = start + n
        if logit_index is not None:
            x = x[logit_index]
        return self.lm_head(rms_norm(x, self.norm, cfg.rms_norm_eps)).float()

    def _layers(self, x: torch.Tensor, cache: KVCache, layout: StepLayout, cos: torch.Tensor, sin: torch.Tensor,
                group: int) -> torch.Tensor:
        """The decoder layers over the step's hidden states ``x`` [T, d], writing their keys and values."""
        cfg, b, t = self.cfg, len(layout.q_lens), x.shape[0]
        hq, hkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        for li, layer in enumerate(self.layers):
            h = rms_norm(x, layer.input_norm, layer.eps)
            qkv = layer.qkv(h)
            if x.is_cuda:  # q and k rotated in one call: 5 kernels fewer a layer, where a step is kernel-bound
                qk = apply_rope(qkv[:, : (hq + hkv) * hd].view(t, hq + hkv, hd), cos, sin)
                q, k = qk[:, :hq], qk[:, hq:]
            else:  # contiguous q and k (a CPU step with their strided views measured 0-10% slower)
                q = apply_rope(qkv[:, : hq * hd].view(t, hq, hd), cos, sin)
                k = apply_rope(qkv[:, hq * hd : (hq + hkv) * hd].view(t, hkv, hd), cos, sin)
            v = qkv[:, (hq + hkv) * hd :].view(t, hkv, hd)
            cache.k[li, layout.rows, :, layout.slots] = k
            cache.v[li, layout.rows, :, layout.slots] = v
            attn = self._attention(q, cache.k[li, :b, :, : layout.max_k], cache.v[li, :b, :, : layout.max_k],
                                   layout, group)
            x = x + layer.o(attn)
            h = rms_norm(x, layer.post_norm, layer.eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return x

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: StepLayout,
                   group: int) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [B, Hkv, Lk, D] -> [T, Hq*D], part by part (see StepLayout)."""
        if len(layout.parts) == 1:
            part = layout.parts[0]
            return _sdpa(q, k, v, part, k.shape[0], group)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        for part in layout.parts:
            assert part.tokens is not None
            pk, pv = (k, v) if part.rows is None else (k.index_select(0, part.rows), v.index_select(0, part.rows))
            out[part.tokens] = _sdpa(q[part.tokens], pk, pv, part, pk.shape[0], group)
        return out


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, part: AttentionPart, b: int,
          group: int) -> torch.Tensor:
    """Grouped-query attention of one part without repeating K/V: the ``group``
    query heads sharing a KV head are folded into the query-length axis.
    q: [Tp, Hq, D] (the part's tokens); k, v: [Bp, Hkv, Lk, D] -> [Tp, Hq*D]."""
    _, hkv, _, hd = k.shape
    lq = part.max_q
    dense = lq == 1 or part.dense
    if dense:
        padded = q.view(b, lq, hkv, group, hd)
    else:
        padded = q.new_zeros(b, lq, hkv * group, hd)
        padded[part.q_rows, part.q_offsets] = q
        padded = padded.view(b, lq, hkv, group, hd)
    folded = padded.permute(0, 2, 3, 1, 4).reshape(b, hkv, group * lq, hd)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=part.mask)
    out = out.view(b, hkv, group, lq, hd).permute(0, 3, 1, 2, 4).reshape(b, lq, hkv * group * hd)
    if dense:
        return out.view(b * lq, -1)
    return out[part.q_rows, part.q_offsets]
