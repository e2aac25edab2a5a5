"""bench/step_overhead.py: the engine's step against the profile's forward, on both threads, as JSON."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

from specactor.bench.model_shapes import SHAPES

SCRIPT = Path(__file__).parents[2] / "bench" / "step_overhead.py"
WHERE = ("caller_thread", "verify4_caller_thread", "worker_thread", "worker_thread_chatter_1ms")
#: what the report says of the run before any timing
HEADER = {"shape", "device", "dtype", "batch", "torch", "threads", "profile_forward_ms"}


def _finite_positive(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_it_times_the_profile_forward_and_the_engine_step_on_both_threads() -> None:
    """With and without the padded (CUDA-graph) step, which a CPU runs uncaptured."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--batch", "2", "--steps", "2", "--graphs", "on,off"],
                          capture_output=True, text=True, timeout=1800, check=False)  # 6 min on a 2-core machine under load
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout[done.stdout.index("{\n"):])  # the last, indented object is the whole report
    # what was asked for, and nothing a CPU cannot have (GPU name, kernel counts)
    assert (report["shape"], report["device"], report["dtype"], report["batch"]) == ("smollm2-135m", "cpu", "float32", 2)
    assert isinstance(report["threads"], int) and report["threads"] >= 1
    assert _finite_positive(report["profile_forward_ms"])
    expected = set(HEADER)
    for graphs in ("graphs_on_", "graphs_off_"):
        expected |= {f"{graphs}T{t}_{where}" for t in (0, 1) for where in WHERE}
        expected |= {f"{graphs}T1_profiled_step", f"{graphs}T1_profiled_verify4"}
    assert set(report) == expected  # every case asked for, once; no other
    for graphs in ("graphs_on_", "graphs_off_"):
        for temperature in ("T0", "T1"):
            for where in WHERE:
                timing = report[f"{graphs}{temperature}_{where}"]
                assert set(timing) == {"step_ms", "forward_ms"}
                assert _finite_positive(timing["forward_ms"]) and _finite_positive(timing["step_ms"])
                # the forward is part of the step: no more than it (medians of per-step pairs)
                assert timing["forward_ms"] <= timing["step_ms"], (graphs, temperature, where, timing)
        for step in ("step", "verify4"):
            profiled = report[f"{graphs}T1_profiled_{step}"]
            assert set(profiled) == {"host_ops"}  # on a CPU: no kernel counts
            ops = profiled["host_ops"]
            assert 0 < len(ops) <= 12 and len({op["op"] for op in ops}) == len(ops)
            for op in ops:
                assert isinstance(op["calls"], int) and op["calls"] > 0
                assert math.isfinite(op["self_cpu_ms"]) and op["self_cpu_ms"] >= 0
            # the busiest first
            assert [op["self_cpu_ms"] for op in ops] == sorted((op["self_cpu_ms"] for op in ops), reverse=True)
            # one forward through every layer: some operation runs at least once a layer
            assert max(op["calls"] for op in ops) >= SHAPES["smollm2-135m"]["num_hidden_layers"]
    # a line as each (graphs, temperature) case ends, each adding to the one before; the last is the report
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{") and line.endswith("}")]
    assert len(lines) == 2 * 2
    for before, after in itertools.pairwise(lines):
        assert set(before) < set(after) and all(after[k] == v for k, v in before.items())
    assert lines[-1] == report


def test_bad_arguments_are_named() -> None:
    for args, named in ((["--graphs", "on,sometimes"], "--graphs sometimes: choose from on, off, default"),
                        (["--batch", "two"], "argument --batch: invalid int value: 'two'"),
                        (["--shape", "gpt-9"], "argument --shape: invalid choice: 'gpt-9'"),
                        (["--device", "tpu"], "device 'tpu': choose cpu, cuda or cuda:N")):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 2 and named in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and not done.stdout.strip()  # refused before any timing
