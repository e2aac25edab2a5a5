"""vLLM's start-up profile leaves room for one token a timed step and one accepted chunk: a row that
commits more (random drafts accepted by chance) reaches its token limit while timed, and the batch
size it was in is left out rather than saved as timings of fewer rows. An engine stand-in commits
one token a step, or every drafted token, so this runs without vLLM."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from specactor.protocol import FinishReason
from specactor.engine.sequence import Sequence
from specactor.vllm_backend.profiling import measure_vllm

CHUNKS, CONTEXT = (1, 2, 4), 16


class StandIn:
    """What measure_vllm drives of a VllmEngine: rows that commit one token a step, or, with
    ``accept_drafts``, every drafted token too."""

    def __init__(self, max_len: int, accept_drafts: bool) -> None:
        self.cache = SimpleNamespace(max_len=max_len)
        self.max_batch, self.max_draft, self.vocab_size = 4, 8, 100
        self.eos_token_ids: frozenset[int] = frozenset()
        self.folder, self.dtype, self.device = Path("stand-in"), "float32", "cpu"
        self.accept_drafts = accept_drafts
        self.rows: dict[str, Sequence] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.rows)

    def add(self, seq: Sequence) -> None:
        self.rows[seq.request_id] = seq

    def abort(self, request_id: str) -> Sequence | None:
        seq = self.rows.pop(request_id, None)
        if seq is not None:
            seq.finish_reason = FinishReason.ABORT
        return seq

    def step(self, drafts: dict | None = None) -> None:
        for rid, seq in list(self.rows.items()):
            drafted = len(drafts[rid][1]) if drafts and rid in drafts else 0
            commit = 1 + (drafted if self.accept_drafts else 0)
            seq.output_ids.extend([0] * min(commit, seq.params.max_tokens - len(seq.output_ids)))
            if len(seq.output_ids) >= seq.params.max_tokens:
                seq.finish_reason = FinishReason.LENGTH
                del self.rows[rid]


def _measure(engine: StandIn) -> dict:
    return measure_vllm(engine, batch_sizes=(1, 2, 4), chunk_lens=CHUNKS, context=CONTEXT, repeats=1)


def test_rows_committing_a_token_a_step_fit_the_engine_with_the_least_room() -> None:
    needed = 2 * len(CHUNKS) * 3 + max(CHUNKS) + 2  # (repeats + 1) steps, three timings a chunk
    profile = _measure(StandIn(CONTEXT + needed, accept_drafts=False))
    assert profile["batch_sizes"] == [1, 2, 4] and "partial" not in profile and profile["context"] == CONTEXT


def test_a_batch_size_whose_rows_ran_out_while_timed_is_left_out() -> None:
    needed = 2 * len(CHUNKS) * 3 + max(CHUNKS) + 2
    engine = StandIn(CONTEXT + needed, accept_drafts=True)  # every random draft accepted: rows run out
    notes: list[str] = []
    profile = measure_vllm(engine, batch_sizes=(1, 2, 4), chunk_lens=CHUNKS, context=CONTEXT, repeats=1,
                           progress=notes.append)
    assert profile["partial"] is True and 4 not in profile["batch_sizes"]
    assert len(profile["forward_s"]) == len(profile["batch_sizes"])
    assert any("B=  4: a row reached its token limit" in n for n in notes) and not engine.has_work
