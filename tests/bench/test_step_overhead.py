"""bench/step_overhead.py: the engine's step against the profile's forward, on both threads, as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "bench" / "step_overhead.py"


def test_it_times_the_profile_forward_and_the_engine_step_on_both_threads() -> None:
    """With and without the padded (CUDA-graph) step, which a CPU runs uncaptured."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--batch", "2", "--steps", "2", "--graphs", "on,off"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout[done.stdout.index("{\n"):])  # the last, indented object is the whole report
    assert report["device"] == "cpu" and report["profile_forward_ms"] > 0
    for graphs in ("graphs_on_", "graphs_off_"):
        for temperature in ("T0", "T1"):
            for where in ("caller_thread", "verify4_caller_thread", "worker_thread", "worker_thread_chatter_1ms"):
                timing = report[f"{graphs}{temperature}_{where}"]
                assert 0 < timing["forward_ms"] <= timing["step_ms"]
        for step in ("step", "verify4"):
            ops = report[f"{graphs}T1_profiled_{step}"]["host_ops"]
            assert ops and all(op["calls"] > 0 for op in ops)


def test_an_unknown_graphs_setting_is_named() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--graphs", "on,sometimes"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "--graphs sometimes: choose from on, off, default" in done.stderr
