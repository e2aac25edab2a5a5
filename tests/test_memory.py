"""Closing an engine gives its model and KV cache back to the OS, so a process
that builds engines repeatedly (tests, RL loops, a daemon) does not grow."""

from __future__ import annotations

import psutil

from specactor.config import EngineConfig
from specactor.rollout_engine import RolloutEngine
from specactor.memory import release_freed_memory
from specactor.protocol import SamplingParams


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


async def test_closed_engines_do_not_accumulate(default_model, session_cache, monkeypatch) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    # KV cache of this config: 30 layers x 2 x 3 heads x 64 x 4 bytes x 8 x 1024 = 377 MB, plus 540 MB of weights
    after: list[float] = []
    for _ in range(4):
        config = EngineConfig(mode="specactor", drafters=["ngram"], transport="inproc", processes=False,
                              max_batch=8, max_len=1024)
        async with RolloutEngine(config) as engine:
            await engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=8, temperature=0.0, seed=1))
        after.append(_rss_mb())  # `engine` is still referenced here, on purpose
    growth = after[-1] - after[1]
    assert growth < 200, f"RSS after each close: {[round(a) for a in after]} MB; grows {growth:.0f} MB"


def test_release_reports_whether_it_trimmed() -> None:
    import sys

    assert release_freed_memory() is sys.platform.startswith("linux")
