"""RolloutEngine under faults (real processes, the tiny model with the real tokenizer): a verifier
SIGKILLed mid-rollout is restarted and every request comes out token-identical, after a weight
update too; a corrupt checkpoint is a named error and the engine serves on; hostile sizes are
refused before anything is allocated; aborted requests leave nothing behind in the policy."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from specactor.config import EngineConfig
from specactor.rollout_engine import RolloutEngine
from specactor.protocol import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [[1, 9690, 198, 30, 31], [1, 44, 45, 46], [1, 2, 3, 4, 5, 6]]
IDS = ["a", "b", "c"]


def _config(tiny_checkpoint, **overrides) -> EngineConfig:
    return EngineConfig(**{"model": str(tiny_checkpoint), "mode": "autoregressive", "max_batch": 4, "max_len": 512,
                           "progress_every_s": 0.05, **overrides})


async def _undisturbed(tiny_checkpoint, params: SamplingParams, update=None, **overrides) -> dict[str, list[int]]:
    async with RolloutEngine(_config(tiny_checkpoint, **overrides)) as engine:
        if update is not None:
            await engine.update_weights(update)
        results = await engine.generate(PROMPTS, params, request_ids=IDS)
    return {r.request_id: r.token_ids for r in results}


async def _kill_mid_rollout(engine: RolloutEngine, task: asyncio.Future, name: str = "verifier") -> None:
    pid = engine.system.pid(name)
    for _ in range(600):  # until it has really worked on them, and reported some (bounded)
        if task.done() or ((await engine.stats()).get("verifier", {}).get("steps", 0) >= 20
                           and engine.coordinator.partial):
            break
        await asyncio.sleep(0.05)
    assert not task.done(), "the rollout finished before the kill"
    os.kill(pid, signal.SIGKILL)


def _perturbed(state: dict) -> dict:
    import torch

    gen = torch.Generator().manual_seed(0)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in state.items()}


@pytest.mark.parametrize("mode, drafters", [("autoregressive", ["ngram"]), ("specactor", ["ngram", "suffix"])])
async def test_a_verifier_killed_mid_rollout_is_restarted_and_nothing_differs(tiny_checkpoint, session_cache,
                                                                              monkeypatch, events_file, mode,
                                                                              drafters) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    params = SamplingParams(temperature=1.0, max_tokens=400, seed=5, n=2)
    reference = await _undisturbed(tiny_checkpoint, params, mode=mode, drafters=drafters)
    async with RolloutEngine(_config(tiny_checkpoint, mode=mode, drafters=drafters)) as engine:
        task = asyncio.ensure_future(engine.generate(PROMPTS, params, request_ids=IDS))
        await _kill_mid_rollout(engine, task)
        results = await asyncio.wait_for(task, 300)
        health = await engine.health()
        assert engine.system.restarts == {"verifier": 1} and health["ok"] and health["verifier"] == "up"
        again = await engine.generate(PROMPTS[:1], params, request_ids=["after"])  # it serves on
    assert all(r.finish_reason != "error" for r in results), [r.error for r in results]
    assert {r.request_id: r.token_ids for r in results} == reference
    assert len(again) == 2 and all(r.token_ids for r in again)
    recovered = [e for e in events_file() if e["event"] == "coordinator.verifier_recovered"]
    assert recovered and recovered[0]["ok"] and recovered[0]["requests"] == 6
    # they went on from what the dead verifier had committed, not from their prompts
    assert recovered[0]["resumed"] >= 1 and recovered[0]["resumed_tokens"] >= 1
    resumed = [e for e in events_file() if e["event"] == "request.resumed"]
    assert sum(e["tokens"] for e in resumed) == recovered[0]["resumed_tokens"]


async def test_a_restarted_verifier_gets_the_running_weights_back(tiny_checkpoint, session_cache, monkeypatch,
                                                                  tiny_model) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    from specactor.weight_update import read_checkpoint

    update = _perturbed(read_checkpoint(tiny_checkpoint))
    params = SamplingParams(temperature=1.0, max_tokens=400, seed=9, n=2)
    reference = await _undisturbed(tiny_checkpoint, params, update=update)
    base = await _undisturbed(tiny_checkpoint, params)
    assert reference != base  # the update changes the tokens: a restart on the base weights would show
    async with RolloutEngine(_config(tiny_checkpoint)) as engine:
        await engine.update_weights(update)
        task = asyncio.ensure_future(engine.generate(PROMPTS, params, request_ids=IDS))
        await _kill_mid_rollout(engine, task)
        results = await asyncio.wait_for(task, 300)
    assert {r.request_id: r.token_ids for r in results} == reference
    assert {r.policy_version for r in results} == {1}


async def test_repeated_verifier_deaths_fail_every_request_and_health_says_why(tiny_checkpoint, session_cache,
                                                                               monkeypatch) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    params = SamplingParams(temperature=1.0, max_tokens=400, seed=5)
    async with RolloutEngine(_config(tiny_checkpoint, max_restarts=1)) as engine:
        task = asyncio.ensure_future(engine.generate(PROMPTS, params, request_ids=IDS))
        await _kill_mid_rollout(engine, task)
        for _ in range(400):  # the restarted one
            if engine.system.restarts.get("verifier") == 1 and "verifier" not in engine.system.down:
                break
            await asyncio.sleep(0.05)
        os.kill(engine.system.pid("verifier"), signal.SIGKILL)
        results = await asyncio.wait_for(task, 60)
        health = await engine.health()
        late = await asyncio.wait_for(engine.generate([1, 2, 3], params, request_id="late"), 30)
    assert all(r.finish_reason == "error" and "verifier" in r.error for r in results)
    assert not health["ok"] and health["verifier"].startswith("down") and "verifier" in health["down"]
    assert late.finish_reason == "error" and "not running" in late.error


async def test_a_killed_model_drafter_is_restarted_and_nothing_differs(tiny_checkpoint, session_cache,
                                                                       monkeypatch) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    params = SamplingParams(temperature=1.0, max_tokens=300, seed=5, n=2)
    overrides = dict(mode="coupled", drafters=["model"])
    reference = await _undisturbed(tiny_checkpoint, params)
    async with RolloutEngine(_config(tiny_checkpoint, **overrides)) as engine:
        task = asyncio.ensure_future(engine.generate(PROMPTS, params, request_ids=IDS))
        await _kill_mid_rollout(engine, task, "draft-model")
        results = await asyncio.wait_for(task, 300)
        for _ in range(400):
            if engine.system.restarts.get("draft-model") == 1 and "draft-model" not in engine.system.down:
                break
            await asyncio.sleep(0.05)
        assert engine.system.restarts == {"draft-model": 1}
        again = await engine.generate(PROMPTS, params, request_ids=IDS)  # the new drafter drafts
    assert {r.request_id: r.token_ids for r in results} == reference
    assert {r.request_id: r.token_ids for r in again} == reference
    assert sum(r.stats.drafted for r in again) > 0


async def _crash_local_mid_rollout(engine: RolloutEngine, task: asyncio.Future, name: str) -> None:
    """Make the in-process actor ``name`` fail the way a bug would: one of its loops raises."""
    for _ in range(600):
        if task.done() or (await engine.stats()).get("verifier", {}).get("steps", 0) >= 20:
            break
        await asyncio.sleep(0.05)
    assert not task.done(), "the rollout finished before the crash"

    async def bug() -> None:
        raise RuntimeError("a bug in the actor")

    engine.system._members[name].actor.start_loop(bug())


@pytest.mark.parametrize("victim, overrides", [("draft-ngram", {"drafters": ["ngram"], "policy": False}),
                                               ("policy", {"drafters": ["ngram", "suffix"]})])
async def test_an_in_process_actor_that_crashes_is_restarted_and_nothing_differs(tiny_checkpoint, session_cache,
                                                                                  monkeypatch, events_file, victim,
                                                                                  overrides) -> None:
    """Cheap drafters and the policy live in the caller's process: before, a crash left them down
    for the rest of the engine's life (requests went on undrafted)."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    params = SamplingParams(temperature=0.0, max_tokens=300, seed=5, n=2)
    reference = await _undisturbed(tiny_checkpoint, params)
    async with RolloutEngine(_config(tiny_checkpoint, mode="specactor", **overrides)) as engine:
        first = engine.system._members[victim].actor
        task = asyncio.ensure_future(engine.generate(PROMPTS, params, request_ids=IDS))
        await _crash_local_mid_rollout(engine, task, victim)
        results = await asyncio.wait_for(task, 300)
        for _ in range(400):
            if engine.system.restarts.get(victim) == 1 and victim not in engine.system.down:
                break
            await asyncio.sleep(0.05)
        assert engine.system.restarts == {victim: 1} and (await engine.health())["ok"]
        assert engine.system._members[victim].actor is not first
        again = await engine.generate(PROMPTS, params, request_ids=IDS)
        stats = await engine.stats()
    assert {r.request_id: r.token_ids for r in results} == reference
    assert {r.request_id: r.token_ids for r in again} == reference
    if victim.startswith("draft-"):  # the new drafter drafts for the next requests
        assert stats[victim]["tokens"] > 0 and sum(r.stats.drafted for r in again) > 0
    restarted = [e for e in events_file() if e["event"] == "system.actor_restarted"]
    assert [e["name"] for e in restarted] == [victim]


async def test_a_restarted_model_drafter_gets_the_running_weights_back(tiny_checkpoint, session_cache,
                                                                       monkeypatch, tiny_model) -> None:
    """It starts from the model's files; the engine loads the last update into it, as it does into a
    restarted verifier (its drafts were lossless either way; its acceptance is what is at stake)."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    from specactor.weight_update import read_checkpoint

    update = _perturbed(read_checkpoint(tiny_checkpoint))
    params = SamplingParams(temperature=1.0, max_tokens=300, seed=5, n=2)
    reference = await _undisturbed(tiny_checkpoint, params, update=update)
    async with RolloutEngine(_config(tiny_checkpoint, mode="coupled", drafters=["model"])) as engine:
        await engine.update_weights(update)
        assert (await engine.stats())["draft-model"]["version"] == 1
        os.kill(engine.system.pid("draft-model"), signal.SIGKILL)
        version = None
        for _ in range(600):
            version = (await engine.stats()).get("draft-model", {}).get("version")
            if engine.system.restarts.get("draft-model") == 1 and version == 1:
                break
            await asyncio.sleep(0.05)
        assert engine.system.restarts == {"draft-model": 1} and version == 1
        results = await engine.generate(PROMPTS, params, request_ids=IDS)
    assert {r.request_id: r.token_ids for r in results} == reference
    assert sum(r.stats.accepted for r in results) > 0


async def test_a_corrupt_checkpoint_is_a_named_error_and_the_engine_serves_on(tiny_checkpoint, session_cache,
                                                                              monkeypatch, tmp_path) -> None:
    """A trainer still writing its checkpoint: safetensors raises its own error, which used to kill
    the step loop while the verifier still answered heartbeats."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    params = SamplingParams(temperature=1.0, max_tokens=20, seed=5)
    good = (tiny_checkpoint / "model.safetensors").read_bytes()
    corrupt = tmp_path / "half-written.safetensors"
    corrupt.write_bytes(good[: len(good) // 3])
    reference = await _undisturbed(tiny_checkpoint, params)
    async with RolloutEngine(_config(tiny_checkpoint)) as engine:
        with pytest.raises(ValueError, match="weight update rejected: .*"):
            await engine.update_weights(path=str(corrupt))
        assert engine.version == 0 and engine.system.restarts == {}
        results = await asyncio.wait_for(engine.generate(PROMPTS, params, request_ids=IDS), 120)
    assert {r.request_id: r.token_ids for r in results} == reference
    assert {r.policy_version for r in results} == {0}


async def test_hostile_sizes_are_refused_at_once(tiny_checkpoint, session_cache, monkeypatch) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    async with RolloutEngine(_config(tiny_checkpoint, max_in_flight=8)) as engine:
        with pytest.raises(ValueError, match=r"asks for 4611686018427387904 samples .* at most 8"):
            await asyncio.wait_for(engine.submit([[1, 2, 3]], SamplingParams(n=2**62)), 5)
        with pytest.raises(ValueError, match="reserved"):
            await engine.submit([[1, 2, 3]], SamplingParams(max_tokens=2), request_ids=["*"])
        held = await engine.submit([[1, 2, 3]], SamplingParams(max_tokens=50, n=6))
        with pytest.raises(ValueError, match="with 6 in flight"):
            await engine.submit([[1, 2, 3]], SamplingParams(max_tokens=2, n=3))
        await asyncio.gather(*(future for _, future in held))
        assert len(engine.coordinator.pending) == 0 and len(engine.coordinator.jobs) == 0


async def test_aborted_requests_leave_nothing_in_the_policy_or_the_verifier(tiny_checkpoint, session_cache,
                                                                            monkeypatch) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    config = _config(tiny_checkpoint, mode="specactor", drafters=["ngram", "suffix"], processes=False,
                     transport="inproc")
    async with RolloutEngine(config) as engine:
        submitted = await engine.submit(PROMPTS, SamplingParams(temperature=1.0, max_tokens=400, n=2),
                                        request_ids=IDS)
        await asyncio.sleep(0.5)
        for request_id, _ in submitted:
            await engine.abort(request_id)
        results = await asyncio.wait_for(asyncio.gather(*(f for _, f in submitted)), 60)
        await asyncio.sleep(0.5)
        policy = engine.system._members["policy"].actor
        verifier = engine.system._members["verifier"].actor
        assert {r.finish_reason for r in results} <= {"abort", "length", "stop"}
        assert policy.fon.requests == {} and policy.current == {}
        assert verifier.assignments.keys() <= {"*"} and verifier.drafters == {} and verifier.reply_to == {}


async def test_weight_chunks_in_flight_are_bounded_in_bytes(tiny_checkpoint, session_cache, monkeypatch) -> None:
    """ZeroMQ counts messages, not bytes: every WEIGHT_SYNC_BYTES the engine waits until each holder
    has taken what it was sent, and the update still lands whole."""
    import specactor.rollout_engine as rollout_engine
    from specactor.weight_update import read_checkpoint

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    monkeypatch.setattr(rollout_engine, "WEIGHT_SYNC_BYTES", 64 << 10)
    update = _perturbed(read_checkpoint(tiny_checkpoint))
    params = SamplingParams(temperature=1.0, max_tokens=20, seed=2)
    reference = await _undisturbed(tiny_checkpoint, params, update=update)
    synced = []
    async with RolloutEngine(_config(tiny_checkpoint)) as engine:
        real = engine.coordinator.caught_up

        async def counted(peer: str, timeout_s: float = 120.0) -> bool:
            synced.append(await real(peer, timeout_s))
            return synced[-1]

        engine.coordinator.caught_up = counted
        total = sum(t.numel() * t.element_size() for t in update.values())
        await engine.update_weights(update, chunk_bytes=16 << 10)
        results = await engine.generate(PROMPTS, params, request_ids=IDS)
    assert len(synced) >= total // (64 << 10) - 1 and all(synced)
    assert {r.request_id: r.token_ids for r in results} == reference
