"""The bench's process-tree meter: CPU is charged to the side that used it."""

from __future__ import annotations

import subprocess
import sys
import time

from specactor.bench.measure import PeakMemory

# spins for 0.6 s of CPU, then stays alive (idle) until killed, so the meter still sees it
BUSY_CHILD = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\ntime.sleep(60)\n"


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_busy_child_is_charged_to_the_children_not_the_caller() -> None:
    child = None
    try:
        with PeakMemory() as meter:
            child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD])
            deadline = time.monotonic() + 30
            while PeakMemory.tree_cpu_s().get(child.pid, 0.0) < 0.55 and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        if child is not None:
            child.kill()
            child.wait()
    assert meter.children_cpu_s >= 0.5
    assert meter.caller_cpu_s < meter.children_cpu_s


def test_the_callers_own_work_is_charged_to_the_caller() -> None:
    with PeakMemory() as meter:
        _spin(0.4)
    assert meter.caller_cpu_s >= 0.35
    assert meter.children_cpu_s == 0.0
