"""The one seed rule: a sample's seed depends on (seed, request id, sample index) only."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from specactor.protocol import SamplingParams
from specactor.calls import RESERVED_REQUEST_IDS, expand, normalise
from specactor.seeds import derive_seed, sample_seed

ids = st.text(min_size=1, max_size=12).filter(lambda s: s not in RESERVED_REQUEST_IDS)  # "*" is refused


def _seeds(prompts: list[list[int]], params, request_ids, default_seed: int = 0) -> dict[str, int]:
    jobs = expand(normalise(prompts, params, request_ids, None), vocab_size=100, max_len=1024,
                  default_seed=default_seed)
    return {job.request_id: job.params.seed for job in jobs}


@given(seed=st.integers(0, 2**40), rid=ids, others=st.lists(ids, max_size=4, unique=True), n=st.integers(1, 4))
def test_a_requests_seeds_do_not_depend_on_the_batch(seed: int, rid: str, others: list[str], n: int) -> None:
    others = [o for o in others if o != rid]
    params = SamplingParams(seed=seed, n=n)
    alone = _seeds([[1]], params, [rid])
    together = _seeds([[5, 6]] * len(others) + [[1]], params, others + [rid])
    assert {k: together[k] for k in alone} == alone
    assert [alone[k] for k in alone] == [sample_seed(seed, rid, s) for s in range(n)]


def test_sample_zero_has_the_same_seed_for_n_1_and_n_4() -> None:
    one = _seeds([[1]], SamplingParams(seed=5, n=1), ["x"])
    four = _seeds([[1]], SamplingParams(seed=5, n=4), ["x"])
    assert one["x"] == four["x#0"]


def test_prompts_in_one_batch_get_unrelated_noise() -> None:
    seeds = _seeds([[1], [1]], SamplingParams(seed=5, n=2), ["a", "b"])
    assert len(set(seeds.values())) == 4


def test_no_seed_means_the_engines_default_seed() -> None:
    assert _seeds([[1]], SamplingParams(), ["x"], default_seed=9)["x"] == sample_seed(9, "x", 0)
    assert _seeds([[1]], SamplingParams(), ["x"], default_seed=9) != _seeds([[1]], SamplingParams(), ["x"])


def test_unnamed_requests_get_fresh_ids_and_so_fresh_noise() -> None:
    a = _seeds([[1]], SamplingParams(seed=1), None)
    b = _seeds([[1]], SamplingParams(seed=1), None)
    assert set(a) != set(b) and set(a.values()) != set(b.values())


def test_derive_seed_is_stable_across_processes() -> None:
    # blake2b, not Python's salted hash(): a checkpointed RL run resumes with the same seeds
    assert derive_seed(7, "HumanEval/0", 0) == 8199821926298780868


def test_the_single_form_names_one_request() -> None:
    call = normalise([3, 4], SamplingParams(n=2), None, "r")
    assert call.single and call.prompt_ids == [[3, 4]] and call.request_ids == ["r"]
    with pytest.raises(ValueError, match="flat list of token ids"):
        normalise([[3, 4]], SamplingParams(), None, "r")
    with pytest.raises(ValueError, match="request_id=..., not request_ids"):
        normalise([3, 4], SamplingParams(), ["r"], None)
    with pytest.raises(ValueError, match="one SamplingParams"):
        normalise([3, 4], [SamplingParams()], None, "r")
