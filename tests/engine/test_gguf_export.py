"""The target's weights written as a quantised GGUF: read back, they are the weights (exactly in
float32, within the quantisation's step otherwise); llama.cpp, where installed, computes the
target's logits from them; bad input is refused by name and leaves no file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from specactor.engine.config import ModelConfig
from specactor.engine.gguf_export import QUANTS, permute_rope, write_gguf
from specactor.engine.model_registry import hf_name, unpermute_rope
from tests.conftest import ours_from_hf, tiny_hf_model

gguf = pytest.importorskip("gguf")

def _read(path: Path, cfg: ModelConfig, arch: str) -> dict[str, np.ndarray]:
    """The file's tensors under Hugging Face names and layout, dequantised."""
    from gguf.quants import dequantize

    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if arch == "llama" and t.name.endswith("attn_q.weight"):
            w = unpermute_rope(w, cfg.num_heads)
        elif arch == "llama" and t.name.endswith("attn_k.weight"):
            w = unpermute_rope(w, cfg.num_kv_heads)
        out[hf_name(t.name)] = w
    return out


def _tiny(kind: str):
    hf = tiny_hf_model(kind, seed=5)
    return ModelConfig.from_hf(hf.config.to_dict()), hf.state_dict(), hf


def test_the_rotary_permutation_is_undone_by_the_reader_s_inverse() -> None:
    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    assert np.array_equal(unpermute_rope(permute_rope(w, 2), 2), w)
    assert not np.array_equal(permute_rope(w, 2), w)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_read_back_the_weights_are_the_targets_within_the_quantisation_step(kind: str, tmp_path: Path) -> None:
    cfg, state, _ = _tiny(kind)
    arch = "llama" if kind == "llama" else "qwen2"
    errors, sizes = {}, {}
    for quant, step in (("f32", 0.0), ("q8_0", 1 / 250), ("q4_0", 1 / 7)):
        path = write_gguf(cfg, state, tmp_path / f"{quant}.gguf", quant=quant)
        sizes[quant] = path.stat().st_size
        back = _read(path, cfg, arch)
        expected = {n: t for n, t in state.items() if not (cfg.tie_word_embeddings and n == "lm_head.weight")}
        assert back.keys() == expected.keys()
        worst = 0.0
        for name, tensor in expected.items():
            w = tensor.float().numpy()
            diff, largest = float(np.abs(back[name] - w).max()), float(np.abs(w).max()) or 1.0
            # a block's step is its largest magnitude over 127 (8-bit) or 8 (4-bit): half a step at most
            assert diff <= step * largest + 1e-7, (quant, name, diff)
            worst = max(worst, diff / largest)
        errors[quant] = worst
    assert errors["f32"] == 0.0 < errors["q8_0"] < errors["q4_0"]  # quantised, and 4 bits coarser than 8
    assert sizes["q4_0"] < sizes["q8_0"] < sizes["f32"]


def test_the_file_says_what_llama_cpp_needs_and_no_tokenizer(tmp_path: Path) -> None:
    cfg, state, _ = _tiny("llama")
    reader = gguf.GGUFReader(write_gguf(cfg, state, tmp_path / "m.gguf"))

    def field(key: str):
        value = reader.fields[key].contents()
        return value.item() if isinstance(value, np.generic) else value

    assert field("general.architecture") == "llama"
    assert field("tokenizer.ggml.model") == "none"  # token ids only: llama.cpp adds placeholder tokens
    assert (field("llama.vocab_size"), field("llama.block_count"), field("llama.embedding_length")) == \
        (cfg.vocab_size, cfg.num_layers, cfg.hidden_size)
    assert (field("llama.attention.head_count"), field("llama.attention.head_count_kv")) == (4, 2)
    assert field("llama.rope.freq_base") == pytest.approx(cfg.rope_theta)
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied: llama.cpp reads the embedding


def test_bad_input_is_refused_by_name_and_leaves_no_file(tmp_path: Path) -> None:
    cfg, state, _ = _tiny("llama")
    with pytest.raises(ValueError, match="'int3'.*q8_0"):
        write_gguf(cfg, state, tmp_path / "a.gguf", quant="int3")
    missing = {n: t for n, t in state.items() if "layers.1.mlp.up_proj" not in n}
    with pytest.raises(ValueError, match="missing.*layers.1.mlp.up_proj"):
        write_gguf(cfg, missing, tmp_path / "b.gguf")
    misshapen = dict(state, **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(3,\)"):
        write_gguf(cfg, misshapen, tmp_path / "c.gguf")
    gemma = ModelConfig(**{**cfg.__dict__, "model_type": "gemma"})
    with pytest.raises(ValueError, match="gemma"):
        write_gguf(gemma, state, tmp_path / "d.gguf")
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind
    assert set(QUANTS) >= {"q8_0", "q4_0"}


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_llama_cpp_computes_the_targets_logits_from_the_file(kind: str, tmp_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's binding is not installed")
    cfg, state, hf = _tiny(kind)
    path = write_gguf(cfg, state, tmp_path / "m.gguf", quant="f32")
    llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    tokens = [1, 17, 42, 99, 3, 250, 7, 8]
    llm.eval(tokens)
    theirs = np.asarray(llm.scores[:len(tokens)], dtype=np.float32)
    ours = ours_from_hf(hf)
    with torch.inference_mode():
        expected = hf(torch.tensor([tokens])).logits[0].float().numpy()
    assert ours is not None
    assert np.abs(theirs - expected).max() < 1e-3 * max(1.0, float(np.abs(expected).max()))
    assert (theirs.argmax(-1) == expected.argmax(-1)).all()


def test_scaled_rope_is_written_as_llama_cpp_s_frequency_divisors(tmp_path: Path) -> None:
    from specactor.engine.config import rope_inv_freq

    cfg, state, _ = _tiny("llama")
    scaled = ModelConfig(**{**cfg.__dict__, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                             "original_max_position_embeddings": 64}})
    reader = gguf.GGUFReader(write_gguf(scaled, state, tmp_path / "m.gguf"))
    (freqs,) = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    expected = rope_inv_freq(cfg) / rope_inv_freq(scaled)
    assert np.allclose(np.asarray(freqs.data), expected.numpy(), rtol=1e-6)
    assert (expected > 1).any()  # the low frequencies are stretched
    qwen_cfg, qwen_state, _ = _tiny("qwen2")
    with pytest.raises(ValueError, match="'linear'.*qwen2"):
        write_gguf(ModelConfig(**{**qwen_cfg.__dict__, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
                   qwen_state, tmp_path / "q.gguf")
