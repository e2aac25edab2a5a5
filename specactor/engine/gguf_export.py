"""The target's current weights as a GGUF file, quantised, for a drafter on low-bit kernels.

A quantised copy of the policy that samples with the policy's own position-keyed
noise is right on nearly every position, even at T=1; llama.cpp runs such a copy
on kernels made for 8- and 4-bit weights. This module writes that copy from
Hugging Face-named weights (a checkpoint as loaded, or a weight update as it
arrives), so the copy can be re-made at every RL step, from whatever weights the
target serves.

The file carries no tokenizer: a drafter exchanges token ids only, so the
vocabulary is ``tokenizer.ggml.model = "none"`` with ``vocab_size`` placeholder
tokens, which llama.cpp loads as is. Llama-family weights are written as the
``llama`` architecture (q and k rows permuted to llama.cpp's rotary layout, as its
own converter does); Qwen2's (attention biases, half-split rotary) as ``qwen2``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

from specactor.engine.config import ModelConfig
from specactor.engine.model_registry import GGUF_GLOBAL_NAMES, GGUF_LAYER_NAMES

#: quantisation name -> llama.cpp's tensor type name (gguf.GGMLQuantizationType)
QUANTS = {"q8_0": "Q8_0", "q4_0": "Q4_0", "f16": "F16", "f32": "F32"}
DEFAULT_QUANT = "q8_0"

#: Hugging Face names -> GGUF names, the reader's tables turned round
_LAYER_TENSORS = {hf: gguf_name for gguf_name, hf in GGUF_LAYER_NAMES.items()}
_GLOBAL_TENSORS = {hf: gguf_name for gguf_name, hf in GGUF_GLOBAL_NAMES.items()}


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face's q/k rows (RoPE on the two halves of a head) in llama.cpp's order (RoPE on
    adjacent pairs); :func:`specactor.engine.model_registry.unpermute_rope` is its inverse."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_architecture(cfg: ModelConfig) -> str:
    """llama.cpp's architecture name for ``cfg``; ValueError for a model this layout cannot hold."""
    if cfg.model_type == "qwen2":
        return "qwen2"
    if cfg.model_type in ("llama", "mistral"):
        if cfg.attention_bias:
            raise ValueError(f"{cfg.model_type} weights with attention biases have no GGUF layout here")
        return "llama"
    raise ValueError(f"model type {cfg.model_type!r} cannot be written as GGUF (llama and qwen2 families can)")


def _rope_factors(cfg: ModelConfig, arch: str) -> np.ndarray | None:
    """RoPE scaling as llama.cpp reads it: per-frequency divisors (``rope_freqs.weight``), what its
    own converter writes for llama3; None for unscaled RoPE."""
    import dataclasses

    from specactor.engine.config import rope_inv_freq

    kind = cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type", "default")) or "default"
    if kind == "default":
        return None
    if arch != "llama":
        raise ValueError(f"rope scaling {kind!r} cannot be written as GGUF for {arch}")
    plain = rope_inv_freq(dataclasses.replace(cfg, rope_scaling={}))
    return (plain / rope_inv_freq(cfg)).numpy().astype(np.float32)


def _tensor_name(hf_name: str) -> str:
    """The GGUF name of a Hugging Face weight: the inverse of the reader's table
    (:data:`specactor.engine.model_registry.GGUF_LAYER_NAMES`)."""
    if hf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[hf_name]
    parts = hf_name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"]:
        module = ".".join(parts[3:-1])
        if module in _LAYER_TENSORS:
            return f"blk.{int(parts[2])}.{_LAYER_TENSORS[module]}.{parts[-1]}"
    raise ValueError(f"weight {hf_name!r} has no GGUF name")


def write_gguf(cfg: ModelConfig, state: Mapping[str, object], path: str | os.PathLike[str], *,
               quant: str = DEFAULT_QUANT, name: str = "specactor-draft") -> Path:
    """Write ``state`` (Hugging Face names: a checkpoint or a full weight update, torch tensors or
    numpy arrays) as a GGUF at ``path``, matrices quantised to ``quant`` (vectors and matrices
    whose rows do not fill whole blocks stay float32, as llama.cpp's own converter keeps them).
    Atomic: a reader never sees half a file. ValueError names a bad ``quant``, a missing or
    misshapen weight, or a model this layout cannot hold."""
    import gguf
    from gguf.quants import quantize

    from specactor.engine.model import hf_shapes

    if quant not in QUANTS:
        raise ValueError(f"draft quantisation {quant!r}: choose one of {', '.join(QUANTS)}")
    arch = gguf_architecture(cfg)
    rope_factors = _rope_factors(cfg, arch)
    qtype = gguf.GGMLQuantizationType[QUANTS[quant]]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    shapes = hf_shapes(cfg)
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight")  # llama.cpp reads the embedding where the file has no output.weight
    missing = [n for n in shapes if n not in state]
    if missing:
        raise ValueError(f"{len(missing)} weights missing, e.g. {missing[0]!r}")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        writer.add_name(name)
        writer.add_context_length(cfg.max_position_embeddings)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_block_count(cfg.num_layers)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_head_count(cfg.num_heads)
        writer.add_head_count_kv(cfg.num_kv_heads)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_rope_dimension_count(cfg.head_dim)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_tokenizer_model("none")  # token ids only: llama.cpp adds vocab_size placeholder tokens
        writer.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{QUANTS[quant]}"]) if quant not in ("f32",)
                             else int(gguf.LlamaFileType.ALL_F32))
        for hf_name, shape in shapes.items():
            value = state[hf_name]
            w = np.ascontiguousarray(value.detach().float().cpu().numpy() if hasattr(value, "detach")
                                     else np.asarray(value, dtype=np.float32))
            if tuple(w.shape) != tuple(shape):
                raise ValueError(f"weight {hf_name!r} has shape {tuple(w.shape)}, the model needs {tuple(shape)}")
            if arch == "llama" and hf_name.endswith("q_proj.weight"):
                w = permute_rope(w, cfg.num_heads)
            elif arch == "llama" and hf_name.endswith("k_proj.weight"):
                w = permute_rope(w, cfg.num_kv_heads)
            if w.ndim == 2 and w.shape[1] % block == 0 and qtype != gguf.GGMLQuantizationType.F32:
                writer.add_tensor(_tensor_name(hf_name), quantize(w, qtype), raw_dtype=qtype)
            else:
                writer.add_tensor(_tensor_name(hf_name), w.astype(np.float32))
        if rope_factors is not None:  # llama.cpp divides its RoPE frequencies by these (llama3, linear)
            writer.add_tensor("rope_freqs.weight", rope_factors)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
