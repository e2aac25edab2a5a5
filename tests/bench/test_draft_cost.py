"""bench/draft_cost.py: a bad flag is refused naming it (exit 2) before any model loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "draft_cost.py"


@pytest.mark.parametrize("args, named", [(["--quants", "int3"], "int3"), (["--threads", "0"], "--threads"),
                                         (["--batches", "1,x"], "--batches"), (["--repeats", "0"], "--repeats")])
def test_a_bad_flag_is_refused_naming_it(args: list[str], named: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and named in done.stderr, done.stderr
