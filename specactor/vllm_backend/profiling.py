"""vLLM's cost profile: how long a whole vLLM step takes, by batch size and tokens verified a row.

The policy decides where drafts pay from the ratio of a verify step to a decode
step at each batch size (see :mod:`specactor.engine.profiling`). vLLM's steps
cost what they cost on vLLM, not what our engine's forwards cost: a step here
is the scheduler, the forward, the sampling and the output processing, and
that is what drafting adds to or saves. So the backend is profiled through
:class:`~specactor.vllm_backend.engine.VllmEngine` itself, in the same JSON
format, and cached under its own key (``backend="vllm"``).

For each batch size B: B requests with ``context`` random prompt tokens are
prefilled; then, for each chunk length C, every row is given C-1 drafted
tokens (tokens no model would emit after random context: rejected, but
verified all the same) and the step is timed (``forward_s``), and a step with
only the first row drafting (``one_row_s``) and one with the first half of the
rows drafting (``half_rows_s``); the median of ``repeats`` steps after one warm-up. The requests are aborted after each batch size.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Any, Callable, Iterator

import torch

from specactor.engine.profiling import QUICK, sweep_grid
from specactor.protocol import SamplingParams
from specactor.engine.sequence import Sequence


#: Seconds vLLM's profile may take at start-up (vLLM's own start takes 10-30 s of the verifier's 120 s).
BUDGET_S = 60.0
#: the shortest context a profile is measured at, where the engine's max_len leaves no room for more
MIN_CONTEXT = 16


class EngineTooShort(ValueError):
    """The engine's max_len leaves no room for the measured steps: a rollout of short samples sizes
    vLLM to them. The verifier then serves on the packaged profile, corrected online, and a later
    engine with room measures this machine's."""


def measure_vllm(engine: Any, batch_sizes: Any = QUICK.batch_sizes, chunk_lens: Any = QUICK.chunk_lens,
                 context: int = QUICK.context, repeats: int = QUICK.repeats, *, budget_s: float | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time ``engine``'s steps (a VllmEngine with nothing running) over ``batch_sizes`` x
    ``chunk_lens``; return the profile :class:`~specactor.policy.cost_model.CostModel` reads.
    Batch sizes above the engine's ``max_batch`` and chunks above its ``max_draft + 1`` are left out;
    ``context`` shrinks to what the engine's ``max_len`` leaves beside the measured steps (the profile
    says which), and :class:`EngineTooShort` is raised where not even ``MIN_CONTEXT`` is left. A batch
    size whose rows reached their token limit while timed is left out (the profile says ``partial``)."""
    if engine.has_work:
        raise ValueError("measure_vllm needs an idle engine: it would time other requests' steps too")
    batch_sizes = sorted({int(b) for b in batch_sizes if 1 <= int(b) <= engine.max_batch})
    chunk_lens = sorted({int(c) for c in chunk_lens if 1 <= int(c) <= engine.max_draft + 1})
    if not batch_sizes or not chunk_lens or repeats < 1:
        raise ValueError(f"nothing to measure: batch sizes {batch_sizes} (max_batch {engine.max_batch}), "
                         f"chunk lengths {chunk_lens} (max_draft {engine.max_draft}), repeats {repeats}")
    # a timed step commits one token a row (its drafts are tokens no model picks there, so rejected),
    # three timings a chunk; room for one accepted chunk besides, should a draft be right by chance, and
    # for the prefill's token. A row that commits more leaves its batch at max_tokens: fewer rows timed.
    steps_needed = (repeats + 1) * len(chunk_lens) * 3 + max(chunk_lens) + 2
    room = engine.cache.max_len - steps_needed
    if room < MIN_CONTEXT:
        raise EngineTooShort(f"{steps_needed} measured tokens after a context of at least {MIN_CONTEXT} exceed "
                             f"max_len {engine.cache.max_len}: measure fewer or shorter chunks, or fewer repeats")
    # an engine sized for short samples measures at a shorter context (the profile says which)
    context = min(context, room)
    vocab = engine.vocab_size
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=engine.cache.max_len - context)  # all the slack there is

    class Timer:
        """Steps of ``batch`` fresh rows, prefilled on opening; ``rows`` of them given a draft."""

        def __init__(self, batch: int) -> None:
            self.seqs = [Sequence(f"profile-{batch}-{i}", torch.randint(0, vocab, (context,), generator=gen).tolist(),
                                  params, seed=i) for i in range(batch)]
            try:
                for seq in self.seqs:
                    engine.add(seq)
                while any(not s.output_ids for s in self.seqs):  # the prefill (chunked if it must be)
                    engine.step()
            except BaseException:
                self.close()
                raise

        def time(self, chunk: int, rows: int) -> float:
            times = []
            for r in range(repeats + 1):
                # a token the model will not pick after its own greedy one: verified, then rejected
                drafts = {s.request_id: ("profile", [(s.output_ids[-1] + 7919) % vocab] * (chunk - 1))
                          for s in self.seqs[:rows]}
                t0 = time.perf_counter()
                engine.step(drafts if chunk > 1 else None)
                if r:
                    times.append(time.perf_counter() - t0)
            return statistics.median(times)

        def note(self) -> str:
            return ""

        def close(self) -> bool:
            """False where a row reached its limit while timed (its drafts were accepted by chance
            more than the slack allows): later cells timed fewer rows, so the batch is left out."""
            short = any(s.finished for s in self.seqs)
            for seq in self.seqs:
                engine.abort(seq.request_id)
            return not short

    with _no_stop_tokens(engine):
        timings = sweep_grid(batch_sizes, chunk_lens, Timer, budget_s=budget_s, progress=progress, label="vLLM ")
    return {
        "model": engine.folder.name, "context": context, "threads": int(os.environ.get("OMP_NUM_THREADS") or 0),
        "repeats": repeats, "backend": "vllm", "dtype": engine.dtype, "device": engine.device, **timings.fields(),
    }


@contextlib.contextmanager
def _no_stop_tokens(engine: Any) -> Iterator[None]:
    """No row may finish while it is timed: the engine's stop tokens are off, then back."""
    stops, engine.eos_token_ids = engine.eos_token_ids, frozenset()
    try:
        yield
    finally:
        engine.eos_token_ids = stops
