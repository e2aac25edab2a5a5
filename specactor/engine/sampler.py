"""Position-keyed sampling: the random choice depends only on (seed, t, token).

Gumbel-max: ``token = argmax(logits / T + g)`` where ``g[v] = -log(-log(u[v]))``
and ``u[v]`` is a counter-based hash of (request seed, output position t,
token v). Because the noise is a pure function of those three numbers, the
token sampled at position t is the same whether it is decoded alone, in a
batch, or inside a k-token verification chunk. This is what makes speculative
decoding token-identical to autoregressive decoding at any temperature, and
it lets a draft model sample with the *same* noise as the target.

temperature 0 is greedy (argmax, first index on ties). top-k and top-p mask
tokens out before the argmax. Log-probs are ``log_softmax(logits / T)`` of the
chosen token *before* truncation (``T = 1`` for greedy rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding uint32 values.

    Products may wrap around int64; masking keeps the low 32 bits, which are
    what the uint32 arithmetic would give.
    """
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def _fmix32_i32(x: torch.Tensor) -> torch.Tensor:
    """The same finaliser on int32 tensors (bit-identical, ~5x faster).

    int32 products wrap like uint32 ones; right shifts are masked to be logical.
    """
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * -2048144789  # 0x85EBCA6B as a signed int32
    x = x ^ ((x >> 13) & 0x7FFFF)
    x = x * -1028477387  # 0xC2B2AE35 as a signed int32
    return x ^ ((x >> 16) & 0xFFFF)


def _as_i32(x: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the same bits as int32."""
    return (x - ((x >> 31) & 1) * (1 << 32)).to(torch.int32)


_token_keys: dict[tuple[int, str], torch.Tensor] = {}


def _token_key(vocab: int, device: torch.device) -> torch.Tensor:
    key = (vocab, str(device))
    if key not in _token_keys:
        ids = torch.arange(vocab, dtype=torch.int64, device=device)
        _token_keys[key] = _as_i32(_fmix32((ids * 0x9E3779B1 + 0x7F4A7C15) & _M32))
    return _token_keys[key]


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per (seed, position); seeds may use all 63 bits."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    k = _fmix32(lo ^ _fmix32(hi ^ 0x2545F491))
    return _fmix32(k ^ _fmix32((positions * 0x27D4EB2F + 0x165667B1) & _M32))


#: The largest uniform: float32 rounds the top 24-bit value's ``(2**24 - 1 + 0.5) / 2**24`` up to
#: exactly 1.0, whose Gumbel value ``-log(-log(1))`` is +inf: that token would win the argmax
#: whatever its probability (and a truncated one, at -inf, would give NaN, which argmax also
#: picks) at ~0.3% of sampled positions over a 49k vocabulary. Clamped to the largest float32
#: below 1, which changes only that one value (its neighbour rounds to 1 - 2**-23).
U_MAX = 1.0 - 2.0 ** -24


def _uniforms_(bits: torch.Tensor) -> torch.Tensor:
    """Hashed int32 ``bits`` (overwritten) -> float32 uniforms in (0, 1): their top 24 bits,
    centred, clamped at U_MAX. The one place the noise's uniforms are made."""
    u = bits.bitwise_right_shift_(8).bitwise_and_(0xFFFFFF).float()
    return u.add_(0.5).mul_(1.0 / (1 << 24)).clamp_max_(U_MAX)


def _gumbel_rows(keys: torch.Tensor, token_key: torch.Tensor) -> torch.Tensor:
    """Gumbel noise [len(keys), V] from int32 row keys, computed in place; always finite.

    Bit-for-bit the finaliser of ``_fmix32_i32`` on ``keys ^ token_key``, then
    24-bit uniforms in (0, 1), then ``-log(-log(u))``; in place so that a block of rows
    stays in cache instead of streaming several full-vocabulary temporaries.
    """
    x = keys[:, None] ^ token_key[None, :]
    t = torch.empty_like(x)
    for shift, mask, mult in ((16, 0xFFFF, -2048144789), (13, 0x7FFFF, -1028477387), (16, 0xFFFF, None)):
        torch.bitwise_right_shift(x, shift, out=t)
        x.bitwise_xor_(t.bitwise_and_(mask))
        if mult is not None:
            x.mul_(mult)
    return _uniforms_(x).log_().neg_().log_().neg_()


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, vocab] uniforms in (0, 1), a pure function of (seed, position, token)."""
    keys = _as_i32(row_keys(seeds, positions))
    return _uniforms_(_fmix32_i32(keys[:, None] ^ _token_key(vocab, seeds.device)[None, :]))


def token_uniforms(seeds: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R] the uniform of one token per row: ``uniform_noise(seeds, positions, vocab)[r, tokens[r]]``
    without the full-vocabulary row (what a draft token's own noise says of its chances)."""
    keys = _as_i32(row_keys(seeds, positions))
    return _uniforms_(_fmix32_i32(keys ^ _token_key(vocab, seeds.device)[tokens]))


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, vocab] Gumbel noise, a pure function of (seed, position, token)."""
    return _gumbel_rows(_as_i32(row_keys(seeds, positions)), _token_key(vocab, seeds.device))


@dataclass
class SamplingBatch:
    """Per-row sampling parameters as tensors (one row per sampled position)."""

    temperature: torch.Tensor  # [R] float32, 0 = greedy
    top_k: torch.Tensor  # [R] int64, 0 = off
    top_p: torch.Tensor  # [R] float32, 1 = off
    seeds: torch.Tensor  # [R] int64
    positions: torch.Tensor  # [R] int64, output position t of the token
    #: what the host already knows, so that :func:`sample` need not ask the device (each question
    #: is a synchronisation; on a GPU they cost more than the sampling): which rows are greedy, and
    #: whether any row truncates (top-k or top-p). None: unknown, asked of the tensors.
    greedy_rows: tuple[bool, ...] | None = None
    truncates: bool | None = None

    @classmethod
    def build(cls, rows: list[tuple[float, int, float, int, int]], device: torch.device | str = "cpu") -> "SamplingBatch":
        """rows: (temperature, top_k, top_p, seed, position) per row."""
        if not rows:
            empty = torch.empty(0)
            return cls(empty, empty.long(), empty, empty.long(), empty.long(), (), False)
        t, k, p, s, pos = zip(*rows)
        return cls(
            torch.tensor(t, dtype=torch.float32, device=device),
            torch.tensor(k, dtype=torch.int64, device=device),
            torch.tensor(p, dtype=torch.float32, device=device),
            torch.tensor(s, dtype=torch.int64, device=device),
            torch.tensor(pos, dtype=torch.int64, device=device),
            tuple(temp <= 0 for temp in t),
            any(top_k > 0 for top_k in k) or any(top_p < 1.0 for top_p in p),
        )


def truncation_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor | None:
    """Bool [R, V] of tokens removed by top-k / top-p (None if no row truncates)."""
    use_k = top_k > 0
    use_p = top_p < 1.0
    if not bool(use_k.any() or use_p.any()):
        return None
    vocab = scaled.shape[-1]
    rows = torch.nonzero(use_k | use_p).squeeze(1)
    if rows.numel() < scaled.shape[0]:
        removed = torch.zeros_like(scaled, dtype=torch.bool)
        removed[rows] = truncation_mask(scaled[rows], top_k[rows], top_p[rows])  # type: ignore[assignment]
        return removed
    sorted_vals, order = torch.sort(scaled, dim=-1, descending=True)
    rank_removed = torch.zeros_like(sorted_vals, dtype=torch.bool)
    if bool(use_k.any()):
        k = torch.where(use_k, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        rank_removed |= torch.arange(vocab, device=scaled.device)[None, :] >= k[:, None]
    if bool(use_p.any()):
        probs = torch.softmax(sorted_vals.masked_fill(rank_removed, float("-inf")), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each rank
        rank_removed |= (before >= top_p[:, None]) & use_p[:, None]
    removed = torch.empty_like(rank_removed)
    removed.scatter_(1, order, rank_removed)
    return removed


#: Rows sampled together on a CPU, where a block's [rows, vocab] temporaries stay in cache. A GPU
#: samples all rows at once: there every block is a few dozen more kernel launches.
BLOCK_ROWS = 8


def sample(logits: torch.Tensor, params: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens [R] int64, logprobs [R] float32)."""
    logits = logits.float()
    rows, vocab = logits.shape
    greedy = params.temperature <= 0
    temp = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    keys = _as_i32(row_keys(params.seeds, params.positions))
    token_key = _token_key(vocab, logits.device)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    block = BLOCK_ROWS if logits.device.type == "cpu" else max(rows, 1)
    for lo in range(0, rows, block):
        hi = min(rows, lo + block)
        scores = logits[lo:hi] / temp[lo:hi, None]
        log_norm = torch.logsumexp(scores, dim=-1)
        removed = truncation_mask(scores, params.top_k[lo:hi], params.top_p[lo:hi]) \
            if params.truncates is not False else None
        if removed is not None:
            scores.masked_fill_(removed, float("-inf"))
        sampled = ~greedy[lo:hi]
        known = params.greedy_rows[lo:hi] if params.greedy_rows is not None else None
        some_sampled = not all(known) if known is not None else bool(sampled.any())
        if some_sampled:
            noise = _gumbel_rows(keys[lo:hi], token_key)
            some_greedy = any(known) if known is not None else not bool(sampled.all())
            if some_greedy:
                noise.masked_fill_(greedy[lo:hi, None], 0.0)
            chosen = torch.argmax(scores.add_(noise), dim=-1)
        else:
            chosen = torch.argmax(scores, dim=-1)
        tokens[lo:hi] = chosen
        # log_softmax(logits / T) of the chosen token, before truncation
        picked = logits[lo:hi].gather(1, chosen[:, None]).squeeze(1) / temp[lo:hi]
        logprobs[lo:hi] = picked - log_norm
    return tokens, logprobs
