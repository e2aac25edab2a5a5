"""One table of model shapes: the roofline's parameter counts are the networks' that
``bench/cost_profile.py --shape`` builds, and the models' published sizes."""

from __future__ import annotations

import pytest
import torch

from specactor.bench.model_shapes import SHAPES, hf_config, model_shape
from specactor.engine.config import ModelConfig
from specactor.engine.model import CausalLM


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_roofline_counts_the_parameters_of_the_network_built(name: str) -> None:
    cfg = ModelConfig.from_hf(hf_config(name))
    with torch.device("meta"):  # shapes only: a 32B model allocates nothing
        model = CausalLM(cfg)
    built = sum(p.numel() for p in model.parameters())
    shape = model_shape(name)
    assert shape.params_b * 1e9 == pytest.approx(built, abs=0.5)
    assert shape.layers == cfg.num_layers
    assert (shape.q_dim, shape.kv_dim) == (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim)


def test_the_counts_are_the_models_published_sizes() -> None:
    sizes = {name: model_shape(name).params_b for name in SHAPES}
    assert sizes["qwen2.5-7b"] == pytest.approx(7.62, abs=0.01)  # Qwen2.5-7B: 7.61B
    assert sizes["qwen2.5-32b"] == pytest.approx(32.76, abs=0.01)  # Qwen2.5-32B: 32.8B
    assert sizes["smollm2-135m"] == pytest.approx(0.1345, abs=0.001)  # SmolLM2-135M
