"""bench/cost_profile.py: a measured cost profile the policy loads, of a checkpoint or of random weights
of a named shape (specactor.bench.model_shapes.random_model: what a GPU profile of a 7B or 32B target
is made of, without a download)."""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specactor.bench.model_shapes import random_model
from specactor.policy.cost_model import CostModel

SCRIPT = Path(__file__).parents[2] / "bench" / "cost_profile.py"
BATCH_SIZES, CHUNK_LENS = [1, 2], [1, 8]  # C=8: a verify step of 7 draft tokens a row
TABLES = ("forward_s", "one_row_s", "half_rows_s", "sample_s")
# far below any forward of a 135M-parameter model (270 MFLOP a token) on any CPU: a measurement
# that timed nothing (an unsynchronised or skipped forward) comes out under it
FLOOR_S = 1e-4


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_a_shape_is_built_in_its_dtype_with_the_public_configs_sizes() -> None:
    model = random_model("smollm2-135m", torch.bfloat16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # never a float32 copy first
    assert torch.get_default_dtype() == torch.float32  # the default dtype is put back
    assert (model.cfg.hidden_size, model.cfg.num_layers, model.cfg.vocab_size) == (576, 30, 49152)
    params = sum(p.numel() for p in model.parameters())
    assert 130e6 < params < 140e6  # SmolLM2-135M, embeddings tied
    assert torch.isfinite(model.layers[0].qkv.weight).all() and model.layers[0].qkv.weight.std() > 0.01
    assert not model.training


@pytest.fixture(scope="module", params=[False, True], ids=["eager", "cuda-graphs"])
def measured(request, tmp_path_factory) -> tuple[bool, Path, subprocess.CompletedProcess]:
    """Eager forwards, or the padded steps a GPU engine replays as CUDA graphs (uncaptured here): the
    script's profile of random smollm2-135m weights, and its run."""
    graphs = request.param
    out = tmp_path_factory.mktemp("profile") / "p.json"
    done = _run("--shape", "smollm2-135m", "--dtype", "bfloat16", "--batch-sizes", ",".join(map(str, BATCH_SIZES)),
                "--chunk-lens", ",".join(map(str, CHUNK_LENS)), "--repeats", "3", "--context", "32",
                "--threads", "1", "--out", str(out), *(["--cuda-graphs"] if graphs else []))
    assert done.returncode == 0, done.stderr
    return graphs, out, done


def test_the_profile_loads_into_the_cost_model_with_the_sizes_asked_for(measured) -> None:
    _, out, _ = measured
    cost = CostModel.from_profile(out)
    assert cost.source == str(out)
    assert list(cost.batch_sizes) == BATCH_SIZES and list(cost.chunk_lens) == CHUNK_LENS
    for b in BATCH_SIZES:
        for c in CHUNK_LENS:
            assert math.isfinite(cost.verify_s(b, c)) and cost.verify_s(b, c) > 0


def test_every_table_has_a_positive_finite_time_for_each_batch_size_and_chunk(measured) -> None:
    _, out, _ = measured
    profile = json.loads(out.read_text())
    assert profile["batch_sizes"] == BATCH_SIZES and profile["chunk_lens"] == CHUNK_LENS
    assert "partial" not in profile
    for name in TABLES:
        table = profile[name]
        assert len(table) == len(BATCH_SIZES) and all(len(row) == len(CHUNK_LENS) for row in table), name
        assert all(math.isfinite(t) and t > 0 for row in table for t in row), name
    assert all(t >= FLOOR_S for name in TABLES[:3] for row in profile[name] for t in row), \
        "a forward of 135M parameters took under 0.1 ms: nothing was timed"


def test_a_verify_chunk_is_not_cheaper_than_a_decode_step(measured) -> None:
    """C tokens a row do at least the work of one (bounds loose enough for a loaded machine: a
    verify step here costs 1.3-1.5x a decode step)."""
    _, out, _ = measured
    profile = json.loads(out.read_text())
    forward, one_row = profile["forward_s"], profile["one_row_s"]
    for i in range(len(BATCH_SIZES)):
        for j in range(len(CHUNK_LENS)):
            assert forward[i][j] >= 0.5 * forward[i][0], (BATCH_SIZES[i], CHUNK_LENS[j])
            assert one_row[i][j] >= 0.5 * forward[i][0], (BATCH_SIZES[i], CHUNK_LENS[j])
    assert forward[-1][-1] >= 0.5 * forward[0][0]  # 16 tokens a step against one


def test_the_profile_records_how_it_was_measured(measured) -> None:
    graphs, out, _ = measured
    profile = json.loads(out.read_text())
    if graphs:
        assert profile["cuda_graphs"] is True
    else:
        assert "cuda_graphs" not in profile
    assert profile["model"] == "smollm2-135m" and profile["weights"] == "random"
    assert profile["dtype"] == "bfloat16" and profile["device"] == "cpu"
    assert (profile["context"], profile["repeats"], profile["threads"]) == (32, 3, 1)
    assert "cores" in profile["machine"] and "torch" in profile["machine"]
    day = datetime.date.fromisoformat(profile["date"])
    assert abs((datetime.date.today() - day).days) <= 1


def test_it_prints_the_table_of_forward_times_by_batch_and_chunk(measured) -> None:
    _, out, done = measured
    lines = done.stdout.splitlines()
    assert "| batch | C=1 | C=8 | sampler at C=1 |" in lines
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| batch")]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2"]
    assert all("x) |" in row for row in rows)  # C=8's ratio to C=1
    assert sum(line.startswith("B=") for line in lines) == len(BATCH_SIZES) * len(CHUNK_LENS)  # progress


@pytest.mark.parametrize("args,message", [
    (["--shape", "smollm2-135m", "--model", "smollm2-135m"], "give --model or --shape, not both"),
    (["--shape", "smollm2-135m", "--device", "tpu"], "device 'tpu': choose cpu, cuda or cuda:N"),
    (["--shape", "llama-9000b"], "argument --shape: invalid choice: 'llama-9000b'"),
    (["--shape", "smollm2-135m", "--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["--shape", "smollm2-135m", "--batch-sizes", "1,x"], "argument --batch-sizes: '1,x'"),
    (["--shape", "smollm2-135m", "--chunk-lens", "0,2"], "argument --chunk-lens: '0,2'"),
    (["--shape", "smollm2-135m", "--repeats", "0"], "--repeats must be at least 1"),
    (["--shape", "smollm2-135m", "--context", "-1"], "--context not negative"),
])
def test_bad_arguments_are_refused_naming_what_was_wrong(tmp_path: Path, args, message) -> None:
    done = _run(*args, "--out", str(tmp_path / "p.json"))
    assert done.returncode == 2, done.stderr
    assert "usage: cost_profile.py" in done.stderr and message in done.stderr
    assert not (tmp_path / "p.json").exists() and "B=" not in done.stdout
