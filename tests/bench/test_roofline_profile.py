"""specactor.bench.roofline and its command line, bench/roofline_profile.py: a GPU-shaped cost
profile the policy and the replay can load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specactor.bench.model_shapes import SHAPES
from specactor.bench.roofline import PRESETS, profile
from specactor.policy.cost_model import CostModel

SCRIPT = Path(__file__).parents[2] / "bench" / "roofline_profile.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_a_7b_model_on_an_h100_is_memory_bound_at_small_batch_and_compute_bound_at_large(tmp_path) -> None:
    out = tmp_path / "h100.json"
    out.write_text(json.dumps(profile("h100", "qwen2.5-7b", context=512, bandwidth_share=0.8, flops_share=0.6,
                                      overhead_ms=1.5)))
    cost = CostModel.from_profile(out)
    # 15.2 GB of bf16 weights at 80% of 3.35 TB/s, plus 1.5 ms: ~7.2 ms a decode step at batch 1
    assert cost.verify_s(1, 1) == pytest.approx(0.0072, rel=0.02)
    assert cost.verify_s(8, 9) == pytest.approx(cost.verify_s(8, 1), rel=0.01)  # drafts nearly free
    assert cost.verify_s(64, 9) > 1.8 * cost.verify_s(64, 1)  # 576 tokens a step: the FLOPs count


def test_the_command_line_writes_the_presets_profile_at_its_defaults(tmp_path) -> None:
    out = tmp_path / "h100.json"
    done = _run("--preset", "h100-qwen2.5-7b", "--out", str(out))
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    expected = profile("h100", "qwen2.5-7b", 512, 0.8, 0.6, 1.5)
    assert written.pop("date") and {k: v for k, v in expected.items() if k != "date"} == written
    assert written["roofline"]["overhead_ms"] == 1.5
    assert f"wrote {out}" in done.stdout


def test_bad_settings_are_named(tmp_path) -> None:
    done = _run("--flops-share", "1.5", "--out", str(tmp_path / "x.json"))
    assert done.returncode == 2 and "--flops-share must be in (0, 1]" in done.stderr
    assert not (tmp_path / "x.json").exists()


def test_every_shape_the_measured_profile_builds_has_a_preset() -> None:
    assert {f"{device}-{name}" for device in ("h100", "a100") for name in SHAPES} == set(PRESETS)
