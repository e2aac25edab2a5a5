"""bench/policy_plan_time.py: plans timed as the product plans and as it planned before (the same
plans), as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "bench" / "policy_plan_time.py"
FLAT = ROOT / "tests" / "policy" / "data" / "flat_profile.json"


def test_it_times_both_searches_on_each_profile_and_they_plan_alike(tmp_path: Path) -> None:
    out = tmp_path / "plan_time.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--batches", "8,24", "--plans", "3",
                           "--profiles", f"packaged,{FLAT}", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2  # profiles x regimes x batches
    for row in rows:
        assert row["same_plans"] and row["now_ms"] > 0 and row["before_ms"] > 0
        assert row["decode_step_ms"] > 0 and row["plans"] == 3


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    for args, named in ((["--regimes", "T=2"], "T=2"), (["--batches", "8,x"], "8,x"),
                        (["--profiles", str(tmp_path / "none.json")], "none.json")):
        done = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(tmp_path / "o.json")],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 2 and named in done.stderr, done.stderr
