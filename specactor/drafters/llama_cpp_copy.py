"""The target's own weights, quantised, drafting on llama.cpp's low-bit kernels, with the target's noise.

A copy of the policy at 8 bits samples, at every position, what the policy
samples there nearly always, at any temperature, because it draws with the
target's position-keyed Gumbel noise (:mod:`specactor.engine.sampler`): the
only kind of drafter that is right often at T=1. llama.cpp runs it on kernels
made for 8- and 4-bit weights, several times cheaper per token on a CPU than
torch's int8 path.

:class:`LlamaCppDrafter` keeps the interface of :class:`specactor.drafters.model.ModelDrafter`
(``start``, ``propose``, ``observe``, ``finish``, ``load_weights``): each request is one
llama.cpp sequence; a proposal rolls the sequence back to the common prefix of
what it holds and the request's context (``llama_memory_seq_rm``), feeds the
rest of every request in one batched decode, then decodes ``k - 1`` more
tokens, one a row, all requests together. Logits come back to torch, where the
target's own sampling rule picks the tokens, so whatever it proposes the
verifier's output is unchanged. ``load_weights`` writes the new weights as GGUF
(:func:`specactor.engine.gguf_export.write_gguf`, about a second for 135M
parameters) and loads them: the copy follows the policy at every RL step.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from specactor.drafters.base import DraftState
from specactor.drafters.model import (NOISE_MODES, _common_prefix, check_draft_len, check_draft_tokens,
                                      check_started, checked_contexts, checked_start, sample_drafts)
from specactor.engine.config import ModelConfig
from specactor.engine.gguf_export import DEFAULT_QUANT, QUANTS, write_gguf

_quiet_log: Any = None  # llama.cpp's log callback, kept alive while the library may call it


def llama_cpp_available() -> bool:
    """Whether llama.cpp's binding (``llama-cpp-python``) imports here."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _library() -> Any:
    global _quiet_log
    try:
        import llama_cpp.llama_cpp as lib
    except ImportError as exc:
        raise RuntimeError("the llama.cpp drafter needs llama-cpp-python: bash scripts/setup.sh --llama-cpp "
                           f"({exc})") from None
    if _quiet_log is None:
        lib.llama_backend_init()
        _quiet_log = lib.llama_log_callback(lambda level, text, user_data: None)
        lib.llama_log_set(_quiet_log, ctypes.c_void_p(0))
    return lib


class LlamaCppDrafter:
    """Drafts ``k`` tokens per request with a quantised copy of the target on llama.cpp.

    Args:
        cfg: the target's configuration; state: its weights (Hugging Face names).
        max_slots: the most requests it drafts for at once.
        max_len: the longest context (prompt + output + lookahead) a request may reach.
        quant: ``q8_0`` (default), ``q4_0``, ``f16`` or ``f32``.
        threads: llama.cpp's threads (default: this process's torch threads).
        noise: ``"shared"`` (the target's noise) or ``"argmax"`` (the copy's mode).
    """

    name = "model"

    def __init__(self, cfg: ModelConfig, state: Mapping[str, Any], max_slots: int = 32, max_len: int = 1024, *,
                 quant: str = DEFAULT_QUANT, threads: int | None = None, noise: str = "shared") -> None:
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
        if quant not in QUANTS:
            raise ValueError(f"draft quantisation {quant!r}: choose one of {', '.join(QUANTS)}")
        if max_slots < 1 or max_len < 2:
            raise ValueError(f"need max_slots >= 1 and max_len >= 2 (got {max_slots}, {max_len})")
        self.lib = _library()
        self.cfg, self.quant, self.noise = cfg, quant, noise
        self.max_slots, self.max_len = max_slots, max_len
        self.threads = threads or torch.get_num_threads()
        self.vocab_size = cfg.vocab_size
        self._dir = tempfile.TemporaryDirectory(prefix="specactor-draft-")
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._batch_size = 0
        self._slot: dict[str, int] = {}  # request id -> llama.cpp sequence id
        self._free = list(range(max_slots - 1, -1, -1))
        self._cached: dict[str, list[int]] = {}  # request id -> the tokens its sequence holds
        self.forwards = 0  # decodes run (for benchmarks)
        self.drafted = 0  # tokens proposed
        self.version = 0  # weight updates loaded
        #: a decode of fewer tokens than this runs as one-token decodes (see :meth:`_calibrate`)
        self.split_below = 0
        self._load(state)
        self._calibrate()

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str], **kwargs: Any) -> "LlamaCppDrafter":
        """A copy of the checkpoint in ``folder`` (a safetensors folder, as the target loads it)."""
        from specactor.engine.weights import load_state_dict

        return cls(ModelConfig.from_dir(folder), load_state_dict(folder), **kwargs)

    # ------------------------------------------------------------------ weights

    def _load(self, state: Mapping[str, Any]) -> None:
        lib = self.lib
        path = write_gguf(self.cfg, state, Path(self._dir.name) / f"draft-{self.quant}.gguf", quant=self.quant)
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_mmap = False  # the file is re-written at every update
        model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise RuntimeError(f"llama.cpp could not load the draft copy {path}")
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = self.max_slots * self.max_len
        cparams.n_seq_max = self.max_slots
        cparams.kv_unified = True  # sequences share one cache: short and long requests side by side
        cparams.n_batch = cparams.n_ubatch = min(2048, cparams.n_ctx)
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        ctx = lib.llama_init_from_model(model, cparams)
        if not ctx:
            lib.llama_model_free(model)
            raise RuntimeError("llama.cpp could not make a context for the draft copy")
        path.unlink(missing_ok=True)  # loaded into memory (no mmap)
        self._close()
        self._model, self._ctx = model, ctx
        self._batch_size = int(cparams.n_batch)
        self._batch = lib.llama_batch_init(self._batch_size, 0, 1)
        self._cached = {rid: [] for rid in self._slot}  # every context is fed again

    def load_weights(self, state: Mapping[str, Any]) -> None:
        """New weights (Hugging Face names; the target's after an RL step) quantised as before;
        every request's context is fed again on its next proposal. A missing or misshapen weight
        is a ValueError naming it (:func:`write_gguf` checks them before anything changes)."""
        self._load(state)
        self.version += 1

    def _close(self) -> None:
        if self._batch is not None:
            self.lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self.lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            self.lib.llama_model_free(self._model)
            self._model = None

    def close(self) -> None:
        """Free llama.cpp's model, context and batch (also when garbage-collected)."""
        self._close()
        self._dir.cleanup()

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

    # ------------------------------------------------------------------ protocol

    @property
    def active(self) -> int:
        return len(self._slot)

    def start(self, state: DraftState) -> None:
        rid = state.request_id
        checked_start(state, self._slot, self.max_slots, self.max_len, self.vocab_size)
        self._slot[rid] = self._free.pop()
        self._cached[rid] = []  # fed, batched, by the first proposal

    def observe(self, state: DraftState, start: int, tokens: list[int]) -> None:
        """Nothing to do: the next proposal rolls the sequence back to the common prefix."""

    def finish(self, state: DraftState) -> None:
        seq = self._slot.pop(state.request_id, None)
        if seq is None:
            return
        self._cached.pop(state.request_id, None)
        self.lib.llama_memory_seq_rm(self.lib.llama_get_memory(self._ctx), seq, -1, -1)
        self._free.append(seq)

    def cold(self, state: DraftState) -> int:
        """How many of ``state``'s context tokens its sequence lacks (its first proposal feeds them)."""
        context = state.context()
        return len(context) - _common_prefix(self._cached.get(state.request_id, []), context)

    def prefill(self, states: list[DraftState]) -> None:
        """Feed what each sequence lacks of its context but the last token, in one batched decode,
        without drafting: a decoupled caller does this first, then catches up with the verdicts
        that came meanwhile (a first proposal that fed a 200-token prompt on one core came 15
        steps late, its drafts all overtaken)."""
        feeds = []
        memory = self.lib.llama_get_memory(self._ctx)
        for row, state in enumerate(states):
            check_started(state, self._slot)
            context = state.context()[:-1]
            check_draft_len(state, len(context) + 1, self.max_len)
            keep = _common_prefix(self._cached[state.request_id], context)
            check_draft_tokens(state, context[keep:], self.vocab_size)
            if keep < len(context):
                seq = self._slot[state.request_id]
                self.lib.llama_memory_seq_rm(memory, seq, keep, -1)
                self._cached[state.request_id] = list(context)
                feeds.append((row, seq, keep, context[keep:]))
        if feeds:
            self._decode(feeds, len(states))

    def propose(self, states: list[DraftState], k: int) -> list[list[int]]:
        """``k`` tokens continuing each state's context: one decode feeds what every sequence lacks,
        then ``k - 1`` decodes of one token a row. Fewer (at least one) only for a request whose
        context comes within ``k - 1`` tokens of ``max_len``. KeyError for a request not started;
        ValueError for a context over ``max_len`` or a token outside the vocabulary (nothing changes)."""
        if k <= 0 or not states:
            return [[] for _ in states]
        contexts = checked_contexts(states, self._slot, self.max_len)
        keeps = [min(_common_prefix(self._cached[s.request_id], c), len(c) - 1) for s, c in zip(states, contexts)]
        for state, context, keep in zip(states, contexts, keeps):
            check_draft_tokens(state, context[keep:], self.vocab_size)  # before anything changes
        memory = self.lib.llama_get_memory(self._ctx)
        feeds = []  # (row, sequence, first position, tokens) of the first decode
        for row, (state, context, keep) in enumerate(zip(states, contexts, keeps)):
            seq = self._slot[state.request_id]
            self.lib.llama_memory_seq_rm(memory, seq, keep, -1)  # the rollback
            self._cached[state.request_id] = list(context)
            feeds.append((row, seq, keep, context[keep:]))
        budgets = [min(k, self.max_len - len(c) + 1) for c in contexts]
        positions = [len(s.committed) + len(s.lookahead) for s in states]
        logits = self._decode(feeds, len(states))
        out: list[list[int]] = [[] for _ in states]
        live = list(range(len(states)))
        for j in range(k):
            drafted = sample_drafts(logits[live], [states[i] for i in live], [positions[i] + j for i in live],
                                    self.noise, torch.device("cpu"))
            for i, token in zip(live, drafted):
                out[i].append(token)
            live = [i for i, token in zip(live, drafted) if budgets[i] > j + 1]
            if not live or j == k - 1:
                break
            step = []
            for i in live:
                rid = states[i].request_id
                step.append((i, self._slot[rid], len(self._cached[rid]), [out[i][-1]]))
                self._cached[rid].append(out[i][-1])
            logits = self._decode(step, len(states))
        self.drafted += sum(len(o) for o in out)
        return out

    # ------------------------------------------------------------------ internals

    def _calibrate(self, prompt: int = 32, repeats: int = 3) -> None:
        """Measure whether llama.cpp's batched kernel beats one-token decodes at small sizes.

        Its one-row kernels are memory-bound and fast; its batched 8-bit kernel is slower per
        token until several tokens share it (the default model's q8_0 copy on a 2-core AVX-512
        CPU, one thread: one token 7.6 ms, two tokens together 24 ms, two sequences together
        28 ms). Here ``n`` tokens are timed together and one at a time, for n = 2, 3, 4, 6, 8,
        and decodes of fewer tokens than the first size where together wins run split."""
        import time

        seqs = min(self.max_slots, 8)
        if seqs < 2 or self.max_len < prompt + 4:
            return
        memory = self.lib.llama_get_memory(self._ctx)
        self._decode([(0, s, 0, [(3 + 7 * s + j) % self.vocab_size for j in range(prompt)]) for s in range(seqs)],
                     seqs)

        def timed(feeds: list[tuple[int, int, int, list[int]]]) -> float:
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                self._decode(feeds, len(feeds), split=False)
                best = min(best, time.perf_counter() - t0)
                for _, seq, pos, _ in feeds:
                    self.lib.llama_memory_seq_rm(memory, seq, pos, -1)
            return best

        one = timed([(0, 0, prompt, [5])])
        self.split_below = 2
        for n in (2, 3, 4, 6, 8):
            if n > seqs:
                break
            together = timed([(s, s, prompt, [5]) for s in range(n)])
            if together <= n * one:
                break
            self.split_below = n + 1
        for s in range(seqs):
            self.lib.llama_memory_seq_rm(memory, s, -1, -1)

    def _decode(self, feeds: list[tuple[int, int, int, list[int]]], rows: int, split: bool = True) -> torch.Tensor:
        """Feed every (row, sequence, first position, tokens) and return each row's logits after its
        last token (rows without a feed: zeros, never read). Decodes in chunks of the batch size,
        or a token at a time where fewer than ``split_below`` tokens are fed (faster there)."""
        lib, batch = self.lib, self._batch
        out = np.zeros((rows, self.vocab_size), dtype=np.float32)
        pending = [(row, seq, pos + n, token, n == len(tokens) - 1)
                   for row, seq, pos, tokens in feeds for n, token in enumerate(tokens)]
        size = 1 if split and len(pending) < self.split_below else self._batch_size
        for start in range(0, len(pending), size):
            chunk = pending[start:start + size]
            batch.n_tokens = len(chunk)
            wanted = []
            for i, (row, seq, pos, token, last) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = last
                if last:
                    wanted.append((i, row))
            status = lib.llama_decode(self._ctx, batch)
            if status != 0:
                raise RuntimeError(f"llama.cpp's decode failed (status {status}); "
                                   f"{len(chunk)} tokens over {len(feeds)} requests")
            self.forwards += 1
            for i, row in wanted:
                ptr = lib.llama_get_logits_ith(self._ctx, i)
                out[row] = np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))
        return torch.from_numpy(out)
