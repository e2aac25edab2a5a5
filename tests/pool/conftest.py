"""A local Ray for the pool's tests, and what they share: a tiny model's config and reference runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

ray = pytest.importorskip("ray")  # specactor[ray]; scripts/setup.sh --dev installs it

from specactor.config import EngineConfig  # noqa: E402
from specactor.rollout_engine import RolloutEngine  # noqa: E402


@pytest.fixture(scope="module")
def local_ray(session_cache: Path) -> Iterator[None]:
    """One local Ray per module, started after the session's environment (model cache, cost profile) is
    set, so its workers inherit it; 4 logical CPUs: room for 2 replicas of 1 core each, and slack."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def pool_config(model: Path, **overrides: Any) -> EngineConfig:
    """A replica's engine: the tiny model, one core, progress reported often (a dead replica's samples
    continue from recent tokens)."""
    return EngineConfig(**{"model": str(model), "mode": "specactor", "max_batch": 8, "max_len": 512,
                           "verifier_threads": 1, "progress_every_s": 0.2, **overrides})


async def engine_results(config: EngineConfig, calls: list[tuple[Any, ...]], weights: Any = None) -> list[list[Any]]:
    """What one RolloutEngine gives for each ``(prompts, params, request_ids)`` call, after ``weights``."""
    async with RolloutEngine(config) as engine:
        if weights is not None:
            await engine.update_weights(weights)
        return [await engine.generate(prompts, params, request_ids=ids) for prompts, params, ids in calls]


def assert_same_samples(got: list[Any], want: list[Any]) -> None:
    """Token-identical, log-probs equal up to float32 rounding (a batch of other rows sums differently)."""
    assert [r.request_id for r in got] == [r.request_id for r in want]
    for a, b in zip(got, want):
        assert a.error == "" and a.token_ids == b.token_ids, a.request_id
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.policy_version == b.policy_version
