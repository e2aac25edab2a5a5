"""RolloutEngine end to end on the real default model: speculative modes give
the autoregressive tokens, drafters that die only slow things down, and history
drafting learns from earlier rollouts."""

from __future__ import annotations

import functools

import pytest

from specactor.coordinator import EngineConfig, RolloutEngine
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.verifier.engine import Engine, Sequence, derive_seed

PROMPTS = 20
SAMPLES = 2
TOKENS = 128


@functools.lru_cache(maxsize=None)
def _prompts(tok_folder: str, count: int) -> list[list[int]]:
    from specactor.tokenizer import Tokenizer

    tok = Tokenizer(tok_folder)
    return [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(count)]


def _autoregressive(model, tok, prompts, params: SamplingParams, ids: list[str]) -> dict[str, list[int]]:
    """Reference tokens with the same per-sample seeds as RolloutEngine derives."""
    seqs = []
    for rid, prompt in zip(ids, prompts):
        for s in range(params.n):
            seed = derive_seed(params.seed, s)
            one = SamplingParams(temperature=params.temperature, max_tokens=params.max_tokens, seed=seed)
            seqs.append(Sequence(f"{rid}#{s}", prompt, one, seed=seed))
    eos = set(model.cfg.eos_token_ids) | {tok.eos_token_id}  # what the VerifyActor uses
    Engine(model, max_batch=len(seqs), max_len=1024, eos_token_ids=eos).run(seqs)
    return {s.request_id: s.output_ids for s in seqs}


@pytest.fixture(scope="module")
def reference(default_model):
    folder, model, tok = default_model
    prompts = _prompts(str(folder), PROMPTS)
    ids = [f"p{i}" for i in range(PROMPTS)]
    refs = {}
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_tokens=TOKENS, seed=123, n=SAMPLES)
        refs[temperature] = _autoregressive(model, tok, prompts, params, ids)
    return prompts, ids, refs


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["specactor", "coupled"])
@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_speculative_modes_are_token_identical(default_model, session_cache, monkeypatch, reference,
                                                     mode, drafter, temperature) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = reference
    params = SamplingParams(temperature=temperature, max_tokens=TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(mode=mode, drafters=[drafter], transport="inproc", processes=False,
                          max_batch=PROMPTS * SAMPLES, max_len=1024)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts, params, request_ids=ids)
        stats = await engine.stats()
    diverged = [r.request_id for r in results if r.token_ids != refs[temperature][r.request_id]]
    assert not diverged, f"{len(diverged)} of {len(results)} samples differ: {diverged[:5]}"
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert stats["verifier"]["accepted"] > 0  # the drafter was used, not bypassed


async def test_history_drafting_learns_from_the_previous_rollout(default_model, session_cache, monkeypatch) -> None:
    """Epoch 2 over the same prompts (new seeds) accepts more suffix drafts than epoch 1."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    folder, _, _ = default_model
    prompts = _prompts(str(folder), 6)
    config = EngineConfig(mode="specactor", drafters=["suffix"], transport="inproc", processes=False,
                          max_batch=12, max_len=1024)
    rates = []
    async with RolloutEngine(config) as engine:
        for epoch in range(2):
            params = SamplingParams(temperature=0.7, max_tokens=64, seed=1000 + epoch, n=2)
            results = await engine.generate(prompts, params, request_ids=[f"e{epoch}p{i}" for i in range(6)])
            accepted = sum(r.stats.accepted for r in results)
            steps = sum(r.stats.verify_steps for r in results)
            rates.append(accepted / steps)
    assert rates[1] > rates[0] * 1.2, rates


async def test_engine_leaves_the_callers_torch_threads_alone(session_cache, monkeypatch) -> None:
    """Cheap drafters share the caller's process; torch's thread count is process-global, and an
    RL loop that trains in this process must keep all of its threads (it once dropped to 1)."""
    import torch

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        config = EngineConfig(mode="specactor", drafters=["ngram", "suffix"], max_len=128, max_batch=2)
        async with RolloutEngine(config) as engine:
            await engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, seed=0))
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


async def test_bad_configuration_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="unknown drafting method 'eagle'"):
        RolloutEngine(EngineConfig(drafters=["eagle"]))
    with pytest.raises(ValueError, match="k <= window"):
        RolloutEngine(EngineConfig(k=9, window=4))
    with pytest.raises(ValueError, match="mode 'fast'"):
        RolloutEngine(EngineConfig(mode="fast"))
    with pytest.raises(ValueError, match="needs transport ipc or tcp"):
        RolloutEngine(EngineConfig(transport="inproc", processes=True))


async def test_sigkilled_model_drafter_only_slows_things_down(default_model, session_cache, monkeypatch,
                                                             reference) -> None:
    """Kill the model-drafter process mid-rollout: every request still finishes
    with exactly the autoregressive tokens."""
    import asyncio
    import os
    import signal

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = reference
    params = SamplingParams(temperature=1.0, max_tokens=TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(mode="specactor", drafters=["model"], transport="ipc", processes=True,
                          max_batch=8, max_len=1024)
    async with RolloutEngine(config) as engine:
        pid = engine.system.pid("draft-model")
        task = asyncio.ensure_future(engine.generate(prompts[:4], params, request_ids=ids[:4]))
        for _ in range(600):  # until the drafter is really in use (bounded)
            if task.done() or (await engine.stats()).get("verifier", {}).get("accepted", 0) > 0:
                break
            await asyncio.sleep(0.2)
        assert not task.done(), "rollout finished before any model draft was accepted"
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.wait_for(task, 600)
        assert "draft-model" in engine.system.down
    assert [r.token_ids for r in results] == [refs[1.0][r.request_id] for r in results]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["specactor", "coupled"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_model_drafter_is_token_identical(default_model, session_cache, monkeypatch, reference, mode,
                                                temperature) -> None:
    """The shared-noise model drafter in both modes (8 prompts x 2 samples x 128 tokens: an
    in-process model drafter at batch 40 would make each of these take minutes)."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = reference
    params = SamplingParams(temperature=temperature, max_tokens=TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(mode=mode, drafters=["model"], transport="inproc", processes=False, max_batch=16,
                          max_len=1024)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts[:8], params, request_ids=ids[:8])
        stats = await engine.stats()
    diverged = [r.request_id for r in results if r.token_ids != refs[temperature][r.request_id]]
    assert not diverged, f"{len(diverged)} of {len(results)} samples differ: {diverged[:5]}"
    # shared-noise drafting: most drafted tokens are accepted even at temperature 1
    assert stats["verifier"]["accepted"] > 0.5 * stats["verifier"]["drafted"], stats["verifier"]


@pytest.mark.slow
async def test_policy_over_every_drafter_is_token_identical_and_steers(default_model, session_cache, monkeypatch,
                                                                       reference, events_file) -> None:
    """Fastest-of-N over ngram, suffix and the model drafter: the autoregressive
    tokens, and assignment events that say why."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = reference
    params = SamplingParams(temperature=1.0, max_tokens=TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(mode="specactor", drafters=["ngram", "suffix", "model"], transport="inproc",
                          processes=False, max_batch=16, max_len=1024)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts[8:16], params, request_ids=ids[8:16])
        stats = await engine.stats()
    diverged = [r.request_id for r in results if r.token_ids != refs[1.0][r.request_id]]
    assert not diverged, f"{len(diverged)} of {len(results)} samples differ: {diverged[:5]}"
    assert stats["policy"]["assignments"] >= len(results)
    assigned = [e for e in events_file() if e["event"] == "policy.assign"]
    assert assigned and all(e["reason"] for e in assigned)
    used = {m for r in results for m in r.stats.per_method}
    assert used, "no drafter was ever used"
