"""bench/cost_profile.py: a measured cost profile the policy loads, of a checkpoint or of random weights
of a named shape (what a GPU profile of a 7B or 32B target is made of, without a download)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specactor.policy.cost_model import CostModel
from tests.scripts import load_script

SCRIPT = Path(__file__).parents[2] / "bench" / "cost_profile.py"


def _script():
    return load_script("bench/cost_profile.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_a_shape_is_built_in_its_dtype_with_the_public_configs_sizes() -> None:
    model = _script().random_model("smollm2-135m", torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # never a float32 copy first
    assert (model.cfg.hidden_size, model.cfg.num_layers, model.cfg.vocab_size) == (576, 30, 49152)
    params = sum(p.numel() for p in model.parameters())
    assert 130e6 < params < 140e6  # SmolLM2-135M, embeddings tied
    assert torch.isfinite(model.layers[0].qkv.weight).all() and model.layers[0].qkv.weight.std() > 0.01


@pytest.mark.parametrize("graphs", [[], ["--cuda-graphs"]])
def test_random_weights_of_a_shape_give_a_profile_the_policy_loads(tmp_path: Path, graphs: list[str]) -> None:
    """Eager forwards, or the padded steps a GPU engine replays as CUDA graphs (uncaptured here)."""
    out = tmp_path / "p.json"
    done = _run("--shape", "smollm2-135m", "--dtype", "bfloat16", "--batch-sizes", "1,2", "--chunk-lens", "1,2",
                "--repeats", "1", "--context", "32", "--out", str(out), *graphs)
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text())
    assert profile.get("cuda_graphs", False) == bool(graphs)
    assert profile["model"] == "smollm2-135m" and profile["weights"] == "random"
    assert profile["dtype"] == "bfloat16" and profile["batch_sizes"] == [1, 2]
    assert CostModel.from_profile(out).verify_s(2, 2) > 0


@pytest.mark.parametrize("args,message", [
    (["--shape", "smollm2-135m", "--model", "smollm2-135m"], "not both"),
    (["--shape", "smollm2-135m", "--device", "tpu"], "choose cpu, cuda or cuda:N"),
    (["--shape", "llama-9000b"], "invalid choice"),
])
def test_bad_arguments_are_refused_naming_what_was_wrong(tmp_path: Path, args, message) -> None:
    done = _run(*args, "--out", str(tmp_path / "p.json"))
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "p.json").exists()
