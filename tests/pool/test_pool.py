"""RolloutPool on a local Ray: the same tokens as one engine, groups kept whole, faults and weight
updates across replicas, and the engine's errors."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from specactor.pool import RolloutPool
from specactor.protocol import SamplingParams
from specactor.rollout_engine import RolloutEngine
from tests.pool.conftest import assert_same_samples, engine_results, pool_config

pytestmark = pytest.mark.usefixtures("local_ray")

PROMPTS = [[1, 2, 3, 4 + i] for i in range(6)]
IDS = [f"r{i}" for i in range(6)]


def scaled_weights(folder: Path, factor: float = 1.01) -> dict[str, torch.Tensor]:
    """The model's weights with every matrix scaled: other tokens, same shapes."""
    state = load_file(folder / "model.safetensors")
    return {name: t * factor if t.dim() == 2 else t for name, t in state.items()}


def events_of(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


async def wait_for_progress(pool: RolloutPool, replica: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """The replica's state once its unfinished samples have committed some tokens."""
    for _ in range(int(timeout_s / 0.05)):
        state = (await pool.health())["replicas"][replica]
        if state["committed_tokens"] > 0:
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"replica {replica} reported no progress: {await pool.health()}")


async def wait_until_up(pool: RolloutPool, replica: int, timeout_s: float = 120.0) -> dict[str, Any]:
    for _ in range(int(timeout_s / 0.1)):
        state = (await pool.health())["replicas"][replica]
        if state["state"] == "up" and state["restarts"] > 0:
            return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"replica {replica} did not come back: {await pool.health()}")


async def test_a_pool_gives_one_engines_tokens_at_t0_and_t1(tiny_checkpoint: Path) -> None:
    config = pool_config(tiny_checkpoint)
    calls = [(PROMPTS, SamplingParams(temperature=0.0, max_tokens=48), [f"g{i}" for i in range(6)]),
             (PROMPTS, SamplingParams(temperature=1.0, max_tokens=48, seed=11, n=2), IDS)]
    async with RolloutPool(config, replicas=2) as pool:
        got = [await pool.generate(prompts, params, request_ids=ids) for prompts, params, ids in calls]
        routed = {replicas[0] for replicas in pool.routes.values()}
    for pooled, single in zip(got, await engine_results(config, calls)):
        assert_same_samples(pooled, single)
    assert routed == {0, 1}  # the samples were spread: both replicas served some


async def test_a_group_runs_on_one_replica_and_events_name_it(tiny_checkpoint: Path, tmp_path: Path) -> None:
    events = tmp_path / "pool.jsonl"
    config = pool_config(tiny_checkpoint, events_path=str(events))
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=3, n=4)
    async with RolloutPool(config, replicas=2) as pool:
        grpo = await pool.generate([PROMPTS[0]], params, request_ids=["grpo"])
        # the same group sent as separate requests (one prompt, one sample each), and other work
        separate = await pool.generate([PROMPTS[1]] * 3 + PROMPTS[2:5], SamplingParams(max_tokens=16),
                                       request_ids=["s0", "s1", "s2", "o2", "o3", "o4"],
                                       group_ids=["G", "G", "G", "o2", "o3", "o4"])
        again = await pool.generate([PROMPTS[0]], SamplingParams(max_tokens=8), request_ids=["grpo"])
        routes = dict(pool.routes)
    assert len({routes[r.request_id][0] for r in grpo}) == 1
    assert len({routes[rid][0] for rid in ("s0", "s1", "s2")}) == 1
    assert routes["grpo"][0] == routes["grpo#0"][0]  # a request id seen before goes back to its replica
    finished = {e["request_id"]: e["replica"] for e in events_of(events) if e["event"] == "request.finished"}
    for result in [*grpo, *separate, *again[:1]]:
        assert finished[result.request_id] == routes[result.request_id][-1]
    assert set(finished.values()) == {0, 1}


async def test_a_killed_replica_costs_no_sample_and_no_token(tiny_checkpoint: Path, tmp_path: Path) -> None:
    events = tmp_path / "pool.jsonl"
    config = pool_config(tiny_checkpoint, events_path=str(events))
    weights = scaled_weights(tiny_checkpoint)
    params = SamplingParams(temperature=1.0, max_tokens=500, seed=7, n=2)
    async with RolloutPool(config, replicas=2, check_every_s=0.5) as pool:
        assert await pool.update_weights(weights) == 1
        running = asyncio.ensure_future(pool.generate(PROMPTS, params, request_ids=IDS))
        victim = await wait_for_progress(pool, 0)  # mid-rollout
        os.kill(victim["pid"], signal.SIGKILL)
        got = await running
        back = await wait_until_up(pool, 0)
        after = await pool.generate([PROMPTS[0]], SamplingParams(max_tokens=24), request_ids=["after"])
        assert pool.routes["after"] == [0]  # the restarted replica serves, on the running weights
    want, want_after = await engine_results(config, [(PROMPTS, params, IDS),
                                                     ([PROMPTS[0]], SamplingParams(max_tokens=24), ["after"])],
                                            weights=weights)
    assert_same_samples(got, want)
    assert_same_samples(after, want_after)
    assert back["pid"] != victim["pid"] and back["restarts"] == 1
    log = events_of(events)
    rerouted = [e for e in log if e["event"] == "pool.rerouted"]
    assert rerouted and rerouted[0]["resumed"] > 0  # moved samples continued from their committed tokens
    restored = [e for e in log if e["event"] == "pool.replica_restored"]
    assert restored and restored[0]["version"] == 1


async def test_an_idle_replica_takes_half_of_a_busy_ones_tail(tiny_checkpoint: Path, tmp_path: Path) -> None:
    events = tmp_path / "pool.jsonl"
    config = pool_config(tiny_checkpoint, events_path=str(events))
    params = SamplingParams(temperature=1.0, max_tokens=480, seed=4, n=6)
    async with RolloutPool(config, replicas=2, rebalance_every_s=0.2) as pool:
        got = await pool.generate([PROMPTS[0]], params, request_ids=["tail"])  # one group: one replica
        routes = {r.request_id: pool.routes[r.request_id] for r in got}
    first = routes["tail#0"][0]
    assert all(path[0] == first for path in routes.values())  # one group: one replica first
    moves = sum(len(path) - 1 for path in routes.values())  # (a tail may be rebalanced again, either way)
    assert all(a != b for path in routes.values() for a, b in zip(path, path[1:]))
    (want,) = await engine_results(config, [([PROMPTS[0]], params, ["tail"])])
    assert_same_samples(got, want)  # moved samples continued from their committed tokens: same tokens
    log = events_of(events)
    # (one that finished before its abort arrived is delivered where it ran: asked to move, not moved)
    rebalanced = [e for e in log if e["event"] == "pool.rebalanced"]
    assert (rebalanced[0]["source"], rebalanced[0]["requests"], rebalanced[0]["left"]) == (first, 3, 3)  # half
    assert 1 <= moves <= sum(e["requests"] for e in rebalanced)
    finished = {e["request_id"]: e["replica"] for e in log if e["event"] == "request.finished" and "replica" in e}
    assert all(finished[rid] == path[-1] for rid, path in routes.items())  # (the reference's carry no replica)


async def test_a_hung_replica_is_killed_and_its_samples_finish_elsewhere(tiny_checkpoint: Path) -> None:
    config = pool_config(tiny_checkpoint)
    params = SamplingParams(temperature=1.0, max_tokens=500, seed=5)
    async with RolloutPool(config, replicas=2, hang_timeout_s=2.0, check_every_s=0.5) as pool:
        running = asyncio.ensure_future(pool.generate(PROMPTS, params, request_ids=IDS))
        victim = await wait_for_progress(pool, 1)
        os.kill(victim["pid"], signal.SIGSTOP)  # alive, answering nothing
        try:
            got = await asyncio.wait_for(running, 120)
            back = await wait_until_up(pool, 1)
        finally:
            try:
                os.kill(victim["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
    (want,) = await engine_results(config, [(PROMPTS, params, IDS)])
    assert_same_samples(got, want)
    assert back["pid"] != victim["pid"]


async def test_weight_updates_reach_every_replica_and_a_bad_one_changes_nothing(
        tiny_checkpoint: Path, tmp_path: Path) -> None:
    config = pool_config(tiny_checkpoint)
    weights = scaled_weights(tiny_checkpoint, 0.98)
    bad = {name: t[..., :-1] if t.dim() == 2 else t for name, t in weights.items()}
    save_file(weights, str(tmp_path / "model.safetensors"))
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=2, n=2)
    async with RolloutPool(config, replicas=2) as pool:
        with pytest.raises(ValueError) as pooled_refusal:
            await pool.update_weights(bad)
        assert pool.version == 0
        before = await pool.generate(PROMPTS, params, request_ids=IDS)
        assert await pool.update_weights(path=str(tmp_path)) == 1
        after = await pool.generate(PROMPTS, params, request_ids=IDS)
        assert {r.policy_version for r in after} == {1}
    async with RolloutEngine(config) as engine:
        with pytest.raises(ValueError) as engine_refusal:
            await engine.update_weights(bad)
    assert str(pooled_refusal.value) == str(engine_refusal.value)
    (want_before,) = await engine_results(config, [(PROMPTS, params, IDS)])
    (want_after,) = await engine_results(config, [(PROMPTS, params, IDS)], weights=weights)
    assert_same_samples(before, want_before)
    assert_same_samples(after, want_after)
    assert any(a.token_ids != b.token_ids for a, b in zip(before, after))  # the update changed the samples


BAD_CALLS = [
    ([[]], SamplingParams(), ["empty"]),
    ([[1, 2, 10**9]], SamplingParams(), ["vocab"]),
    ([[1, 2], [3, 4]], SamplingParams(), ["twice", "twice"]),
    ([[1, 2]], SamplingParams(max_tokens=600), ["long"]),
    ([[1, 2]], [SamplingParams(), SamplingParams()], ["params"]),
    ([[1, 2]], SamplingParams(), ["*"]),
]


async def test_bad_calls_get_the_engines_errors(tiny_checkpoint: Path) -> None:
    config = pool_config(tiny_checkpoint)
    async with RolloutPool(config, replicas=2) as pool:
        pooled = [await _error(pool.generate(*call[:2], request_ids=call[2])) for call in BAD_CALLS]
        pooled.append(await _error(pool.update_weights()))
        pooled.append(await _error(pool.update_weights(path="x", in_flight="later")))
        pooled.append(await _error(pool.generate([[1, 2]], request_ids=["a"], group_ids=["a", "b"])))
        assert (await pool.health())["in_flight"] == 0  # nothing of a refused call was submitted
    async with RolloutEngine(config) as engine:
        single = [await _error(engine.generate(*call[:2], request_ids=call[2])) for call in BAD_CALLS]
        single.append(await _error(engine.update_weights()))
        single.append(await _error(engine.update_weights(path="x", in_flight="later")))
        single.append(await _error(engine.generate([[1, 2]], request_ids=["a"], group_ids=["a", "b"])))
    assert pooled == single
    assert all(pooled)


async def _error(call: Any) -> str:
    try:
        await call
    except ValueError as exc:
        return str(exc)
    return ""
