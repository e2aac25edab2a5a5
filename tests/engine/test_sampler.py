"""Position-keyed sampling: unbiased, truncation-respecting, batch-independent."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specactor.engine.sampler import SamplingBatch, gumbel_noise, sample, token_uniforms, uniform_noise

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def _frequencies(logits: torch.Tensor, n: int, position: int = 7, **params: float) -> torch.Tensor:
    rows = [(params.get("temperature", 1.0), int(params.get("top_k", 0)), params.get("top_p", 1.0), seed, position)
            for seed in range(n)]
    tokens, _ = sample(logits.expand(n, -1), SamplingBatch.build(rows))
    return torch.bincount(tokens, minlength=logits.numel()).double()


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() / probs.double().sum() * counts.sum()
    return float(stats.chisquare(counts.numpy(), expected.numpy()).pvalue)


def test_frequencies_match_softmax_at_temperature_1() -> None:
    counts = _frequencies(LOGITS, 40_000)
    assert _chi_square_p(counts, torch.softmax(LOGITS, -1).double()) > 1e-3


def test_frequencies_match_softmax_at_temperature_0_7() -> None:
    counts = _frequencies(LOGITS, 40_000, temperature=0.7)
    assert _chi_square_p(counts, torch.softmax(LOGITS / 0.7, -1).double()) > 1e-3


def test_chi_square_catches_a_biased_sampler() -> None:
    """The same test must reject a sampler that is slightly off (T=1.1 for 1.0)."""
    counts = _frequencies(LOGITS, 40_000, temperature=1.1)
    assert _chi_square_p(counts, torch.softmax(LOGITS, -1).double()) < 1e-6


def test_frequencies_are_unbiased_across_positions_too() -> None:
    """Fix the seed, vary the position: also the right distribution."""
    n = 30_000
    rows = [(1.0, 0, 1.0, 12345, t) for t in range(n)]
    tokens, _ = sample(LOGITS.expand(n, -1), SamplingBatch.build(rows))
    counts = torch.bincount(tokens, minlength=LOGITS.numel()).double()
    assert _chi_square_p(counts, torch.softmax(LOGITS, -1).double()) > 1e-3


def test_top_k_never_emits_a_truncated_token() -> None:
    counts = _frequencies(LOGITS, 5000, top_k=2)
    assert counts[2:].sum() == 0 and counts[:2].min() > 0
    kept = torch.softmax(LOGITS[:2], -1).double()
    assert _chi_square_p(counts[:2], kept) > 1e-3


def test_top_p_never_emits_a_truncated_token() -> None:
    probs = torch.softmax(LOGITS, -1)  # [0.52, 0.19, 0.12, 0.07, 0.03, 0.003]
    counts = _frequencies(LOGITS, 5000, top_p=0.8)  # nucleus: first 3 tokens (0.52+0.19 < 0.8)
    assert counts[3:].sum() == 0 and counts[:3].min() > 0
    assert _chi_square_p(counts[:3], (probs[:3] / probs[:3].sum()).double()) > 1e-3


def test_greedy_is_argmax_and_logprobs_are_before_truncation() -> None:
    rows = [(0.0, 0, 1.0, 1, 0), (1.0, 2, 1.0, 3, 0), (0.5, 0, 0.5, 3, 9)]
    tokens, logprobs = sample(LOGITS.expand(3, -1), SamplingBatch.build(rows))
    assert tokens[0] == 0
    full = [torch.log_softmax(LOGITS, -1), torch.log_softmax(LOGITS, -1), torch.log_softmax(LOGITS / 0.5, -1)]
    for i in range(3):
        assert abs(logprobs[i].item() - full[i][tokens[i]].item()) < 1e-6


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    position=st.integers(0, 100_000),
    others=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 100_000)), max_size=6),
    where=st.integers(0, 6),
)
def test_noise_depends_only_on_seed_position_token(seed, position, others, where) -> None:
    """The same (seed, t) row gets the same noise wherever it sits in any batch."""
    alone = uniform_noise(torch.tensor([seed]), torch.tensor([position]), 500)[0]
    rows = list(others)
    rows.insert(min(where, len(rows)), (seed, position))
    batch = uniform_noise(torch.tensor([s for s, _ in rows]), torch.tensor([t for _, t in rows]), 500)
    assert torch.equal(batch[min(where, len(others))], alone)
    assert bool(((alone > 0) & (alone < 1)).all())


@settings(max_examples=50, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 100_000), st.integers(0, 499)),
                     min_size=1, max_size=8))
def test_one_token_s_uniform_is_that_token_s_entry_of_the_full_row(rows) -> None:
    """What a drafter reads of its own token's noise is exactly what the sampler uses."""
    seeds, positions, tokens = (torch.tensor(column) for column in zip(*rows))
    full = uniform_noise(seeds, positions, 500)
    assert torch.equal(token_uniforms(seeds, positions, tokens, 500), full[torch.arange(len(rows)), tokens])


def test_different_seeds_and_positions_give_different_noise() -> None:
    g = gumbel_noise(torch.tensor([1, 2, 1]), torch.tensor([5, 5, 6]), 1000)
    assert not torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    # noise is not correlated across tokens or rows
    assert abs(torch.corrcoef(g[:2])[0, 1].item()) < 0.1


def _rows_hitting_the_top_uniform(vocab: int, wanted: int = 3) -> list[tuple[int, int]]:
    """(row of seeds 0.., token) pairs whose 24-bit uniform is the largest one, 2**24 - 1
    (about one row in 340 over a 49k vocabulary)."""
    from specactor.engine.sampler import _as_i32, _fmix32_i32, _token_key, row_keys

    seeds = torch.arange(4096, dtype=torch.int64)
    keys = _as_i32(row_keys(seeds, torch.zeros_like(seeds)))
    found = []
    for lo in range(0, len(seeds), 256):
        bits = _fmix32_i32(keys[lo:lo + 256, None] ^ _token_key(vocab, seeds.device)[None, :])
        rows, tokens = torch.nonzero(((bits >> 8) & 0xFFFFFF) == 0xFFFFFF, as_tuple=True)
        found += [(lo + int(r), int(t)) for r, t in zip(rows, tokens)]
        if len(found) >= wanted:
            break
    return found[:wanted]


def test_the_largest_uniform_gives_finite_noise_and_does_not_pick_the_token() -> None:
    """float32 rounds (2**24 - 1 + 0.5) / 2**24 to 1.0, whose Gumbel value is +inf: unclamped,
    that token won the argmax whatever its probability (and, truncated, gave a NaN that argmax
    also picks) at ~0.3% of sampled positions. The noise must stay finite, and a token the
    model gives no chance must never be sampled, nor one that top-k removed."""
    vocab = 49152
    hits = _rows_hitting_the_top_uniform(vocab)
    assert hits, "no (seed, token) with the largest uniform among 4096 seeds"
    seeds = torch.tensor([s for s, _ in hits])
    positions = torch.zeros_like(seeds)
    noise = gumbel_noise(seeds, positions, vocab)
    assert bool(torch.isfinite(noise).all()) and float(noise.max()) < 17.0
    uniforms = uniform_noise(seeds, positions, vocab)
    assert bool((uniforms < 1).all())
    for seed, token in hits:
        logits = torch.zeros(1, vocab)
        logits[0, token] = -1e4  # no chance at all under the model
        for top_k in (0, 5):
            params = SamplingBatch.build([(1.0, top_k, 1.0, seed, 0)])
            picked, logprob = sample(logits, params)
            assert int(picked) != token and bool(torch.isfinite(logprob).all())


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from([0.0, 0.7, 1.0]), st.sampled_from([0, 3]),
                               st.sampled_from([1.0, 0.8]), st.integers(0, 2**62), st.integers(0, 4096)),
                     min_size=1, max_size=20),
       block=st.sampled_from([8, 3, 64]))
def test_what_the_host_knows_changes_no_sample(rows, block) -> None:
    """The batch's host-side flags (which rows are greedy, whether any truncates) spare the device
    its questions; blocks of any size (a GPU samples all rows as one): the same tokens and
    log-probs as asking the tensors."""
    import dataclasses

    from specactor.engine import sampler

    logits = torch.randn(len(rows), 300, generator=torch.Generator().manual_seed(len(rows)))
    informed = SamplingBatch.build(rows)
    blind = dataclasses.replace(informed, greedy_rows=None, truncates=None)
    want = sample(logits, blind)
    saved = sampler.BLOCK_ROWS
    sampler.BLOCK_ROWS = block
    try:
        got = sample(logits, informed)
    finally:
        sampler.BLOCK_ROWS = saved
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
