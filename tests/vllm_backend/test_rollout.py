"""RolloutEngine with backend vllm on the real default model: vLLM verifies what specactor's
drafters propose, through the same actors, client calls and messages as our engine. Samples are
token-identical to our autoregressive engine; drafts are verified and accepted; abort,
pause/resume and weight updates work; a drafter that dies does not stop vLLM verifying."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm", reason="backend vllm: install it with `bash scripts/setup.sh --vllm`")

from specactor.config import EngineConfig  # noqa: E402
from specactor.rollout_engine import RolloutEngine  # noqa: E402
from specactor.protocol import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["def add(a, b):\n", 'def fib(n):\n    """Return the n-th Fibonacci number."""\n',
         "import numpy as np\n", "class Stack:\n"]
IDS = ["p0", "p1", "p2", "p3"]


@pytest.fixture(scope="module")
def prompts(default_model):
    return [default_model[2].encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def reference(prompts, session_cache):
    """Our own engine, autoregressive: what every vLLM run must reproduce."""
    async def run() -> dict:
        out = {}
        async with RolloutEngine(EngineConfig(mode="autoregressive", max_len=512, profile="packaged")) as engine:
            for t in (0.0, 1.0):
                results = await engine.generate(prompts, SamplingParams(temperature=t, max_tokens=96, seed=5, n=2),
                                                request_ids=IDS)
                out[t] = {r.request_id: r.token_ids for r in results}
        return out
    return asyncio.run(run())


def _subset(samples: dict[str, list[int]], prompt_ids: list[str]) -> dict[str, list[int]]:
    """The reference's samples of those prompts (sample ids are "<prompt id>#<i>")."""
    return {rid: tokens for rid, tokens in samples.items() if rid.split("#")[0] in prompt_ids}


def _config(**overrides) -> EngineConfig:
    return EngineConfig(**{"mode": "specactor", "drafters": ["ngram", "suffix"], "backend": "vllm", "max_len": 512,
                           "max_batch": 8, "profile": "packaged", "progress_every_s": 0.2, **overrides})


async def test_drafts_are_verified_by_vllm_and_every_sample_is_our_engines(prompts, reference) -> None:
    async with RolloutEngine(_config(policy=False)) as engine:  # every drafter on every request
        results = {t: await engine.generate(prompts, SamplingParams(temperature=t, max_tokens=96, seed=5, n=2),
                                            request_ids=IDS) for t in (0.0, 1.0)}
        stats = await engine.stats()
    for t, got in results.items():
        assert {r.request_id: r.token_ids for r in got} == reference[t], f"T={t}"
        assert all(r.finish_reason in ("stop", "length") and len(r.logprobs) == len(r.token_ids) for r in got)
    greedy = results[0.0]
    assert sum(r.stats.accepted for r in greedy) > 0 and stats["verifier"]["accepted"] > 0
    assert sum(r.stats.accepted for r in results[1.0]) > 0  # at T=1 too: a right draft is the target's own sample
    assert all(set(r.stats.per_method) <= {"ngram", "suffix"} for r in greedy)


async def test_abort_pause_resume_and_a_weight_update(prompts, reference, default_model) -> None:
    import torch

    from specactor.weight_update import read_checkpoint

    params = SamplingParams(temperature=1.0, max_tokens=96, seed=5, n=2)
    async with RolloutEngine(_config()) as engine:
        long = asyncio.ensure_future(engine.generate(prompts[0], SamplingParams(max_tokens=400, seed=1),
                                                     request_id="long"))
        await asyncio.sleep(3)
        await engine.abort("long")
        aborted = await asyncio.wait_for(long, 60)
        assert aborted.finish_reason == "abort" and len(aborted.token_ids) < 400
        await engine.pause()
        steps = (await engine.stats())["verifier"]["steps"]
        paused = asyncio.ensure_future(engine.generate(prompts, params, request_ids=IDS))
        await asyncio.sleep(2)
        # nothing is verified while paused: vLLM took no step for the requests that came in
        assert not paused.done() and (await engine.stats())["verifier"]["steps"] == steps
        assert not engine.coordinator.partial
        await engine.resume()
        got = await asyncio.wait_for(paused, 300)
        assert {r.request_id: r.token_ids for r in got} == reference[1.0]
        state = read_checkpoint(default_model[0])
        gen = torch.Generator().manual_seed(0)
        await engine.update_weights({k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in state.items()})
        updated = await engine.generate(prompts, params, request_ids=IDS)
    assert {r.policy_version for r in updated} == {1} and {r.policy_version for r in got} == {0}
    assert {r.request_id: r.token_ids for r in updated} != reference[1.0]


async def test_vllm_keeps_verifying_when_a_drafter_is_killed(prompts, reference, events_file) -> None:
    """SIGKILL the model drafter's process (the one drafter with a process of its own) mid-rollout,
    coupled (the verifier waits for its drafts each step): vLLM stops waiting for it and verifies on
    without drafts (steps with nothing drafted after the crash, in the event log) while the supervisor
    starts another, and every sample is the autoregressive one."""
    import os
    import signal
    import time

    async with RolloutEngine(_config(policy=False, drafters=["model"], mode="coupled")) as engine:
        pid = engine.system.pid("draft-model")
        assert pid != os.getpid()
        task = asyncio.ensure_future(engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_tokens=96,
                                                                                 seed=5, n=2), request_ids=IDS[:2]))
        deadline = time.monotonic() + 120
        while not task.done() and time.monotonic() < deadline:  # until the drafter's drafts are verified
            if (await engine.stats()).get("verifier", {}).get("accepted", 0) > 0:
                break
            await asyncio.sleep(0.05)
        assert not task.done(), "the rollout finished before the kill"
        os.kill(pid, signal.SIGKILL)
        got = await asyncio.wait_for(task, 300)
        assert engine.system.restarts.get("draft-model") == 1  # it really died, and another took its place
    assert {r.request_id: r.token_ids for r in got} == _subset(reference[1.0], IDS[:2])
    events = events_file()
    crashed = min(e["ts"] for e in events if e["event"] == "system.actor_crashed" and e["name"] == "draft-model")
    after = [e for e in events if e["event"] == "verify.step" and e["ts"] > crashed]
    assert any(e["drafted"] == 0 and e["new_tokens"] > 0 for e in after)  # vLLM went on without its drafts


@pytest.mark.parametrize("draft_quant", [None, "llama-q8_0"])
async def test_the_model_drafter_drafts_for_vllm_at_t1_and_follows_a_weight_update(prompts, reference,
                                                                                    default_model, draft_quant) -> None:
    """The model drafter (a quantised copy of the target, sampling with the target's position-keyed
    noise) behind vLLM: at T=1 its drafts are the target's own samples wherever the copy agrees.
    A weight update reaches it with vLLM's: it drafts from the new policy version, and its drafts
    are still mostly accepted by the updated target (measured on these samples: 82% of its draft
    tokens accepted after the update, 92% before it, and 13% had the drafter kept the old weights).
    Coupled: decoupled on 2 shared cores it drafts a token in about one vLLM step, so its drafts
    arrive for prefixes vLLM has moved past and are dropped (never verified against them)."""
    import torch

    from specactor.weight_update import read_checkpoint

    if draft_quant is not None:  # the target's copy on llama.cpp, re-made from the update
        pytest.importorskip("llama_cpp", reason="llama.cpp's binding is not installed")
    params = SamplingParams(temperature=1.0, max_tokens=96, seed=5, n=2)
    config = _config(policy=False, drafters=["model"], mode="coupled", draft_quant=draft_quant)
    async with RolloutEngine(config) as engine:
        got = await engine.generate(prompts[:2], params, request_ids=IDS[:2])
        gen = torch.Generator().manual_seed(1)
        state = read_checkpoint(default_model[0])
        await engine.update_weights({k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in state.items()})
        updated = await engine.generate(prompts[:2], params, request_ids=IDS[:2])
        drafter_version = (await engine.stats())["draft-model"]["version"]
    assert {r.request_id: r.token_ids for r in got} == _subset(reference[1.0], IDS[:2])
    assert {r.request_id: r.token_ids for r in updated} != _subset(reference[1.0], IDS[:2])
    assert drafter_version == 1 and {r.policy_version for r in updated} == {1}
    for results in (got, updated):
        drafted = sum(r.stats.per_method.get("model", {}).get("drafted", 0) for r in results)
        accepted = sum(r.stats.per_method.get("model", {}).get("accepted", 0) for r in results)
        assert drafted > 50 and accepted > 0.5 * drafted


async def test_the_learned_drafter_trains_on_vllms_rollouts_at_an_update_and_then_drafts(
        prompts, reference, default_model) -> None:
    """The learned drafter behind vLLM: silent until it has trained; the verifier streams it the
    finished samples, a weight update makes it distil on them, and its drafts are then verified and
    accepted, with every sample still the autoregressive one. Coupled: decoupled, whether any of
    its drafts arrives before vLLM has passed its prefix depends on how loaded the 2 cores are
    (it failed once in a full suite run, passing alone), and this test is about training."""
    from specactor.weight_update import read_checkpoint

    params = SamplingParams(temperature=0.0, max_tokens=96, seed=5, n=2)
    async with RolloutEngine(_config(policy=False, drafters=["learned"], mode="coupled")) as engine:
        before = await engine.generate(prompts[:2], params, request_ids=IDS[:2])
        await engine.update_weights(read_checkpoint(default_model[0]))  # the same policy, a new version
        after = await engine.generate(prompts[:2], params, request_ids=IDS[:2])
    for got in (before, after):
        assert {r.request_id: r.token_ids for r in got} == _subset(reference[0.0], IDS[:2])
    assert sum(r.stats.per_method.get("learned", {}).get("drafted", 0) for r in before) == 0
    assert sum(r.stats.per_method.get("learned", {}).get("accepted", 0) for r in after) > 0


async def test_an_engine_too_short_to_profile_in_serves_on_the_packaged_profile(prompts, reference, session_cache,
                                                                               tmp_path, monkeypatch) -> None:
    """A rollout of short samples sizes vLLM's max_len to them; on a machine with no vLLM profile
    cached, the start-up profile's measured steps did not fit, and the verifier failed to start
    (every sample of `specactor rollout --backend vllm --max-tokens 64` failed). An engine of 64
    tokens has no room for the start-up grid's 56 measured tokens beside a 16-token context."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(session_cache / "models")
    monkeypatch.setenv("SPECACTOR_CACHE", str(cache))  # no profile cached: the verifier measures one
    async with RolloutEngine(_config(profile="auto", max_len=64)) as engine:
        got = await engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40, seed=5, n=2),
                                    request_ids=IDS)
    assert {r.request_id: r.token_ids for r in got} == {rid: t[:40] for rid, t in reference[0.0].items()}
    assert not list(cache.glob("profiles/*.json"))  # nothing measured, nothing cached
