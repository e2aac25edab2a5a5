"""bench/policy_plan_time.py: plans timed as the product plans and as it planned before (the same
plans), as JSON."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from specactor.policy.bandit import FastestOfN
from specactor.policy.cost_model import CostModel
from specactor.policy.drafting_tally import FromScratchTally
from specactor.speculation import METHODS
from tests.scripts import load_script

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "bench" / "policy_plan_time.py"
FLAT = ROOT / "tests" / "policy" / "data" / "flat_profile.json"
TIMINGS = ("now_ms", "now_max_ms", "before_ms", "before_max_ms", "decode_step_ms")


@pytest.fixture
def bench():
    return load_script("bench/policy_plan_time.py")


@pytest.fixture
def plans_made(monkeypatch: pytest.MonkeyPatch) -> list[tuple[FastestOfN, tuple, dict]]:
    """Every plan a FastestOfN makes from here on: (policy, arguments, plan)."""
    made: list[tuple[FastestOfN, tuple, dict]] = []
    plan = FastestOfN.plan

    def recorded(self: FastestOfN, *args: object) -> dict:
        out = plan(self, *args)
        made.append((self, args, out))
        return out

    monkeypatch.setattr(FastestOfN, "plan", recorded)
    return made


def test_it_times_both_searches_on_each_profile_and_they_plan_alike(tmp_path: Path) -> None:
    out = tmp_path / "plan_time.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--batches", "8,24", "--plans", "3",
                           "--profiles", f"packaged,{FLAT}", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert {"date", "machine", "python", "command", "rows"} <= set(report)
    assert "--batches 8,24" in report["command"] and "--plans 3" in report["command"]
    rows = report["rows"]
    # one row per profile x regime x batch asked for, each once, in that order
    asked = list(itertools.product(["packaged", str(FLAT)], ["T=1", "T=0"], [8, 24]))
    assert [(r["profile"], r["regime"], r["batch"]) for r in rows] == asked
    decode_ms = {profile: {b: 1e3 * CostModel.from_profile(profile).at_batch(b).decode for b in (8, 24)}
                 for profile in ("packaged", str(FLAT))}
    for row in rows:
        assert row["plans"] == 3 and row["same_plans"] is True
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in TIMINGS), row
        # a median is no more than the largest of the same timings
        assert row["now_ms"] <= row["now_max_ms"] and row["before_ms"] <= row["before_max_ms"]
        # the derived figures are the recorded ones' ratios
        assert row["speedup"] == pytest.approx(row["before_ms"] / row["now_ms"])
        assert row["core_share_now"] == pytest.approx(row["now_ms"] / (4 * row["decode_step_ms"]))
        assert row["core_share_before"] == pytest.approx(row["before_ms"] / (4 * row["decode_step_ms"]))
        # the step planned for is the profile's own decode step at that batch
        assert row["decode_step_ms"] == pytest.approx(decode_ms[row["profile"]][row["batch"]])
        assert 0 <= row["rows_drafting_last_plan"] <= row["batch"]
    # the table printed has a line per row, and says where the JSON went
    assert sum(1 for line in done.stdout.splitlines() if line.startswith("| ") and " ms |" in line) == len(rows)
    assert f"wrote {out}" in done.stdout


def test_the_timed_plans_are_real_plans_of_every_request(bench, plans_made) -> None:
    """What is timed is a plan of the whole batch, by the methods the product knows, alternating
    which policy goes first; and the row's count of drafting rows is the last plan's."""
    row = bench.time_plans(None, 8, "T=0", 3, 16, 0)
    assert len(plans_made) == 2 * 3  # both policies, every step
    requests = {f"r{i}" for i in range(8)}
    for k, (_, args, plan) in enumerate(plans_made):
        assert args == (8, (k // 2) * bench.PLAN_EVERY)
        assert set(plan) == requests
        for choice in plan.values():
            assert set(choice.methods) <= set(METHODS) and len(set(choice.methods)) == len(choice.methods)
            assert 0 <= choice.window <= 16
            assert choice.methods or not choice.window  # a request that drafts says with what
    # the from-scratch policy plans first at even steps, the tally's at odd ones
    firsts = [plans_made[2 * s][0].tally_class is FromScratchTally for s in range(3)]
    assert firsts == [True, False, True]
    last = next(plan for policy, _, plan in plans_made[-2:] if policy.tally_class is not FromScratchTally)
    assert any(choice.window for choice in last.values())  # T=0 on the packaged profile drafts
    assert row["rows_drafting_last_plan"] == sum(1 for choice in last.values() if choice.window)
    assert row["same_plans"] is True


def test_plans_that_differ_are_reported(bench, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same-plans check is a real comparison: a policy planning one window longer is caught."""
    plan = FastestOfN.plan

    def longer(self: FastestOfN, *args: object) -> dict:
        out = plan(self, *args)
        if self.tally_class is FromScratchTally:
            for choice in out.values():
                choice.window += 1
        return out

    monkeypatch.setattr(FastestOfN, "plan", longer)
    assert bench.time_plans(None, 8, "T=0", 2, 16, 0)["same_plans"] is False


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    for args, named in ((["--regimes", "T=2"], "unknown regime 'T=2'"),
                        (["--batches", "8,x"], "--batches must be comma-separated integers, got '8,x'"),
                        (["--plans", "three"], "--plans: invalid int value: 'three'"),
                        (["--profiles", str(tmp_path / "none.json")], f"no cost profile at '{tmp_path / 'none.json'}'")):
        done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
        assert done.returncode == 2 and named in done.stderr, (args, done.stderr)
        assert "error:" in done.stderr and "Traceback" not in done.stderr
        assert not out.exists()  # nothing written for a run refused
