"""Load a Hugging Face checkpoint folder (safetensors) into :class:`CausalLM`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from specactor.engine.config import ModelConfig
from specactor.engine.model import CausalLM


def load_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    return state


def load_causal_lm(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> CausalLM:
    """Build the model from ``folder/config.json`` and load its weights."""
    cfg = ModelConfig.from_dir(folder)
    with torch.device(device):
        model = CausalLM(cfg).to(dtype)
    model.load_hf_state_dict(load_state_dict(folder))
    return model.eval()
