"""bench/roofline_profile.py: a GPU-shaped cost profile the policy and the replay can load."""

from __future__ import annotations

import json

import pytest

from specactor.policy.cost_model import CostModel
from tests.scripts import load_script



def _script():
    return load_script("bench/roofline_profile.py")


def test_a_7b_model_on_an_h100_is_memory_bound_at_small_batch_and_compute_bound_at_large(tmp_path) -> None:
    out = tmp_path / "h100.json"
    assert _script().main(["--preset", "h100-qwen2.5-7b", "--out", str(out)]) == 0
    cost = CostModel.from_profile(out)
    # 15.2 GB of bf16 weights at 80% of 3.35 TB/s, plus 1.5 ms: ~7.2 ms a decode step at batch 1
    assert cost.verify_s(1, 1) == pytest.approx(0.0072, rel=0.02)
    assert cost.verify_s(8, 9) == pytest.approx(cost.verify_s(8, 1), rel=0.01)  # drafts nearly free
    assert cost.verify_s(64, 9) > 1.8 * cost.verify_s(64, 1)  # 576 tokens a step: the FLOPs count
    assert json.loads(out.read_text())["roofline"]["overhead_ms"] == 1.5


def test_bad_settings_are_named(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        _script().main(["--flops-share", "1.5", "--out", str(tmp_path / "x.json")])
    assert "--flops-share must be in (0, 1]" in capsys.readouterr().err


def test_every_shape_the_measured_profile_builds_has_a_preset() -> None:
    from specactor.bench.model_shapes import SHAPES

    assert {f"{device}-{name}" for device in ("h100", "a100") for name in SHAPES} == set(_script().PRESETS)
