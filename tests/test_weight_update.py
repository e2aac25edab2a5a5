"""Weight updates: chunking round-trips every tensor exactly, bad updates are refused
before anything changes, and a model drafter loads new weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor import protocol as p
from specactor.drafters.base import DraftState
from specactor.drafters.model import ModelDrafter
from specactor.weight_update import WeightStaging, checked_update, chunk_state_dict
from tests.conftest import ours_from_hf, tiny_hf_model

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@settings(max_examples=60, deadline=None)
@given(shapes=st.lists(st.lists(st.integers(0, 7), min_size=0, max_size=3), min_size=1, max_size=4),
       dtype=st.sampled_from(DTYPES), chunk_bytes=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_chunks_reassemble_every_tensor_bit_for_bit(shapes, dtype, chunk_bytes, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    state = {f"w{i}": torch.randn(tuple(shape), generator=g).to(dtype) for i, shape in enumerate(shapes)}
    staging = WeightStaging()
    chunks = list(chunk_state_dict("u", state, chunk_bytes))
    for chunk in reversed(chunks):  # order does not matter
        staging.add(p.decode(p.encode(chunk)))  # through the wire format
    out = staging.state_dict()
    assert out.keys() == state.keys()
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name].view(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_inconsistent_or_incomplete_chunks_are_named() -> None:
    state = {"a": torch.arange(6, dtype=torch.float32)}
    first, *rest = chunk_state_dict("u", state, 8)
    staging = WeightStaging()
    staging.add(first)
    with pytest.raises(ValueError, match="'a': received 8 of 24 bytes"):
        staging.state_dict()
    with pytest.raises(ValueError, match="disagree on dtype/shape"):
        staging.add(p.WeightsChunk(update_id="u", name="a", dtype="float32", shape=[3, 2], offset=8, total=24,
                                   data=b"\0" * 8))
    with pytest.raises(ValueError, match="outside its 24 bytes"):
        staging.add(p.WeightsChunk(update_id="u", name="a", dtype="float32", shape=[6], offset=20, total=24,
                                   data=b"\0" * 8))
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        staging.add(p.WeightsChunk(update_id="u", name="b", dtype="int4", shape=[1], offset=0, total=1, data=b""))
    with pytest.raises(ValueError, match="cannot be sent"):
        list(chunk_state_dict("u", {"c": torch.zeros(2, dtype=torch.int64)}))


def test_checked_update_refuses_what_does_not_fit_the_model() -> None:
    model = ours_from_hf(tiny_hf_model("llama"))  # tied embeddings: lm_head optional
    good = tiny_hf_model("llama", seed=1).state_dict()
    checked_update(model, good)
    checked_update(model, {k: v for k, v in good.items() if k != "lm_head.weight"})
    with pytest.raises(ValueError, match="missing 1 weight"):
        checked_update(model, {k: v for k, v in good.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match="unknown weight"):
        checked_update(model, {**good, "model.extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="has shape \\[3\\], the model needs \\[64\\]"):
        checked_update(model, {**good, "model.norm.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match="NaN or infinite"):
        checked_update(model, {**good, "model.norm.weight": torch.full((64,), float("nan"))})
    untied = ours_from_hf(tiny_hf_model("qwen2"))
    with pytest.raises(ValueError, match="missing 1 weight.*lm_head"):
        checked_update(untied, {k: v for k, v in tiny_hf_model("qwen2").state_dict().items()
                                if k != "lm_head.weight"})


@pytest.mark.parametrize("quant", ["fp32", "bf16"])
def test_model_drafter_drafts_with_the_new_weights(quant) -> None:
    old, new = tiny_hf_model("llama", seed=0), tiny_hf_model("llama", seed=1)
    as_drafter = {"fp32": lambda m: m, "bf16": lambda m: m.to(torch.bfloat16)}[quant]
    updated = ModelDrafter(as_drafter(ours_from_hf(old)), max_slots=2, max_len=64, noise="shared", quant=quant)
    fresh = ModelDrafter(as_drafter(ours_from_hf(new)), max_slots=2, max_len=64, noise="shared", quant=quant)
    states = {d: DraftState("r", [5, 6, 7, 8], committed=[9], seed=3, temperature=1.0) for d in ("updated", "fresh")}
    updated.start(states["updated"])
    fresh.start(states["fresh"])
    before = updated.propose([states["updated"]], 4)  # caches the context with the old weights
    updated.load_weights(new.state_dict())
    after = updated.propose([states["updated"]], 4)
    assert after == fresh.propose([states["fresh"]], 4)
    assert before != after
    assert torch.equal(updated.model.embed.weight, fresh.model.embed.weight)
    with pytest.raises(ValueError, match="missing"):
        updated.load_weights({})
    assert updated.propose([states["updated"]], 4) == after  # a refused update changes nothing


def test_chunks_are_checked_against_the_model_before_anything_is_allocated() -> None:
    """A one-frame message declaring a 50 GB tensor must be refused, not obeyed."""
    from specactor.weight_update import PendingUpdates

    expected = {"model.norm.weight": (4,)}
    huge = p.WeightsChunk(update_id="u", name="model.norm.weight", dtype="float32", shape=[50 << 30],
                          offset=0, total=4 * (50 << 30), data=b"")
    stranger = p.WeightsChunk(update_id="v", name="evil", dtype="float32", shape=[1 << 40], offset=0,
                              total=4 << 40, data=b"")
    pending = PendingUpdates(expected)
    pending.add(huge)
    pending.add(stranger)
    assert pending.staged_bytes == 0
    _, error = pending.take(p.WeightsCommit(update_id="u", version=1))
    assert "shape [53687091200], the model needs [4]" in error
    _, error = pending.take(p.WeightsCommit(update_id="v", version=1))
    assert "'evil' is not a weight of this model" in error


def test_staged_updates_whose_sender_went_away_expire(monkeypatch) -> None:
    import time as time_module

    from specactor.weight_update import PendingUpdates

    now = [1000.0]
    monkeypatch.setattr(time_module, "monotonic", lambda: now[0])
    pending = PendingUpdates({"w": (2,)}, stale_after_s=60)
    chunk = p.WeightsChunk(update_id="old", name="w", dtype="float32", shape=[2], offset=0, total=8, data=b"\0" * 4)
    pending.add(chunk)
    assert pending.staged_bytes == 8
    now[0] += 61
    pending.add(p.WeightsChunk(update_id="new", name="w", dtype="float32", shape=[2], offset=0, total=8,
                               data=b"\0" * 8))
    assert pending.staged_bytes == 8  # the old update's buffer is gone, the new one's is there
    _, error = pending.take(p.WeightsCommit(update_id="old", version=1))
    assert "expired" in error
    weights, error = pending.take(p.WeightsCommit(update_id="new", version=1))
    assert not error and weights()["w"].tolist() == [0.0, 0.0]
