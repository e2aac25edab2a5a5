"""A real daemon in a subprocess, driven by RolloutClient: generate, stream, abort,
pause/resume, health, and weight updates (results after one carry the new version
and equal a fresh engine loaded with the new weights). It serves the tiny model
(the daemon is under test, not the model). Runs in file order: the weight updates
come last."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specactor.protocol import FinishReason, SamplingParams
from specactor.server.client import RemoteError, RolloutClient
from specactor.engine.weights import load_causal_lm, load_state_dict
from tests.server.conftest import reference_tokens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(daemon_factory, tiny_checkpoint):
    return daemon_factory("--client-timeout", "3", "--model", str(tiny_checkpoint))


async def _wait_in_flight(client: RolloutClient, count: int, timeout: float = 30.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        health = await client.health()
        if health["in_flight"] == count:
            return health
        assert asyncio.get_running_loop().time() < deadline, f"in_flight stayed {health['in_flight']}, not {count}"
        await asyncio.sleep(0.05)


async def test_generate_and_stream_are_token_identical_to_autoregressive(daemon, tiny_model, prompts) -> None:
    _, model, tok = tiny_model
    params = [SamplingParams(temperature=1.0, max_tokens=40, seed=11), SamplingParams(temperature=0.0, max_tokens=8,
                                                                                      seed=12)]
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        health = await client.health()
        assert health["ok"] and health["model"] == str(tiny_model[0]) and health["policy_version"] == 0
        results = await client.generate(prompts[:2], params, request_ids=["a", "b"])
        assert [r.request_id for r in results] == ["a", "b"]
        for prompt, sp, result in zip(prompts, params, results):
            assert result.token_ids == reference_tokens(model, tok, prompt, sp, result.request_id)
            assert len(result.logprobs) == len(result.token_ids) and all(lp <= 0 for lp in result.logprobs)
            assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert result.policy_version == 0
        # stream: the 8-token request finishes first although it was listed second
        order = [r.request_id async for r in client.stream(prompts[:2], params, request_ids=["a2", "b2"])]
        assert order == ["b2", "a2"]
        # n samples fan out with per-sample seeds, each its own result
        grouped = await client.generate(prompts[:1], SamplingParams(temperature=1.0, max_tokens=6, seed=5, n=3),
                                        request_ids=["g"])
        assert [r.request_id for r in grouped] == ["g#0", "g#1", "g#2"]
        for sample, result in enumerate(grouped):
            one = SamplingParams(temperature=1.0, max_tokens=6, seed=5)
            assert result.token_ids == reference_tokens(model, tok, prompts[0], one, "g", sample)


async def test_pause_holds_requests_and_abort_answers_them(daemon, prompts) -> None:
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        await client.pause()
        assert (await client.health())["paused"]
        task = asyncio.create_task(client.generate(prompts[:2], SamplingParams(max_tokens=16, seed=1),
                                                   request_ids=["held", "dropped"]))
        await _wait_in_flight(client, 2)
        await asyncio.sleep(1.0)
        assert not task.done(), "a paused daemon must not finish requests"
        await client.abort("dropped")
        await client.resume()
        held, dropped = await task
        assert dropped.finish_reason == FinishReason.ABORT and dropped.token_ids == []
        assert held.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and held.token_ids
        assert not (await client.health())["paused"]


async def test_concurrent_clients_are_served_independently(daemon, prompts) -> None:
    async def one(i: int):
        async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
            return await client.generate(prompts[i:i + 1], SamplingParams(max_tokens=12, seed=i),
                                         request_ids=[f"c{i}"])

    results = await asyncio.gather(*(one(i) for i in range(3)))
    assert [r[0].request_id for r in results] == ["c0", "c1", "c2"]


def _perturbed(folder: Path, scale: float) -> dict[str, torch.Tensor]:
    """The model's weights with every MLP matrix scaled: an RL step's worth of change."""
    return {name: (t * scale if ".mlp." in name else t) for name, t in load_state_dict(folder).items()}


def _checkpoint(folder: Path, state: dict[str, torch.Tensor], out: Path) -> Path:
    """A checkpoint folder: the model's config and tokenizer, these weights."""
    out.mkdir()
    for f in folder.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, out / f.name)
    save_file({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors")
    return out


async def test_update_weights_bumps_the_version_and_matches_a_fresh_engine(daemon, tiny_model, prompts,
                                                                          tmp_path) -> None:
    folder, _, tok = tiny_model
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=21)
    new_state = _perturbed(folder, 1.05)
    fresh = load_causal_lm(_checkpoint(folder, new_state, tmp_path / "v1"))
    async with RolloutClient(daemon.endpoint, timeout_s=300) as client:
        before = (await client.generate(prompts[:1], params, request_ids=["w0"]))[0]
        # a request running when the update arrives finishes on the old weights (paused, so that it
        # is certainly still running when the commit reaches the verifier: the tiny model is fast)
        await client.pause()
        running = asyncio.create_task(client.generate(prompts[1:2], SamplingParams(max_tokens=48, seed=3),
                                                      request_ids=["old"]))
        await _wait_in_flight(client, 1)
        update = asyncio.create_task(client.update_weights(new_state, chunk_bytes=1 << 20))
        await asyncio.sleep(0.5)
        assert not update.done(), "an in_flight='finish' update waits for the running request"
        await client.resume()
        assert await update == 1
        assert (await running)[0].policy_version == 0
        after = (await client.generate(prompts[:1], params, request_ids=["w1"]))[0]
        assert after.policy_version == 1 and (await client.health())["policy_version"] == 1
        assert after.token_ids == reference_tokens(fresh, tok, prompts[0], params, "w1")
        # the new weights are in use: the same tokens (if they are) come with other log-probs
        assert max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs)) > 1e-3


async def test_update_from_a_checkpoint_path_aborting_in_flight(daemon, tiny_model, prompts, tmp_path) -> None:
    folder, _, tok = tiny_model
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=21)
    path = _checkpoint(folder, _perturbed(folder, 0.97), tmp_path / "v2")
    fresh = load_causal_lm(path)
    async with RolloutClient(daemon.endpoint, timeout_s=300) as client:
        await client.pause()  # so the request is certainly still running when the update comes
        running = asyncio.create_task(client.generate(prompts[1:2], SamplingParams(max_tokens=48, seed=3),
                                                      request_ids=["doomed"]))
        await _wait_in_flight(client, 1)
        await client.resume()
        version = await client.update_weights(path=str(path), in_flight="abort", version=7)
        assert version == 7
        doomed = (await running)[0]
        assert doomed.finish_reason == FinishReason.ABORT and "version 7" in doomed.error
        after = (await client.generate(prompts[:1], params, request_ids=["w2"]))[0]
        assert after.policy_version == 7
        assert after.token_ids == reference_tokens(fresh, tok, prompts[0], params, "w2")
        with pytest.raises(RemoteError, match="not newer"):
            await client.update_weights(path=str(path), version=7)
        with pytest.raises(RemoteError, match="missing"):
            await client.update_weights({"model.norm.weight": torch.ones(64)})  # the right shape, alone
        assert (await client.health())["policy_version"] == 7  # refused updates change nothing
