"""Draft-model drafting with shared (position-keyed) noise.

:class:`ModelDrafter` wraps any :class:`~specactor.engine.model.CausalLM`
that shares the target's tokenizer (a smaller model of the family, or a
quantised copy of the target) and keeps its own slot KV cache.

Shared noise
    The target samples output position ``t`` of a request as
    ``argmax(logits / T + g(seed, t))`` where the Gumbel noise ``g`` is a pure
    function of (seed, t, token) (see :mod:`specactor.engine.sampler`). The
    drafter samples with the *same* noise, through the same
    :func:`~specactor.engine.sampler.sample`, so wherever the draft and
    target distributions agree the sampled tokens agree, at any temperature: a
    drafter that is the target itself is always right (up to float rounding
    differences between differently shaped batches). ``noise="argmax"``
    drafts the draft model's mode instead (the usual choice without shared
    noise); at ``T > 0`` that is right only as often as the target happens to
    sample its own mode.

Cache and rollback
    The drafter keeps, per request, the tokens whose K/V are in its cache. A
    proposal continues ``state.context()`` (prompt + committed + lookahead):
    the cache length is set to the common prefix of the cached tokens and that
    context (this is the rollback, and it also covers a lookahead the caller
    discarded), and only the rest is fed. So :meth:`observe` needs to do
    nothing and verdicts may arrive in any order relative to proposals.

Slots
    ``CausalLM.forward`` runs slots ``0..B-1`` together, so the active
    requests are kept compact: :meth:`finish` moves the last slot into the
    freed one. :meth:`propose` may be called for any subset of the active
    requests, in any order: it swaps the requested ones into slots ``0..n-1``
    (in the order of their remaining cache room, so that rows which run out
    of room first can leave the batch) and runs only those rows. Swapping
    copies their cached K/V, but a caller that proposes for all its requests,
    or for the same subset every time, pays for it at most once: the slots
    stay where the last proposal put them. Requiring "all active states"
    instead would be cheaper to write but would force a decoupled draft
    actor to draft for requests whose lookahead is already long enough.

Default drafter
    :func:`default_model_drafter` builds an int8 weight-only copy of a model
    (the measurements behind that choice are above :data:`QUANT_MODES`).
"""

from __future__ import annotations

import itertools
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specactor.drafters.base import DraftState
from specactor.engine.cuda_graphs import GraphedSteps
from specactor.engine.kv_cache import KVCache
from specactor.engine.model import CausalLM
from specactor.engine.sampler import SamplingBatch, sample

if TYPE_CHECKING:
    from specactor.drafters.llama_cpp_copy import LlamaCppDrafter

NOISE_MODES = ("shared", "argmax")


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first (contexts are long, divergence is near the end)
    step = 64
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def check_new_request(state: DraftState, started: dict[str, int], max_slots: int) -> None:
    """Why ``state`` cannot start on a model drafter holding ``started`` (request id -> slot), by
    name: ValueError for a request started already or an empty prompt, RuntimeError when full."""
    rid = state.request_id
    if rid in started:
        raise ValueError(f"request {rid!r} was already started on the model drafter")
    if len(started) >= max_slots:
        raise RuntimeError(f"model drafter is full: {len(started)} active requests = max_slots "
                           f"{max_slots}; finish one or build it with more slots")
    if not state.prompt_ids:
        raise ValueError(f"request {rid!r}: prompt is empty")


def check_draft_tokens(state: DraftState, tokens: list[int], vocab_size: int) -> None:
    """ValueError naming the first of ``tokens`` outside a draft model's vocabulary."""
    if tokens and (max(tokens) >= vocab_size or min(tokens) < 0):
        bad = next(t for t in tokens if not 0 <= t < vocab_size)
        raise ValueError(
            f"request {state.request_id!r}: token id {bad} is outside the draft model's vocabulary "
            f"(size {vocab_size}); a draft model must share the target's tokenizer")


def check_draft_len(state: DraftState, n: int, max_len: int) -> None:
    """ValueError where a context of ``n`` tokens exceeds a model drafter's ``max_len``."""
    if n > max_len:
        raise ValueError(f"request {state.request_id!r}: context of {n} tokens is longer than the "
                         f"drafter's max_len {max_len}")


def checked_start(state: DraftState, started: dict[str, int], max_slots: int, max_len: int,
                  vocab_size: int) -> list[int]:
    """``state``'s context, once every model drafter's checks for a new request passed
    (:func:`check_new_request`, its length, its tokens): nothing is started otherwise."""
    check_new_request(state, started, max_slots)
    context = state.context()
    check_draft_len(state, len(context), max_len)
    check_draft_tokens(state, context, vocab_size)
    return context


def check_started(state: DraftState, started: dict[str, int]) -> None:
    """KeyError for a request a model drafter was not given (or has finished)."""
    if state.request_id not in started:
        raise KeyError(f"request {state.request_id!r} was not started on the model drafter (or was finished)")


def checked_contexts(states: list[DraftState], started: dict[str, int], max_len: int) -> list[list[int]]:
    """The contexts a model drafter proposes for: KeyError for a request not started, ValueError
    for a context over ``max_len`` or a request given twice (before anything changes)."""
    contexts = []
    for state in states:
        check_started(state, started)
        context = state.context()
        check_draft_len(state, len(context), max_len)
        contexts.append(context)
    if len({s.request_id for s in states}) != len(states):
        raise ValueError("propose() got the same request twice")
    return contexts


def sample_drafts(logits: torch.Tensor, states: list[DraftState], positions: list[int], noise: str,
                  device: torch.device) -> list[int]:
    """Row i of ``logits`` sampled as the target samples ``states[i]`` at output position
    ``positions[i]``: its temperature and position-keyed noise (``noise="shared"``), or greedy
    (``"argmax"``). Every model drafter drafts through this."""
    rows = []
    for state, pos in zip(states, positions):
        temperature = state.temperature if noise == "shared" else 0.0
        # DraftState has no top_k / top_p today; honour them if it ever does.
        top_k = getattr(state, "top_k", 0) if noise == "shared" else 0
        top_p = getattr(state, "top_p", 1.0) if noise == "shared" else 1.0
        rows.append((temperature, top_k, top_p, state.seed, pos))
    tokens, _ = sample(logits, SamplingBatch.build(rows, device))
    return tokens.tolist()


class ModelDrafter:
    """Drafts ``k`` tokens per request with a small causal LM, in ``k`` batched forwards.

    Args:
        model: the draft model (a :class:`CausalLM`, possibly quantised);
            its token ids must mean what the target's mean.
        max_slots: the most requests it drafts for at once.
        max_len: the longest context (prompt + output + lookahead) it caches.
        noise: ``"shared"`` samples with the target's position-keyed Gumbel
            noise at the request's temperature (greedy at 0); ``"argmax"``
            always drafts the draft model's most likely token.
        device: where its cache lives (default: the model's device).
        quant: how ``model`` was made from float32 weights (``fp32``,
            ``bf16``, ``int8w``, ``int8``); :meth:`load_weights` does the same.
    """

    name = "model"

    def __init__(
        self,
        model: CausalLM,
        max_slots: int = 32,
        max_len: int = 1024,
        *,
        noise: str = "shared",
        device: torch.device | str | None = None,
        quant: str = "fp32",
        cuda_graphs: bool | None = None,
    ) -> None:
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self.model = model
        self.quant = quant  # how ``model`` was made from float32 weights (for weight updates)
        self.noise = noise
        self.device = torch.device(device) if device is not None else model.embed.weight.device
        self.vocab_size = model.cfg.vocab_size
        # the cache takes the embedding's dtype: float32 for fp32 and int8 (torch.ao keeps it), bf16 for
        # bf16 and int8w (quantize_int8_weights casts everything but the int8 weights to bf16)
        self.cache = KVCache(model.cfg, max_slots, max_len, dtype=model.embed.weight.dtype, device=self.device)
        # a copy's step on a GPU is bound by launching its kernels, as the verifier's is: its steps
        # replay CUDA graphs there (None: on a CUDA device; True on a CPU runs the padded step uncaptured)
        self.use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.graphs = GraphedSteps(model, self.cache) if self.use_graphs else None
        self.max_slots, self.max_len = max_slots, max_len
        self._ids: list[str] = []  # slot -> request id (compact: slots 0..len-1)
        self._slot: dict[str, int] = {}  # request id -> slot
        self._cached: list[list[int]] = []  # slot -> the tokens whose K/V the slot holds
        self.forwards = 0  # batched forwards run (for benchmarks)
        self.drafted = 0  # tokens proposed

    # ------------------------------------------------------------------ protocol

    @property
    def active(self) -> int:
        """Requests started and not finished."""
        return len(self._ids)

    def start(self, state: DraftState) -> None:
        rid = state.request_id
        checked_start(state, self._slot, self.max_slots, self.max_len, self.vocab_size)
        slot = len(self._ids)
        self._ids.append(rid)
        self._slot[rid] = slot
        self._cached.append([])
        self.cache.lengths[slot] = 0  # filled lazily, batched, by the first proposal

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """New weights (Hugging Face names; the target's after an RL step), made into a
        draft model as before; every cached context is recomputed on its next proposal."""
        from specactor.weight_update import checked_update

        fresh = CausalLM(self.model.cfg)
        checked_update(fresh, state)
        fresh.load_hf_state_dict(state)
        self.use_model(as_draft_model(fresh.eval(), self.quant).to(self.device))

    def use_model(self, model: CausalLM) -> None:
        """Draft with ``model`` from now on; every cached context (the old model's K/V) is
        recomputed on its next proposal."""
        self.model = model
        if self.use_graphs:  # graphs captured on the old model's weights: captured again, lazily
            self.graphs = GraphedSteps(model, self.cache)
        for slot in range(len(self._ids)):
            self._cached[slot] = []
            self.cache.lengths[slot] = 0

    def observe(self, state: DraftState, start: int, tokens: list[int]) -> None:
        """Nothing to do: the next proposal rolls the cache back to the common prefix."""

    def finish(self, state: DraftState) -> None:
        slot = self._slot.pop(state.request_id, None)
        if slot is None:
            return
        last = len(self._ids) - 1
        if slot != last:
            self.cache.move(last, slot)
            self._ids[slot] = self._ids[last]
            self._cached[slot] = self._cached[last]
            self._slot[self._ids[slot]] = slot
        self.cache.lengths[last] = 0
        self._ids.pop()
        self._cached.pop()

    def propose(self, states: list[DraftState], k: int) -> list[list[int]]:
        """``k`` tokens continuing each state's context, in ``k`` batched forwards.

        Fewer (at least one) only for a request whose context comes within
        ``k - 1`` tokens of ``max_len``. Raises KeyError for a request that
        was not started, ValueError for a context longer than ``max_len`` or
        a token outside the draft model's vocabulary (nothing changes then).
        """
        if k <= 0 or not states:
            return [[] for _ in states]
        contexts = checked_contexts(states, self._slot, self.max_len)
        # The last forward feeds draft token k-2, at position len(context) + k - 2.
        budgets = [min(k, self.max_len - len(c) + 1) for c in contexts]
        # Row r of the batch is states[order[r]]: most room first, so rows that
        # run out leave from the end and the batch stays a prefix of the slots.
        order = sorted(range(len(states)), key=lambda i: -budgets[i])
        for row, i in enumerate(order):
            self._swap(self._slot[states[i].request_id], row)
        n = len(order)

        # First forward: every row feeds what its cache lacks (at least its last token).
        keeps: list[int] = []
        chunks: list[list[int]] = []
        for row, i in enumerate(order):
            context = contexts[i]
            keep = min(_common_prefix(self._cached[row], context), len(context) - 1)
            check_draft_tokens(states[i], context[keep:], self.vocab_size)  # before anything changes
            keeps.append(keep)
            chunks.append(context[keep:])
        for row, (keep, new) in enumerate(zip(keeps, chunks)):
            self.cache.lengths[row] = keep  # the rollback
            del self._cached[row][keep:]
            self._cached[row].extend(new)
        logits = self._forward(chunks)

        rows = [states[i] for i in order]
        first_pos = [len(s.committed) + len(s.lookahead) for s in rows]
        out: list[list[int]] = [[] for _ in range(n)]
        live = n
        for j in range(k):
            drafted = self._sample(logits, rows[:live], [p + j for p in first_pos[:live]])
            for row in range(live):
                out[row].append(drafted[row])
            live = sum(1 for i in order if budgets[i] > j + 1)
            if live == 0:
                break
            for row in range(live):
                self._cached[row].append(drafted[row])
            logits = self._forward([[token] for token in drafted[:live]])

        result: list[list[int]] = [[] for _ in states]
        for row, i in enumerate(order):
            result[i] = out[row]
            self.drafted += len(out[row])
        return result

    # ------------------------------------------------------------------ internals

    def _forward(self, chunks: list[list[int]]) -> torch.Tensor:
        """Feed ``chunks[r]`` to cache rows 0..len-1; each row's logits after its last token. Through
        a CUDA graph where the step has one (:class:`GraphedSteps`), else eagerly."""
        q_lens = [len(c) for c in chunks]
        last = list(itertools.accumulate(q_lens))
        self.forwards += 1
        if self.graphs is not None:
            shape = self.graphs.shape(q_lens, self.cache.lengths[:len(chunks)])
            if shape is not None:
                return self.graphs.run(chunks, [i - 1 for i in last], shape)
        tokens = torch.tensor([t for c in chunks for t in c], dtype=torch.int64, device=self.device)
        return self.model(tokens, q_lens, self.cache, torch.tensor(last, device=self.device) - 1)

    def _sample(self, logits: torch.Tensor, states: list[DraftState], positions: list[int]) -> list[int]:
        """The target's own sampling rule, with its noise (or greedy for ``noise="argmax"``)."""
        return sample_drafts(logits, states, positions, self.noise, self.device)

    def _swap(self, a: int, b: int) -> None:
        """Exchange slots ``a`` and ``b`` (cache contents, lengths and bookkeeping)."""
        if a == b:
            return
        cache = self.cache
        la, lb = cache.lengths[a], cache.lengths[b]
        if lb:
            saved_k, saved_v = cache.k[:, b, :, :lb].clone(), cache.v[:, b, :, :lb].clone()
        cache.move(a, b)
        if lb:
            cache.k[:, a, :, :lb] = saved_k
            cache.v[:, a, :, :lb] = saved_v
        cache.lengths[a], cache.lengths[b] = lb, la
        ida, idb = self._ids[a], self._ids[b]
        self._ids[a], self._ids[b] = idb, ida
        self._slot[ida], self._slot[idb] = b, a
        self._cached[a], self._cached[b] = self._cached[b], self._cached[a]


# ---------------------------------------------------------------------- default drafter
#
# Which cheap copy of the default model (SmolLM2-135M, fp32 target) drafts best,
# measured by bench/drafter_acceptance.py on 8 HumanEval prompts (k = 4, shared
# noise; mean accepted length at T = 1 / T = 0, drafting ms per token at batch
# 1 / 8 / 32 on 2 shared AVX-512/AMX cores):
#
#   fp32 (the target itself)  4.00 / 4.00   31 / 8.8 / 3.5 ms
#   bf16                      3.91 / 3.82   33 / 5.2 / 2.1 ms
#   int8w (weight-only)       3.76 / 3.77   19 / 5.4 / 2.1 ms
#   int8 (quantize_dynamic)   1.87 / 2.24   17 / 3.9 / -  ms
#
# quantize_dynamic still runs in torch 2.13 (deprecated) and is the fastest,
# but quantising activations per tensor costs half the accepted tokens
# (per-channel weights only bring it to 2.23 at T = 1). bf16 keeps acceptance
# but is no faster than fp32 at batch 1, where speculation matters most (the
# rollout's long tail). int8 weight-only keeps 94-96% of bf16's acceptance, is
# 1.6x faster than fp32/bf16 at batch 1-4 and as fast as bf16 from batch 8 up
# (it switches to a dequantised bf16 copy for many rows): the default.

QUANT_MODES = ("int8w", "int4w", "int8", "bf16", "fp32")

#: What :func:`default_model_drafter` builds unless told otherwise.
DEFAULT_QUANT = "int8w"

#: Above this many rows (tokens in one forward) an int8 weight-only Linear multiplies by its
#: dequantised bf16 copy instead: the int8 kernel is faster for a few rows (memory-bound:
#: 6.7 vs 9.6 ms per token at batch 4), bf16 GEMM (AMX) for many (5.3 vs 5.5 at batch 8).
INT8_DENSE_ABOVE = 6


def quantize_int8(model: CausalLM) -> CausalLM:
    """An int8 dynamically quantised copy (``quant="int8"``): int8 weights, activations quantised per call.

    ``torch.ao.quantization.quantize_dynamic`` is deprecated (torchao
    replaces it) but still works in torch 2.13 on CPU; its warnings are
    silenced here. Every ``Linear`` (q/k/v, o, gate/up, down and the LM head)
    becomes int8; the embedding, norms and KV cache stay float32.
    """
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return quantized.eval()


class Int8WeightLinear(torch.nn.Module):
    """y = x @ (int8 weight * per-row scale).T (+ bias): weight-only int8 quantisation.

    Up to ``dense_above`` rows it runs ``torch._weight_int8pack_mm`` (the CPU
    kernel behind torchao's int8 weight-only mode), which reads the weights as
    int8, a quarter of fp32's memory traffic. For more rows it multiplies by a
    dequantised copy in ``dtype`` (bf16 GEMM uses AMX), so larger batches stay
    fast; both paths use the same rounded weights, so the model is the same
    function either way (up to the order of float additions).
    """

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype = torch.bfloat16,
                 dense_above: int | None = INT8_DENSE_ABOVE) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("dense", None if dense_above is None else (q.float() * scale[:, None]).to(dtype))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dense_above = dense_above

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.scale.dtype)
        if self.dense is not None and x2.shape[0] > self.dense_above:
            y = torch.nn.functional.linear(x2, self.dense, self.bias)
        else:
            y = torch._weight_int8pack_mm(x2, self.weight, self.scale)
            if self.bias is not None:
                y = y + self.bias
        return y.view(*shape[:-1], self.out_features)


def quantize_int8_weights(model: CausalLM, dtype: torch.dtype = torch.bfloat16,
                          dense_above: int | None = INT8_DENSE_ABOVE) -> CausalLM:
    """A copy of ``model`` in ``dtype`` whose Linear layers hold int8 weights (``quant="int8w"``).

    One scale per output row, quantised from the original (fp32) weights; the
    embedding, norms, activations and KV cache are in ``dtype``. See
    :class:`Int8WeightLinear`.
    """
    import copy

    quantized = copy.deepcopy(model)
    for module in list(quantized.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Int8WeightLinear(child, dtype, dense_above))
    quantized = quantized.to(dtype).eval()
    # smoke-test the kernel here, so that a torch without it fails at load time
    probe = torch.zeros(1, model.cfg.hidden_size, dtype=dtype)
    quantized.layers[0].qkv(probe)
    return quantized


def load_draft_model(folder: str | os.PathLike[str], quant: str = DEFAULT_QUANT) -> CausalLM:
    """The model in ``folder`` as a draft model: ``int8w``, ``int4w``, ``int8``, ``bf16`` or ``fp32``.

    ``int8w``: int8 weight-only, bf16 activations (:func:`quantize_int8_weights`); ``int4w``: 4-bit
    weight-only in groups (:mod:`specactor.drafters.int4_weights`);
    ``int8``: ``torch.ao`` dynamic quantisation (:func:`quantize_int8`). If
    the int8 kernels are missing from this torch, a bf16 copy is used instead
    (with a warning).
    """
    from specactor.engine.weights import load_causal_lm

    if quant not in QUANT_MODES:
        raise ValueError(f"quant must be one of {QUANT_MODES}, got {quant!r}")
    return as_draft_model(load_causal_lm(Path(folder)), quant)


def as_draft_model(model: CausalLM, quant: str) -> CausalLM:
    """A float32 ``model`` made into a draft model (see :func:`load_draft_model`)."""
    if quant == "bf16":
        return model.to(torch.bfloat16)
    if quant == "fp32":
        return model
    try:
        if quant == "int4w":
            from specactor.drafters.int4_weights import quantize_int4_weights

            return quantize_int4_weights(model)  # type: ignore[return-value]
        return quantize_int8_weights(model) if quant == "int8w" else quantize_int8(model)
    except (ImportError, AttributeError, RuntimeError, NotImplementedError) as e:
        warnings.warn(f"{quant} quantisation is unavailable in torch {torch.__version__} ({e}); "
                      f"drafting with a bf16 copy instead")
        return model.to(torch.bfloat16)


#: What ``--draft-quant`` defaults to on a CPU where llama.cpp's binding is installed: its 8-bit
#: copy drafts a token for one row in 6-7 ms where torch's int8w takes 13 (default model, 2 cores),
#: and is right as often (96% of T=1 positions).
DEFAULT_CPU_QUANT = "llama-q8_0"

_warned_fallback = False


def default_quant(folder: str | os.PathLike[str], device: str = "cpu") -> str:
    """The copy ``model`` drafts with unless told: llama.cpp's q8_0 on a CPU (where its binding is
    installed and the model has a GGUF layout), else torch's int8w there; bf16 on a GPU. Says once
    per process why it falls back."""
    global _warned_fallback
    if device != "cpu":
        return "bf16"
    from specactor.drafters.llama_cpp_copy import llama_cpp_available
    from specactor.engine.config import ModelConfig
    from specactor.engine.gguf_export import gguf_architecture

    why = ""
    if not llama_cpp_available():
        why = "llama.cpp's binding is not installed (bash scripts/setup.sh --llama-cpp)"
    else:
        try:
            gguf_architecture(ModelConfig.from_dir(folder))
        except ValueError as exc:
            why = str(exc)
    if not why:
        return DEFAULT_CPU_QUANT
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"the model drafter drafts with torch's {DEFAULT_QUANT} copy: {why}")
    return DEFAULT_QUANT


def default_model_drafter(
    folder: str | os.PathLike[str],
    *,
    quant: str | None = None,
    max_slots: int = 32,
    max_len: int = 1024,
    noise: str = "shared",
    device: str = "cpu",
    threads: int | None = None,
) -> "ModelDrafter | LlamaCppDrafter":
    """A cheaper copy of the model in ``folder`` drafting with the target's noise: ``quant`` or
    :func:`default_quant` (llama.cpp's q8_0 on a CPU, bf16 on a GPU). ``llama-q8_0`` /
    ``llama-q4_0``: a :class:`~specactor.drafters.llama_cpp_copy.LlamaCppDrafter` on ``threads``
    threads (torch's int8w copy, with a warning, where llama.cpp's binding is not installed);
    otherwise a :class:`ModelDrafter` over a torch copy.

    For the default model, ``folder`` is ``specactor.engine.model_registry.resolve_model(None)``.
    """
    quant = quant or default_quant(folder, device)
    if quant.startswith("llama-"):
        from specactor.drafters.llama_cpp_copy import LlamaCppDrafter, llama_cpp_available

        if llama_cpp_available():
            return LlamaCppDrafter.from_folder(folder, max_slots=max_slots, max_len=max_len,
                                               quant=quant.removeprefix("llama-"), noise=noise, threads=threads)
        warnings.warn(f"draft quantisation {quant} needs llama.cpp's binding (bash scripts/setup.sh --llama-cpp): "
                      f"drafting with torch's {DEFAULT_QUANT} copy instead")
        quant = DEFAULT_QUANT
    return ModelDrafter(load_draft_model(folder, quant).to(device), max_slots=max_slots, max_len=max_len,
                        noise=noise, quant=quant, device=device)
