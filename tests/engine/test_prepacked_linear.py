"""Prepacked linears: the same function as the dense layer, rows independent of the batch,
and weight updates that reach the packed copy."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.engine.kv_cache import KVCache
from specactor.engine.prepacked_linear import PackedLinear, packing_available

pytestmark = pytest.mark.skipif(not packing_available(torch.zeros(1)), reason="this torch has no oneDNN packing")


def test_packed_linear_computes_the_dense_layer() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=True)
    packed = PackedLinear.from_linear(linear)
    x = torch.randn(7, 48)
    torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed.dense(), linear.weight.detach(), rtol=1e-6, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 80), row=st.integers(0, 79))
def test_a_rows_result_does_not_depend_on_the_rows_fed_with_it(rows: int, row: int) -> None:
    """What lets a verify step (many rows) give the logits a decode step (one row) gives."""
    torch.manual_seed(rows)
    packed = PackedLinear(torch.randn(96, 64))
    x = torch.randn(rows, 64)
    row = row % rows
    assert torch.equal(packed(x)[row], packed(x[row:row + 1])[0])


def test_load_repacks_and_checks_the_shape() -> None:
    packed = PackedLinear(torch.zeros(8, 4))
    new = torch.randn(8, 4)
    packed.load(new)
    torch.testing.assert_close(packed(torch.eye(4)), new.t(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        packed.load(torch.zeros(4, 8))


def test_a_packed_model_gives_the_dense_models_logits_and_takes_updates(tiny_pair) -> None:
    hf, ours = tiny_pair
    dense = ours
    packed = copy.deepcopy(ours)
    assert packed.pack() and isinstance(packed.lm_head, PackedLinear)
    tokens = torch.randint(0, dense.cfg.vocab_size, (12,))

    def logits(model):
        cache = KVCache(model.cfg, 2, 32)
        return model(tokens, [5, 7], cache)

    torch.testing.assert_close(logits(packed), logits(dense), rtol=1e-4, atol=1e-4)
    # a weight update (tied head included) reaches the packed copies
    state = {k: v + 0.01 * torch.randn_like(v) for k, v in hf.state_dict().items()}
    hf_updated = copy.deepcopy(hf)
    hf_updated.load_state_dict(state)
    packed.load_hf_state_dict(state)
    dense_updated = copy.deepcopy(dense)
    dense_updated.load_hf_state_dict(state)
    torch.testing.assert_close(logits(packed), logits(dense_updated), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits(packed), logits(dense), rtol=1e-3, atol=1e-3)


def test_packing_is_refused_where_onednn_cannot_run_it() -> None:
    assert not packing_available(torch.zeros(2, dtype=torch.bfloat16))
    assert not packing_available(torch.zeros(2, dtype=torch.float64))
