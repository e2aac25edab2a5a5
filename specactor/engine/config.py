"""Model configuration for the Llama and Qwen2 families, read from config.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported: use one of {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        # transformers 5 folds rope settings into rope_parameters; older
        # configs have rope_theta plus an optional rope_scaling dict.
        rope = dict(cfg.get("rope_parameters") or {})
        scaling = dict(cfg.get("rope_scaling") or rope)
        theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or hidden // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama has them only if attention_bias.
            attention_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            rope_scaling={k: v for k, v in scaling.items() if k != "rope_theta"},
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        return cls.from_hf(json.loads((Path(path) / "config.json").read_text()))


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse RoPE frequencies with the config's scaling applied.

    Supports the default, ``linear`` and ``llama3`` rope types (what Llama and
    Qwen2 checkpoints use); anything else is refused rather than silently wrong.
    """
    dim = cfg.head_dim
    # float32 as in transformers, so that cos/sin tables agree bit for bit
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type", "default")) or "default"
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(cfg.rope_scaling["factor"])
    if kind == "llama3":
        factor = float(cfg.rope_scaling["factor"])
        low = float(cfg.rope_scaling.get("low_freq_factor", 1.0))
        high = float(cfg.rope_scaling.get("high_freq_factor", 4.0))
        old_ctx = float(cfg.rope_scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"rope scaling type {kind!r} is not supported (default, linear, llama3 are)")
