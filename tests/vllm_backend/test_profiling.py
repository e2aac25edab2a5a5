"""vLLM's cost profile: its steps timed through VllmEngine, in the format the policy reads."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="backend vllm: install it with `bash scripts/setup.sh --vllm`")

from specactor.policy.cost_model import CostModel  # noqa: E402
from specactor.engine.profiling import write_profile  # noqa: E402
from specactor.engine.profiling import grid_for  # noqa: E402
from specactor.vllm_backend.profiling import measure_vllm  # noqa: E402
from tests.vllm_backend.engine_runs import run_to_end, sequences  # noqa: E402

pytestmark = pytest.mark.slow


def test_vllm_steps_are_profiled_within_the_engines_limits_and_the_engine_serves_on(setup, tmp_path) -> None:
    vllm, _, prompts = setup
    before = [s.output_ids for s in run_to_end(vllm, sequences(prompts, 1.0, 16))]
    eos = vllm.eos_token_ids
    profile = measure_vllm(vllm, batch_sizes=(1, 3, vllm.max_batch + 1), chunk_lens=(1, 3, vllm.max_draft + 2),
                           context=32, repeats=1)
    assert profile["batch_sizes"] == [1, 3] and profile["chunk_lens"] == [1, 3]  # beyond the limits: left out
    assert profile["backend"] == "vllm"
    assert not vllm.has_work and vllm.eos_token_ids == eos  # its requests aborted, its stop tokens back
    model = CostModel.from_profile(write_profile(tmp_path / "vllm.json", profile))
    assert model.batch_sizes == [1, 3] and all(t > 0 for row in model.one_row_s for t in row)
    assert profile["half_rows_s"] == profile["one_row_s"]  # half of fewer than 4 rows is the first row
    assert [s.output_ids for s in run_to_end(vllm, sequences(prompts, 1.0, 16))] == before


def test_a_busy_engine_is_not_profiled(setup) -> None:
    vllm, _, prompts = setup
    seqs = sequences(prompts, 0.0, 8)
    vllm.add(seqs[0])
    try:
        with pytest.raises(ValueError, match="idle engine"):
            measure_vllm(vllm, batch_sizes=(1,), chunk_lens=(1,), context=16, repeats=1)
    finally:
        vllm.abort(seqs[0].request_id)


def test_the_start_up_grid_measures_the_engine_s_longest_chunk(setup) -> None:
    """The window's own chunk (window + 1) is timed, not extrapolated from chunk 8, and vLLM's
    measurement covers the whole grid, so the next start finds the cached profile usable."""
    vllm, _, _ = setup
    grid = grid_for(vllm.max_draft)
    profile = measure_vllm(vllm, batch_sizes=(1,), chunk_lens=grid.chunk_lens, context=16, repeats=1)
    # what was measured covers the grid, so the next start finds the cached profile usable
    assert max(profile["chunk_lens"]) == max(grid.chunk_lens) == vllm.max_draft + 1


def test_an_engine_sized_for_short_samples_is_profiled_at_a_shorter_context(setup) -> None:
    """A rollout of short samples sizes vLLM's max_len to them; the start-up profile must still fit
    (its 256 tokens of context and its measured steps did not, and the verifier failed to start)."""
    vllm, _, _ = setup
    chunks = grid_for(vllm.max_draft).chunk_lens
    # 20 repeats and a warm-up, three timings a chunk, a token each; one chunk's slack and the prefill's
    steps = 21 * len(chunks) * 3 + max(chunks) + 2
    profile = measure_vllm(vllm, batch_sizes=(1,), chunk_lens=chunks, context=256, repeats=20)
    assert profile["context"] == min(256, vllm.cache.max_len - steps) < 256
    assert not vllm.has_work
    # the start-up grid (2 repeats) takes 56 tokens beside its context: this 512-token engine measures
    # it at the full 256 (room for every draft to be right, 407 tokens, left 105), and one sized for
    # 64-token samples has room for it
    quick = measure_vllm(vllm, batch_sizes=(1,), chunk_lens=chunks, context=256, repeats=2)
    assert quick["context"] == 256 and not vllm.has_work
    with pytest.raises(ValueError, match=f"exceed max_len {vllm.cache.max_len}"):
        measure_vllm(vllm, batch_sizes=(1,), chunk_lens=chunks, context=256, repeats=40)
