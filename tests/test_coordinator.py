"""RolloutEngine end to end: speculative modes give the autoregressive tokens,
drafters that die only slow things down, and history drafting learns from
earlier rollouts. The cheap drafters and history drafting run on the real
default model (their drafts come from real text); the model drafter and the
policy over every drafter run on a tiny random model with the real tokenizer,
where shared-noise drafting is just as exact and a run takes seconds."""

from __future__ import annotations

import functools

import pytest

from specactor import coordinator as coordinator_module
from specactor import protocol as p
from specactor.config import EngineConfig
from specactor.coordinator import Coordinator
from specactor.rollout_engine import RolloutEngine
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import sample_sequences

PROMPTS = 6
SAMPLES = 2
TOKENS = 48
TINY_TOKENS = 48


@functools.lru_cache(maxsize=None)
def _prompts(tok_folder: str, count: int) -> list[list[int]]:
    from specactor.tokenizer import Tokenizer

    tok = Tokenizer(tok_folder)
    return [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(count)]


def _autoregressive(model, tok, prompts, params: SamplingParams, ids: list[str]) -> dict[str, list[int]]:
    """Reference tokens by the one seed rule, decoded by the target engine alone."""
    seqs = sample_sequences(prompts, params, ids)
    eos = set(model.cfg.eos_token_ids) | {tok.eos_token_id}  # what the VerifyActor uses
    Engine(model, max_batch=len(seqs), max_len=1024, eos_token_ids=eos).run(seqs)
    return {s.request_id: s.output_ids for s in seqs}


def _reference(folder, model, tok, tokens: int):
    prompts = _prompts(str(folder), PROMPTS)
    ids = [f"p{i}" for i in range(PROMPTS)]
    refs = {}
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_tokens=tokens, seed=123, n=SAMPLES)
        refs[temperature] = _autoregressive(model, tok, prompts, params, ids)
    return prompts, ids, refs


@pytest.fixture(scope="module")
def reference(default_model):
    return _reference(*default_model, TOKENS)


@pytest.fixture(scope="module")
def tiny_reference(tiny_checkpoint):
    from specactor.tokenizer import Tokenizer
    from specactor.engine.weights import load_causal_lm

    return _reference(tiny_checkpoint, load_causal_lm(tiny_checkpoint), Tokenizer(tiny_checkpoint), TINY_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("mode, drafter, temperature", [
    # every pair of (mode, drafter, temperature) once: the hypothesis tests in
    # tests/verifier/test_lossless.py cover every combination on tiny models
    ("specactor", "ngram", 0.0), ("specactor", "suffix", 1.0), ("coupled", "ngram", 1.0), ("coupled", "suffix", 0.0)])
async def test_speculative_modes_are_token_identical(default_model, session_cache, monkeypatch, reference,
                                                     mode, drafter, temperature) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = reference
    params = SamplingParams(temperature=temperature, max_tokens=TOKENS, seed=123, n=SAMPLES)
    # policy off: every draft is verified, whatever this machine's cost profile says about paying
    config = EngineConfig(mode=mode, drafters=[drafter], transport="inproc", processes=False,
                          max_batch=PROMPTS * SAMPLES, max_len=1024, policy=False)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts, params, request_ids=ids)
        stats = await engine.stats()
    diverged = [r.request_id for r in results if r.token_ids != refs[temperature][r.request_id]]
    assert not diverged, f"{len(diverged)} of {len(results)} samples differ: {diverged[:5]}"
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert stats["verifier"]["accepted"] > 0  # the drafter was used, not bypassed
    assert stats["verifier"]["inline_steps"] == 0  # a CPU step keeps its worker thread (EngineConfig.inline_steps)


async def test_history_drafting_learns_from_the_previous_rollout(default_model, session_cache, monkeypatch) -> None:
    """Epoch 2 over the same prompts (new seeds) accepts more suffix drafts with epoch 1's samples
    in the drafter's history than a drafter that has not seen them."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    folder, _, _ = default_model
    prompts = _prompts(str(folder), 6)
    config = EngineConfig(mode="specactor", drafters=["suffix"], transport="inproc", processes=False,
                          max_batch=12, max_len=1024, policy=False)  # the drafter's learning, not the policy's

    async def rate(engine: RolloutEngine, epoch: int) -> float:
        params = SamplingParams(temperature=0.7, max_tokens=64, seed=1000 + epoch, n=2)
        results = await engine.generate(prompts, params, request_ids=[f"e{epoch}p{i}" for i in range(6)])
        return sum(r.stats.accepted for r in results) / sum(r.stats.verify_steps for r in results)

    async with RolloutEngine(config) as engine:
        await rate(engine, 0)
        with_history = await rate(engine, 1)
    async with RolloutEngine(config) as engine:
        without = await rate(engine, 1)
    assert with_history > without * 1.1, (with_history, without)


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
    with pytest.raises(ValueError, match="dtype 'float16': choose one of float32, bfloat16"):
        RolloutEngine(EngineConfig(dtype="float16"))
    with pytest.raises(ValueError, match=r"sees no CUDA GPU|only \d+ CUDA device\(s\) visible"):
        RolloutEngine(EngineConfig(device="cuda:99"))
    with pytest.raises(ValueError, match="choose cpu, cuda or cuda:N"):
        RolloutEngine(EngineConfig(device="gpu0"))
    with pytest.raises(ValueError, match="backend 'tpu': choose one of torch, vllm"):
        RolloutEngine(EngineConfig(backend="tpu"))
    with pytest.raises(ValueError, match="backend vllm runs vLLM in the verifier's own process"):
        RolloutEngine(EngineConfig(backend="vllm", processes=False, transport="inproc"))


async def test_sigkilled_model_drafter_only_slows_things_down(tiny_checkpoint, session_cache, monkeypatch,
                                                             tiny_reference) -> None:
    """Kill the model-drafter process mid-rollout: every request still finishes
    with exactly the autoregressive tokens."""
    import asyncio
    import os
    import signal

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    from specactor.tokenizer import Tokenizer
    from specactor.engine.weights import load_causal_lm

    prompts, ids = tiny_reference[0][:4], tiny_reference[1][:4]
    # long enough that the kill lands mid-rollout, though accepted drafts make a tiny model fast
    params = SamplingParams(temperature=1.0, max_tokens=300, seed=123, n=SAMPLES)
    refs = {1.0: _autoregressive(load_causal_lm(tiny_checkpoint), Tokenizer(tiny_checkpoint), prompts, params, ids)}
    # coupled: the verifier waits for this drafter's drafts, so once it is dead it must stop waiting
    config = EngineConfig(model=str(tiny_checkpoint), mode="coupled", drafters=["model"], transport="ipc",
                          processes=True, max_batch=8, max_len=1024)
    async with RolloutEngine(config) as engine:
        pid = engine.system.pid("draft-model")
        task = asyncio.ensure_future(engine.generate(prompts, params, request_ids=ids))
        for _ in range(600):  # until the drafter is really in use (bounded)
            if task.done() or (await engine.stats()).get("verifier", {}).get("accepted", 0) > 0:
                break
            await asyncio.sleep(0.2)
        assert not task.done(), "rollout finished before any model draft was accepted"
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.wait_for(task, 600)
        assert engine.system.restarts.get("draft-model") == 1  # and the supervisor started another
    assert [r.token_ids for r in results] == [refs[1.0][r.request_id] for r in results]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_steps_on_the_verifier_s_event_loop_thread_take_drafts_and_aborts_between_them(
        tiny_checkpoint, session_cache, monkeypatch, tiny_reference, temperature) -> None:
    """``inline_steps`` (the default where steps replay CUDA graphs) runs a decode or verify step on
    the verifier's event-loop thread, which then reads nothing while the step runs: the drafts that
    came in during it must still reach the next steps, and an abort must still land mid-rollout. The
    verifier is in its own process, as on a GPU; the output is the autoregressive one."""
    import asyncio

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = tiny_reference
    params = SamplingParams(temperature=temperature, max_tokens=TINY_TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(model=str(tiny_checkpoint), mode="specactor", drafters=["ngram", "suffix"],
                          transport="ipc", processes=True, max_batch=PROMPTS * SAMPLES, max_len=1024,
                          policy=False, inline_steps=True)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts, params, request_ids=ids)
        stats = await engine.stats()
        # a long request aborted while it runs: its result says so, and the verifier goes on
        long = SamplingParams(temperature=temperature, max_tokens=800, seed=5)
        [(request_id, future)] = await engine.submit([prompts[0]], long, request_ids=["long"])
        for _ in range(200):
            if (await engine.stats())["verifier"]["steps"] > stats["verifier"]["steps"] + 5:
                break
            await asyncio.sleep(0.05)
        await engine.abort(request_id)
        aborted = await asyncio.wait_for(future, 60)
        again = await engine.generate(prompts[:1], params, request_ids=ids[:1])
    assert stats["verifier"]["inline_steps"] == 1
    diverged = [r.request_id for r in results if r.token_ids != refs[temperature][r.request_id]]
    assert not diverged, f"{len(diverged)} of {len(results)} samples differ: {diverged[:5]}"
    if temperature == 0:  # drafts got in between the steps (at T=1 the tiny model's random text
        # gives prompt lookup and suffix matching nothing to find, on the thread as inline)
        assert stats["verifier"]["accepted"] > 0, stats["verifier"]
    assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < 800
    assert [r.token_ids for r in again] == [refs[temperature][r.request_id] for r in again]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_model_drafter_is_token_identical(tiny_checkpoint, session_cache, monkeypatch, tiny_reference,
                                                temperature) -> None:
    """The shared-noise model drafter (an int8 copy of the target), coupled, on the tiny model; 16
    requests through 4 slots, so the drafter (4 KV-cache slots, like the verifier) must follow
    requests as they start running, not as they arrive."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = tiny_reference
    params = SamplingParams(temperature=temperature, max_tokens=TINY_TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(model=str(tiny_checkpoint), mode="coupled", drafters=["model"], transport="inproc",
                          processes=False, max_batch=4, max_len=1024)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts, params, request_ids=ids)
        stats = await engine.stats()
    diverged = [r.request_id for r in results if r.token_ids != refs[temperature][r.request_id]]
    assert not diverged, f"{len(diverged)} of {len(results)} samples differ: {diverged[:5]}"
    # shared-noise drafting: most drafted tokens are accepted even at temperature 1
    assert stats["verifier"]["accepted"] > 0.5 * stats["verifier"]["drafted"], stats["verifier"]
    assert all(r.stats.drafted > 0 for r in results), "a request that waited for a slot got no drafts"


@pytest.mark.slow
async def test_policy_over_every_drafter_is_token_identical_and_steers(tiny_checkpoint, session_cache, monkeypatch,
                                                                       tiny_reference, events_file) -> None:
    """Fastest-of-N over ngram, suffix and the model drafter: the autoregressive tokens, and a
    decision with its reason for every request. Whether drafting pays on the tiny model depends
    on measured timings (the policy may rightly switch it off), so this does not assert that a
    drafter was used; the real-model specactor tests above do, with the policy on."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = tiny_reference
    params = SamplingParams(temperature=1.0, max_tokens=TINY_TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(model=str(tiny_checkpoint), mode="specactor", drafters=["ngram", "suffix", "model"],
                          transport="inproc", processes=False, max_batch=16, max_len=1024)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts, params, request_ids=ids)
        stats = await engine.stats()
    diverged = [r.request_id for r in results if r.token_ids != refs[1.0][r.request_id]]
    assert not diverged, f"{len(diverged)} of {len(results)} samples differ: {diverged[:5]}"
    assert stats["policy"]["assignments"] >= len(results)
    assigned = [e for e in events_file() if e["event"] == "policy.assign"]
    assert assigned and all(e["reason"] for e in assigned)
    assert {m for e in assigned for m in e.get("methods") or []} <= {"ngram", "suffix", "model"}


async def test_a_request_submitted_after_the_verifier_died_gets_an_error_not_a_hang(tiny_checkpoint, session_cache,
                                                                                   monkeypatch) -> None:
    import asyncio
    import os
    import signal

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    config = EngineConfig(model=str(tiny_checkpoint), mode="autoregressive", max_len=64, max_batch=2,
                          max_restarts=0)  # restarts: tests/faults
    async with RolloutEngine(config) as engine:
        os.kill(engine.system.pid("verifier"), signal.SIGKILL)
        for _ in range(100):
            if "verifier" in engine.system.down:
                break
            await asyncio.sleep(0.05)
        result = await asyncio.wait_for(engine.generate([1, 2, 3], SamplingParams(max_tokens=4), request_id="late"),
                                        30)
    assert result.finish_reason == "error" and "not running" in result.error


@pytest.mark.parametrize("share", [True, False])
async def test_a_group_prefills_its_prompt_once_unless_told_not_to(tiny_checkpoint, session_cache, monkeypatch,
                                                                   tiny_reference, events_file, share: bool) -> None:
    """EngineConfig.share_prompts reaches the verifier's engine: the n samples of each prompt feed
    it once (the others copy it), or n times with it off; the tokens are the same either way."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids, refs = tiny_reference
    params = SamplingParams(temperature=1.0, max_tokens=TINY_TOKENS, seed=123, n=SAMPLES)
    config = EngineConfig(model=str(tiny_checkpoint), mode="autoregressive", transport="inproc", processes=False,
                          max_batch=16, max_len=1024, share_prompts=share)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts, params, request_ids=ids)
    assert {r.request_id: r.token_ids for r in results} == refs[1.0]
    steps = [e for e in events_file() if e["event"] == "verify.step"]
    fed = sum(e["prefill_tokens"] for e in steps)
    assert fed == sum(map(len, prompts)) * (1 if share else SAMPLES)
    assert steps[0]["prefill_tokens"] == fed  # the call arrived in one message: one prefill step


async def test_a_call_s_samples_reach_the_verifier_in_one_message(monkeypatch) -> None:
    """Sent one by one, a step could start between them and prefill the rest in a second step
    (on an H100 a second eager prefill step cost 33-58 ms, 5-8 decode steps). All or nothing: a
    call with a request id already in flight sends nothing. A call larger than a message holds
    goes in several, in order."""
    coordinator = Coordinator("coordinator", EngineConfig(mode="autoregressive"))
    sent: list[p.GenerateRequest | p.GenerateBatch] = []

    async def send(peer: str, msg: p.GenerateRequest | p.GenerateBatch, **_: object) -> bool:
        assert peer == "verifier"
        sent.append(msg)
        return True

    monkeypatch.setattr(coordinator, "send", send)
    params = SamplingParams(max_tokens=4)
    futures = await coordinator.submit([(f"r{i}", [1, 2, 3], params) for i in range(5)])
    assert len(futures) == 5 and len(sent) == 1 and isinstance(sent[0], p.GenerateBatch)
    assert [r.request_id for r in sent[0].requests] == [f"r{i}" for i in range(5)]
    with pytest.raises(ValueError, match="'r1' is already in flight"):
        await coordinator.submit([("new", [1, 2], params), ("r1", [1, 2], params)])
    with pytest.raises(ValueError, match="'twice' is already in flight"):
        await coordinator.submit([("twice", [1, 2], params), ("twice", [1, 2], params)])
    assert len(sent) == 1 and "new" not in coordinator.pending and "twice" not in coordinator.pending
    monkeypatch.setattr(coordinator_module, "SUBMIT_BATCH_TOKENS", 7)
    await coordinator.submit([(f"s{i}", [1, 2, 3], params) for i in range(5)])
    batches = [[r.request_id for r in m.requests] if isinstance(m, p.GenerateBatch) else [m.request_id]
               for m in sent[1:]]
    assert batches == [["s0", "s1"], ["s2", "s3"], ["s4"]]

    async def broken(peer: str, msg: object, **_: object) -> bool:
        raise RuntimeError("socket gone")

    monkeypatch.setattr(coordinator, "send", broken)
    with pytest.raises(RuntimeError, match="socket gone"):
        await coordinator.submit([("u0", [1, 2], params), ("u1", [1, 2], params)])
    assert not {"u0", "u1"} & (set(coordinator.pending) | set(coordinator.jobs))  # may be submitted again


def test_a_model_drafter_on_the_verifier_s_hardware_is_priced_as_such(monkeypatch) -> None:
    """The policy adds the drafting time of a drafter that computes on the verifier's own
    hardware to the step's: a model drafter on the verifier's GPU, or on the CPU unless the user's
    thread split gives it cores of its own; never the cheap drafters. By default nothing is set
    aside for it: the verifier keeps every core, so a model drafter the policy leaves off costs
    plain decoding nothing."""
    from specactor.policy.actor import PolicyActor

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    every = ["ngram", "suffix", "model", "learned"]
    assert EngineConfig(drafters=every, device="cpu").verifier_threads is None  # torch's default: every core
    assert EngineConfig(drafters=every, device="cpu").drafters_on_verifier == ["model", "learned"]
    # the user's thread split: 3 + the drafter's 1 fit in 4 cores; 4 + 1 do not, so it shares them
    assert EngineConfig(drafters=every, device="cpu", verifier_threads=3).drafters_on_verifier == ["learned"]
    assert EngineConfig(drafters=every, device="cpu", verifier_threads=4).drafters_on_verifier == ["model", "learned"]
    assert EngineConfig(drafters=every, device="cpu", verifier_threads=2,
                        drafter_threads=3).drafters_on_verifier == ["model", "learned"]
    assert EngineConfig(drafters=every, device="cpu", processes=False).drafters_on_verifier == ["model", "learned"]
    assert EngineConfig(drafters=["ngram", "suffix"]).drafters_on_verifier == []
    assert EngineConfig(drafters=every, mode="autoregressive").drafters_on_verifier == []
    assert EngineConfig(drafters=every, device="cuda").drafters_on_verifier == ["model", "learned"]  # not checked here
    policy = PolicyActor("policy", every, shared_methods=["learned"])
    assert policy.cost.shared_methods == {"learned"} and policy.fon.cost is policy.cost


def test_a_model_drafter_with_cores_of_its_own_lends_them_to_the_verifier_while_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On 2 cores split 1+1 the verifier's plain step took 24 ms on its one core and 19 on two: the
    model drafter's core is the verifier's while no request drafts with it, and only then."""
    from specactor.verifier.actor import VerifyActor

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    split = dict(drafters=["ngram", "model"], device="cpu", verifier_threads=1, drafter_threads=1)
    assert EngineConfig(**split).lent_threads == 1
    assert EngineConfig(**{**split, "verifier_threads": 2}).lent_threads == 0  # it shares the verifier's
    assert EngineConfig(**{**split, "mode": "coupled"}).lent_threads == 0
    assert EngineConfig(**{**split, "drafters": ["ngram", "suffix"]}).lent_threads == 0
    assert EngineConfig(**{**split, "processes": False}).lent_threads == 0
    verifier = VerifyActor("verifier", threads=1, lend_threads=1)
    verifier._threads = 1
    verifier.drafters = {"a": ["draft-ngram"]}
    assert verifier._threads_for_step() == 2
    verifier.drafters["b"] = ["draft-model", "draft-ngram"]
    assert verifier._threads_for_step() == 1
    assert VerifyActor("verifier", threads=1)._threads_for_step() == 0  # nothing lent: left as it is


def test_the_policy_races_only_where_a_token_tree_costs_what_it_is_priced_at() -> None:
    """Racing verifies a token tree; with CUDA graphs that step runs eagerly (on an H100 27-42 ms
    against 6-8 ms graphed) while the profile prices it graphed; vLLM verifies one candidate."""
    assert EngineConfig(device="cpu").policy_races
    assert EngineConfig(device="cuda", cuda_graphs=False).policy_races
    assert not EngineConfig(device="cuda").policy_races and EngineConfig(device="cuda").graphed
    assert not EngineConfig(device="cpu", racing=False).policy_races
    assert not EngineConfig(device="cpu", backend="vllm", max_batch=8).policy_races
