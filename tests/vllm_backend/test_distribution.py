"""At T=1, specactor on vLLM (drafts verified by the position-keyed rule) samples the target's own
distribution: judged position by position against the model by
:mod:`specactor.bench.calibration`, with enough positions to see a 2% shift in per-position token
frequencies (the power is computed on the same positions, not assumed). vLLM's own sampler passes
the same test (``bench/vllm_distribution.py``): it is left out here
because it only tests vLLM, at a minute of CI time."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="backend vllm: install it with `bash scripts/setup.sh --vllm`")

from specactor.bench.calibration import chi_square_p, power_against_a_shift, score  # noqa: E402
from tests.vllm_backend.engine_runs import ngram_drafts, run_to_end, sequences  # noqa: E402

pytestmark = pytest.mark.slow

SAMPLES_PER_PROMPT = 14
MAX_TOKENS = 256
ALPHA = 1e-3


@pytest.fixture(scope="module")
def scored(setup):
    """(bucket probabilities, observed buckets, buckets of a T=1.1 sampler) of a T=1 run with drafts."""
    vllm, ours, prompts = setup
    many = [p for p in prompts for _ in range(SAMPLES_PER_PROMPT)]
    keyed = run_to_end(vllm, sequences(many, 1.0, MAX_TOKENS, seed=1000), ngram_drafts)
    assert sum(s.drafted for s in keyed) > 0 and sum(s.accepted for s in keyed) > 0  # speculation ran
    return score(ours.model, [(s.prompt_ids, s.output_ids) for s in keyed], wrong_temperature=1.1)


def test_t1_samples_follow_the_targets_distribution(scored) -> None:
    q, draws, _ = scored
    assert len(draws) > 6000
    assert power_against_a_shift(q, 0.02, ALPHA) >= 0.9  # enough positions to see a 2% shift
    assert chi_square_p(q, draws) > ALPHA


def test_the_statistic_rejects_a_sampler_at_the_wrong_temperature(scored) -> None:
    """The test is not blind: at the same positions, tokens drawn at T=1.1 instead of 1 fail it."""
    q, _, wrong = scored
    assert chi_square_p(q, wrong) < ALPHA
