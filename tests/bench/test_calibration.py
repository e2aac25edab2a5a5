"""The calibration test: right samplers pass, shifted ones fail, and its power is what it says,
on synthetic positions and on a tiny model sampled by our engine."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.bench.calibration import chi_square_p, power_against_a_shift, score


def _positions(n: int, seed: int) -> torch.Tensor:
    """Bucket probabilities of ``n`` positions, from near-certain to flat."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 5, generator=gen, dtype=torch.float64) * torch.rand(n, 1, generator=gen) * 6
    return torch.softmax(logits, -1)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_draws_from_the_stated_probabilities_pass(seed: int) -> None:
    q = _positions(4000, seed)
    draws = torch.multinomial(q.float(), 1, generator=torch.Generator().manual_seed(seed + 1))[:, 0]
    assert chi_square_p(q, draws) > 1e-4


def test_a_shift_is_caught_as_often_as_the_power_says() -> None:
    q = _positions(8000, 0)
    power = power_against_a_shift(q, 0.02, 1e-3, replicas=100)
    moved = q[:, 0].clamp(max=0.02)
    shifted = q.clone()
    shifted[:, 0] -= moved
    shifted[:, 1] += moved
    gen = torch.Generator().manual_seed(7)
    caught = sum(chi_square_p(q, torch.multinomial(shifted.float(), 1, generator=gen)[:, 0]) < 1e-3
                 for _ in range(100)) / 100
    assert abs(caught - power) < 0.15 and power > 0.5
    assert power_against_a_shift(q, 0.0, 1e-3, replicas=100) < 0.05  # no shift: the test's own level


def test_our_engines_samples_pass_and_a_hotter_sampler_fails() -> None:
    from specactor.protocol import SamplingParams
    from specactor.engine.llm_engine import Engine
    from specactor.engine.sequence import Sequence
    from tests.conftest import ours_from_hf, tiny_hf_model

    model = ours_from_hf(tiny_hf_model("llama", seed=3, vocab=256))
    with torch.no_grad():  # a random model is nearly flat: sharpen it so that ranks matter
        model.lm_head.weight.mul_(3.0)
    seqs = [Sequence(f"r{i}", [1 + i, 2, 3], SamplingParams(temperature=1.0, max_tokens=150), seed=i)
            for i in range(16)]
    Engine(model, max_batch=16, max_len=160, pack=False).run(seqs)
    q, draws, wrong = score(model, [(s.prompt_ids, s.output_ids) for s in seqs], wrong_temperature=2.0)
    assert len(draws) == sum(len(s.output_ids) for s in seqs)
    assert chi_square_p(q, draws) > 1e-3
    assert chi_square_p(q, wrong) < 1e-3


@settings(deadline=None)
@given(x=st.floats(0, 400), dof=st.integers(1, 5))
def test_the_chi_square_tail_is_scipys(x: float, dof: int) -> None:
    from scipy import stats

    from specactor.bench.calibration import chi2_sf

    assert abs(chi2_sf(x, dof) - float(stats.chi2.sf(x, dof))) < 1e-9
