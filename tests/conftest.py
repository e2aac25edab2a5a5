"""Shared fixtures."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from specactor.events import configure_events

#: where the device-agnostic engine tests run their models: ``SPECACTOR_TEST_DEVICE=cuda`` runs the
#: losslessness properties on a GPU (CI has none, so there they run on the CPU)
TEST_DEVICE = os.environ.get("SPECACTOR_TEST_DEVICE", "cpu")


@pytest.fixture
def events_file(tmp_path: Path) -> Iterator[Callable[[], list[dict]]]:
    """Route events to a temp JSONL file; yields a reader of the events so far."""
    path = tmp_path / "events.jsonl"
    configure_events(path, console_level=None)

    def read() -> list[dict]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    yield read
    configure_events(None, console_level="warning")


# ---------------------------------------------------------------- models

import torch  # noqa: E402
import transformers  # noqa: E402

from specactor.engine.model_registry import resolve_model  # noqa: E402
from specactor.engine.config import ModelConfig  # noqa: E402
from specactor.engine.model import CausalLM  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _packaged_cost_profile() -> Iterator[None]:
    """Every engine a test starts (daemons included) decides on the packaged cost profile: the same
    decisions on every machine, and no start-up spent measuring this one (tests/engine/test_profiling.py
    covers that path on a tiny model)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECACTOR_PROFILE", "packaged")
        yield


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache dir holding the converted default model (converted once per test run)."""
    root = tmp_path_factory.mktemp("specactor-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECACTOR_CACHE", str(root))
        resolve_model(None)
    yield root


@pytest.fixture(scope="session")
def default_model(session_cache: Path):
    """(folder, CausalLM, Tokenizer) of the real default model."""
    from specactor.tokenizer import Tokenizer
    from specactor.engine.weights import load_causal_lm

    folder = session_cache / "models" / "smollm2-135m"
    return folder, load_causal_lm(folder), Tokenizer(folder)


def tiny_hf_model(kind: str, seed: int = 0, vocab: int = 256) -> transformers.PreTrainedModel:
    """A tiny randomly initialised Llama or Qwen2 of the real architecture."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    if kind == "llama":
        cfg = transformers.LlamaConfig(tie_word_embeddings=True, rope_theta=10000.0, **common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(tie_word_embeddings=False, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    return model.eval()


def ours_from_hf(hf: transformers.PreTrainedModel) -> CausalLM:
    cfg = hf.config.to_dict()
    model = CausalLM(ModelConfig.from_hf(cfg))
    model.load_hf_state_dict(hf.state_dict())
    return model.eval()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_pair(request):
    """(transformers model, our model) with the same random weights."""
    hf = tiny_hf_model(request.param)
    return hf, ours_from_hf(hf)


@pytest.fixture(autouse=True, scope="module")
def _return_memory_after_each_module() -> Iterator[None]:
    """Modules build many models; give their memory back so the run stays small."""
    yield
    from specactor.memory import release_freed_memory

    release_freed_memory()


@pytest.fixture(scope="session")
def tiny_checkpoint(session_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint folder of a tiny random Llama with the default model's tokenizer and
    vocabulary: every entry point (CLI, daemon, RolloutEngine) runs it in seconds."""
    import shutil

    folder = tmp_path_factory.mktemp("tiny-llama")
    real = session_cache / "models" / "smollm2-135m"
    hf = tiny_hf_model("llama", seed=3, vocab=ModelConfig.from_dir(real).vocab_size)
    hf.config.eos_token_id = 2
    hf.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (real / name).exists():
            shutil.copy(real / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint: Path):
    """(folder, CausalLM, Tokenizer) of :func:`tiny_checkpoint`, like ``default_model``."""
    from specactor.tokenizer import Tokenizer
    from specactor.engine.weights import load_causal_lm

    return tiny_checkpoint, load_causal_lm(tiny_checkpoint), Tokenizer(tiny_checkpoint)
