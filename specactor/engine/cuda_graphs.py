"""CUDA graphs for the verifier's steps: one replay instead of ~1,400 kernel launches.

Why: a small model's step on a GPU is bound by the host, not by the GPU. The default model's
step took 16-21 ms on an H200, 7-9 ms of it launching about 1,400 kernels, and every Python
instruction beside it (the actor's event loop) added to it (bench/RESULTS.md, "GPU").
A CUDA graph records a step's kernels once and replays them all with one launch.

A graph needs fixed shapes and fixed addresses, so the graphed step is padded (:func:`padded_forward`):
the batch to a bucket of ``B`` rows (the free slots beyond the running ones, at start 0), every
row's chunk to ``Q`` tokens (token 0 after its real ones), attention over the cache's whole length
under a causal mask, and logits for all ``B * Q`` positions. A padded query writes keys and values
past its row's valid length, or into a free slot, where nothing reads before a real token
overwrites them. Steps a graph cannot take run eagerly as before: prefill chunks longer than the
largest ``Q``, token trees (racing), a row whose padded chunk would pass the cache's end.

The verifier captures every ``(B, Q)`` before it serves (:meth:`GraphedSteps.capture_all`); an
engine used directly captures a shape the first time it is met. All share one memory pool. Weight
updates copy into the same tensors (``CausalLM.load_hf_state_dict``), so graphs stay valid
through them. On a CPU the same padded step runs without capture (``capture=False``): that is how
the tests check it against the eager step.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

import torch

from specactor.engine.kv_cache import KVCache
from specactor.engine.model import ATTENTION_BACKENDS, AttentionPart, CausalLM, StepLayout, rms_norm
from torch.nn.attention import sdpa_kernel

#: Chunk lengths a graph is captured for: a decode step (1) and a verify step of 1, 2, 4, 8 or 16
#: draft tokens (the policy's windows, ``EngineConfig.window``); other lengths pad to the next.
CHUNK_BUCKETS = (1, 2, 3, 5, 9, 17)
#: Batch sizes a graph is captured for, below the engine's max_batch (which is always one).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: The most positions (batch x chunk) a graphed step computes; larger steps run eagerly. It bounds
#: the padding a graph may add and the one logits buffer all graphs share (rows x vocab floats:
#: 400 MB for a 49k vocabulary).
MAX_GRAPH_TOKENS = 2048


@torch.inference_mode()
def padded_forward(model: CausalLM, tokens: torch.Tensor, starts: torch.Tensor, cache: KVCache,
                   chunk: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """One step with every row of slots ``0..B-1`` fed ``chunk`` tokens, from device tensors
    only (no host sync, so it can be captured): ``tokens`` [B*chunk] row by row, ``starts`` [B]
    each row's cache length. Writes the keys and values of all B*chunk positions; returns float32
    logits [B*chunk, vocab], in ``out`` if given. Leaves ``cache.lengths`` to the caller, who knows
    the real chunks."""
    cfg, dev = model.cfg, tokens.device
    b, max_len = starts.shape[0], cache.max_len
    group = cfg.num_heads // cfg.num_kv_heads
    offsets = torch.arange(chunk, device=dev).repeat(b)
    rows = torch.arange(b, device=dev).repeat_interleave(chunk)
    positions = starts[rows] + offsets
    allowed = torch.arange(max_len, device=dev) <= positions.view(b, chunk, 1)  # [B, Q, L]
    mask = allowed[:, None, None].expand(b, 1, group, chunk, max_len).reshape(b, 1, group * chunk, max_len)
    layout = StepLayout(q_lens=[chunk] * b, starts=[], positions=positions, slots=positions, rows=rows,
                        offsets=offsets, parts=[AttentionPart(None, None, rows, offsets, mask, chunk, dense=True)],
                        max_q=chunk, max_k=max_len)
    cos, sin = model._rope(positions, max_len)
    x = model.embed(tokens)
    with sdpa_kernel(ATTENTION_BACKENDS):
        x = model._layers(x, cache, layout, cos, sin, group)
    logits = model.lm_head(rms_norm(x, model.norm, cfg.rms_norm_eps))
    return logits.float() if out is None else out.copy_(logits)


def bucket(value: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding ``value`` (None: larger than all)."""
    i = bisect.bisect_left(buckets, value)
    return buckets[i] if i < len(buckets) else None


class _Graph:
    """One captured (or, on a CPU, merely padded) step shape and its fixed input."""

    def __init__(self, batch: int, chunk: int, device: torch.device) -> None:
        self.batch, self.chunk = batch, chunk
        self.inputs = torch.zeros(batch * chunk + batch, dtype=torch.int64, device=device)  # tokens, then starts
        self.graph: Any = None


class GraphedSteps:
    """Runs an engine's steps through CUDA graphs where their shape allows (see the module's doc)."""

    def __init__(self, model: CausalLM, cache: KVCache, *, capture: bool | None = None,
                 max_chunk: int = CHUNK_BUCKETS[-1], max_tokens: int = MAX_GRAPH_TOKENS) -> None:
        self.model, self.cache = model, cache
        self.device = cache.k.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        self.chunks = tuple(c for c in CHUNK_BUCKETS if c <= max_chunk) or (1,)
        self.batches = tuple(sorted({b for b in BATCH_BUCKETS if b < cache.num_slots} | {cache.num_slots}))
        self.max_tokens = max_tokens
        self.graphs: dict[tuple[int, int], _Graph] = {}
        # Every graph writes its logits into one buffer, read (index_select) before the next step
        # replays: a buffer per graph would hold rows x vocab floats for each of dozens of shapes.
        # Their other tensors live in one pool, reused from graph to graph, since none replays
        # while another's results are still being read.
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self._logits: torch.Tensor | None = None
        self.replays = self.eager_steps = 0
        self.last_capture_s = 0.0  # what the last run spent capturing its graph (0: replayed one)
        # the RoPE table must not grow (reallocate) under a captured graph: size it for the cache now
        model._rope(torch.zeros(1, dtype=torch.long, device=self.device), cache.max_len + max(self.chunks))
        self._rope_table = model._cos

    def shape(self, q_lens: list[int], starts: list[int]) -> tuple[int, int] | None:
        """The (batch, chunk) graph this step fits, or None where it must run eagerly."""
        b = bucket(len(q_lens), self.batches)
        q = bucket(max(q_lens), self.chunks)
        if b is None or q is None or b * q > self.max_tokens or max(starts) + q > self.cache.max_len:
            return None
        return b, q

    def run(self, rows: list[list[int]], logit_rows: list[int], shape: tuple[int, int]) -> torch.Tensor:
        """Logits [len(logit_rows), vocab] of one step whose rows feed ``rows`` (flat indices into
        their concatenation, as the eager forward takes them); extends ``cache.lengths``."""
        b, q = shape
        starts = self.cache.lengths[: len(rows)]
        flat: list[int] = []
        padded_index: list[int] = []  # flat position -> its index among the B*Q padded ones
        for r, toks in enumerate(rows):
            flat.extend(toks)
            flat.extend([0] * (q - len(toks)))
            padded_index.extend(range(r * q, r * q + len(toks)))
        flat.extend([0] * (q * (b - len(rows))))
        host = torch.tensor(flat + starts + [0] * (b - len(rows)), dtype=torch.int64)
        self._drop_stale_graphs()
        graph = self.graphs.get(shape)
        if graph is None:
            graph = self.graphs[shape] = _Graph(b, q, self.device)
        graph.inputs.copy_(host, non_blocking=True)
        logits = self._replay(graph)
        for r, toks in enumerate(rows):
            self.cache.lengths[r] = starts[r] + len(toks)
        index = torch.tensor([padded_index[i] for i in logit_rows], dtype=torch.int64).to(self.device,
                                                                                           non_blocking=True)
        return logits.index_select(0, index)

    def capture_all(self) -> int:
        """Capture every shape's graph now, so that none is captured inside a rollout (warm-up
        plus capture cost about two eager steps each; a rollout of a few seconds meets dozens of
        shapes). Before serving only: the captures write keys and values into slots 0..B-1.
        Returns how many shapes it took (on a CPU it runs each padded step once, uncaptured)."""
        self._drop_stale_graphs()
        for b in self.batches:
            for q in self.chunks:
                if b * q <= self.max_tokens and (b, q) not in self.graphs:
                    self.graphs[(b, q)] = graph = _Graph(b, q, self.device)  # token 0 at position 0..q-1
                    self._replay(graph)
        return len(self.graphs)

    def _drop_stale_graphs(self) -> None:
        """The RoPE table grew (something ran the model on longer positions than this cache's):
        graphs captured on the old one would read freed memory, so they are captured again."""
        if self.model._cos is not self._rope_table:
            self.graphs, self._rope_table = {}, self.model._cos

    def _forward(self, graph: _Graph) -> torch.Tensor:
        n = graph.batch * graph.chunk
        if self._logits is None:  # sized once for the largest shape: captured graphs keep its address
            rows = max(b * q for b in self.batches for q in self.chunks if b * q <= self.max_tokens)
            self._logits = torch.empty(rows, self.model.cfg.vocab_size, dtype=torch.float32, device=self.device)
        return padded_forward(self.model, graph.inputs[:n], graph.inputs[n:], self.cache, graph.chunk,
                              out=self._logits[:n])

    def _replay(self, graph: _Graph) -> torch.Tensor:
        self.last_capture_s = 0.0
        if not self.capture:
            self.eager_steps += 1
            return self._forward(graph)
        if graph.graph is None:
            started = time.perf_counter()
            # warm up on a side stream (as torch asks before a capture) with this step's own inputs:
            # it writes the same keys and values the replay below writes again
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._forward(graph)
            torch.cuda.current_stream(self.device).wait_stream(side)
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured, pool=self.pool):
                self._forward(graph)
            graph.graph = captured
            self.last_capture_s = time.perf_counter() - started
        graph.graph.replay()
        self.replays += 1
        assert self._logits is not None
        return self._logits[: graph.batch * graph.chunk]
