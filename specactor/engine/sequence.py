"""What every engine serves and reports: a request's Sequence, a step's StepReport, and the
protocol both backends implement (``add``, ``step``, ``has_work``; ``run`` serves to completion).

specactor's own engine (:mod:`specactor.engine.llm_engine`) and vLLM's
(:mod:`specactor.vllm_backend.engine`) both take Sequences and give StepReports, so the
verify loop, the profiler and the benchmarks drive either one the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from specactor.calls import check_prompt, expand, normalise
from specactor.protocol import FinishReason, SamplingParams, Verdict


#: (method, draft tokens)
Candidate = tuple[str, list[int]]


@dataclass
class Sequence:
    """One request's state and output; the unit the engine schedules."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    per_method: dict[str, dict[str, int]] = field(default_factory=dict)
    arrival_s: float = field(default_factory=time.perf_counter)
    finish_s: float = 0.0
    error: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def context_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def count_draft(self, method: str, drafted: int, accepted: int) -> None:
        """One verified draft of ``method`` in this request's per-method counts."""
        counts = self.per_method.setdefault(method, {"drafted": 0, "accepted": 0, "steps": 0})
        counts["drafted"] += drafted
        counts["accepted"] += accepted
        counts["steps"] += 1


def sample_sequences(prompt_ids: Any, params: SamplingParams | list[SamplingParams], request_ids: list[str], *,
                     default_seed: int = 0) -> list[Sequence]:
    """One Sequence per sample of a batch call, named and seeded exactly as RolloutEngine names and
    seeds them: what references and benchmarks decode with the engine alone."""
    call = normalise(prompt_ids, params, request_ids, None)
    jobs = expand(call, vocab_size=None, max_len=2**62, default_seed=default_seed)
    return [Sequence(job.request_id, job.prompt_ids, job.params, seed=job.params.seed) for job in jobs]


def check_sequence(seq: Sequence, vocab_size: int, max_len: int, eos_token_ids: frozenset[int]) -> None:
    """Raise ValueError naming what makes ``seq`` impossible to serve (any backend's engine)."""
    seq.params.validate()
    check_prompt(seq.request_id, seq.prompt_ids, seq.params, vocab_size, max_len)
    if seq.output_ids:  # resumed: what was committed must leave something to generate
        stops = eos_token_ids | set(seq.params.stop_token_ids)
        if len(seq.logprobs) != len(seq.output_ids):
            raise ValueError(f"request {seq.request_id!r}: {len(seq.output_ids)} resumed tokens but "
                             f"{len(seq.logprobs)} log-probs")
        if len(seq.output_ids) >= seq.params.max_tokens or seq.output_ids[-1] in stops \
                or any(not 0 <= t < vocab_size for t in seq.output_ids):
            raise ValueError(f"request {seq.request_id!r}: the resumed tokens are finished already or "
                             f"outside the vocabulary")


@dataclass
class StepReport:
    """What one step did (for events and the cost profile)."""

    batch_size: int
    prefill_tokens: int
    new_tokens: int
    forward_s: float  # the forward as the device ran it (on a GPU, CUDA events around it: not its launch's time)
    sample_s: float  # the rest of the step until its tokens were on the host
    finished: list[Sequence]
    verdicts: list[Verdict] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    graph: tuple[int, int] | None = None  # (batch, chunk) of the padded step replayed; None: eager
    waiting: int = 0  # requests accepted but not yet running when it ran
    capture_s: float = 0.0  # of which capturing that graph (its shape's first step)


class _Steppable(Protocol):
    @property
    def has_work(self) -> bool: ...
    def add(self, seq: Sequence) -> None: ...
    def step(self) -> StepReport: ...


class ServesToCompletion:
    """``run``: the autoregressive baseline loop, shared by every engine with ``add``, ``step`` and
    ``has_work`` (ours and :class:`~specactor.vllm_backend.engine.VllmEngine`)."""

    def run(
        self: _Steppable,
        seqs: Iterable[Sequence],
        on_step: Callable[[StepReport], None] | None = None,
    ) -> list[Sequence]:
        """Serve ``seqs`` to completion without drafts; ``on_step`` sees every step's report."""
        seqs = list(seqs)
        for seq in seqs:
            self.add(seq)
        while self.has_work:
            report = self.step()
            if on_step is not None:
                on_step(report)
        return seqs
