"""The model shapes the GPU benches name: one table for the measured profile (random weights of the
shape, ``bench/cost_profile.py --shape``) and the modelled one (``bench/roofline_profile.py``).

Each shape is the public config of the model, in Hugging Face's keys, so a measured profile builds
exactly that network; the roofline reads its parameter count and attention widths from the same
config. No torch at import: the roofline runs without it (:func:`random_model` imports it when
called).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from specactor.engine.model import CausalLM

#: public configs (Llama: tied embeddings, no biases; Qwen2: q/k/v biases)
SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4),
    "qwen2.5-32b": dict(model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                        num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8),
}


def hf_config(name: str) -> dict:
    """Shape ``name``'s config as a checkpoint's config.json would give it (RoPE settings added:
    they change no forward's cost)."""
    return {**SHAPES[name], "rope_theta": 1e6, "max_position_embeddings": 32768}


def random_model(shape: str, dtype: torch.dtype, device: str) -> CausalLM:
    """A model of ``shape`` (a key of :data:`SHAPES`) with random weights, built in ``dtype`` on
    ``device`` (no copy through the host): a forward's time does not depend on the weights' values,
    so a profile of a 7B or 32B target needs no download."""
    import torch

    from specactor.engine.config import ModelConfig
    from specactor.engine.model import CausalLM

    cfg = ModelConfig.from_hf(hf_config(shape))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype: a 32B model in float32 first would not fit
    try:
        with torch.device(device):
            model = CausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    return model.eval()


@dataclass(frozen=True)
class ModelShape:
    """What a roofline needs of a model: parameters read a step, depth, attention widths."""

    params_b: float  # parameters, billions
    layers: int
    q_dim: int  # attention heads x head dim
    kv_dim: int  # key-value heads x head dim
    bytes_per_param: int = 2  # bf16


def model_shape(name: str) -> ModelShape:
    """The roofline's figures for shape ``name`` (a key of :data:`SHAPES`), counted from its config:
    embedding (and an untied head), per layer the attention projections (with Qwen2's q/k/v
    biases), the gated MLP and two norms, and the final norm."""
    cfg = SHAPES[name]
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = hidden // cfg["num_attention_heads"]
    q_dim, kv_dim = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    embed = cfg["vocab_size"] * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    attention = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden
    if cfg["model_type"] == "qwen2":
        attention += q_dim + 2 * kv_dim
    layer = attention + 3 * hidden * cfg["intermediate_size"] + 2 * hidden
    return ModelShape((embed + layers * layer + hidden) / 1e9, layers, q_dim, kv_dim)
