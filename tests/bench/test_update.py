"""The bench's policy update: made once, and the same whether it reuses autoregressive's
first epoch or samples it afresh (our engine is lossless, so they are the same samples)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from specactor.bench.runners import Mode, run_engine
from specactor.bench.suite import BenchOptions, build_workload
from specactor.bench.update import PolicyUpdate
from specactor.config import EngineConfig

pytestmark = pytest.mark.slow


def test_reusing_autoregressive_samples_gives_the_update_sampling_gives(session_cache, tiny_checkpoint,
                                                                        monkeypatch) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    opts = BenchOptions(prompts=2, n=2, max_tokens=10, epochs=1, engine=EngineConfig(model=str(tiny_checkpoint)))
    work = build_workload(opts)
    first = asyncio.run(run_engine(Mode("autoregressive", "engine"), work, 1.0, None))[0]
    lines: list[str] = []
    reused, fresh = PolicyUpdate(work, 1e-3, lines.append), PolicyUpdate(work, 1e-3, lines.append)
    state = reused(first)
    assert reused.stats["reused_autoregressive_samples"] is True
    assert fresh(None) is fresh.state and fresh.stats["reused_autoregressive_samples"] is False
    assert state.keys() == fresh.state.keys()
    assert all(torch.equal(state[k], fresh.state[k]) for k in state)
    assert reused(None) is state and len(lines) == 2  # made once: later calls return the same weights
    # what makes the reuse right: autoregressive's first epoch is exactly the samples drawn afresh
    assert [first.outputs[sid] for sid in work.sample_ids()] == fresh._sample()
