"""One seed rule and both call shapes through the three entry points: ``specactor rollout``,
RolloutEngine and the daemon (a tiny random Llama with the real tokenizer, so each runs in
seconds). Each entry point runs a different mode: the tokens must not care."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specactor import EngineConfig, RolloutClient, RolloutEngine, SamplingParams
from specactor.cli.serve import DaemonProcess
from tests.scripts import load_script

PROMPT = [1, 9690, 198, 2683, 314, 3365]
OTHER = [1, 9690, 198]
SEED, N, TOKENS = 21, 3, 16


def _params(**overrides) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "max_tokens": TOKENS, "seed": SEED, "n": N, **overrides})


@pytest.fixture(scope="module")
def daemon(tiny_checkpoint: Path, session_cache: Path):
    d = DaemonProcess.start("--model", str(tiny_checkpoint), "--mode", "specactor", "--max-len", "128",
                            "--max-batch", "8", env={**os.environ, "SPECACTOR_CACHE": str(session_cache)})
    yield d
    assert d.stop() == 0


def _engine(tiny_checkpoint: Path, mode: str, **overrides) -> RolloutEngine:
    return RolloutEngine(EngineConfig(model=str(tiny_checkpoint), mode=mode, drafters=["ngram", "suffix"],
                                      max_len=128, max_batch=8, transport="inproc", processes=False, **overrides))


def _cli_rollout(tmp_path: Path, tiny_checkpoint: Path, session_cache: Path) -> dict[str, list[list[int]]]:
    """Line X (seed S, n samples) beside another line, one request at a time, coupled mode."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"id": "other", "prompt_ids": OTHER, "n": 2}) + "\n"
                       + json.dumps({"id": "X", "prompt_ids": PROMPT, "seed": SEED, "n": N}) + "\n")
    out = tmp_path / "out.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "specactor", "rollout", "--prompts", str(prompts), "--out", str(out),
         "--model", str(tiny_checkpoint), "--mode", "coupled", "--max-tokens", str(TOKENS), "--max-batch", "1",
         "--seed", "999"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "SPECACTOR_CACHE": str(session_cache)})
    assert run.returncode == 0, run.stderr
    samples: dict[str, list[list[int]]] = {}
    for line in map(json.loads, out.read_text().splitlines()):
        samples.setdefault(line["id"], []).append(line["token_ids"])
    return samples


async def test_the_same_id_and_seed_give_the_same_tokens_through_every_entry_point(
        tmp_path: Path, tiny_checkpoint: Path, session_cache: Path, daemon: DaemonProcess) -> None:
    cli = _cli_rollout(tmp_path, tiny_checkpoint, session_cache)
    async with _engine(tiny_checkpoint, "autoregressive") as engine:
        alone = await engine.generate(PROMPT, _params(), request_id="X")
        in_a_batch = await engine.generate([OTHER, PROMPT], _params(), request_ids=["Y", "X"])
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        remote = await client.generate(PROMPT, _params(), request_id="X")
    expected = [r.token_ids for r in alone]
    assert len(expected) == N and len({tuple(t) for t in expected}) == N  # n distinct samples
    assert cli["X"] == expected
    assert [r.token_ids for r in in_a_batch[N:]] == expected
    assert [r.token_ids for r in remote] == expected
    assert [r.request_id for r in remote] == [f"X#{s}" for s in range(N)]


async def test_requests_without_a_seed_use_the_engines_seed(tiny_checkpoint: Path) -> None:
    async with _engine(tiny_checkpoint, "autoregressive", seed=SEED) as engine:
        default = await engine.generate(PROMPT, _params(seed=None), request_id="X")
        explicit = await engine.generate(PROMPT, _params(), request_id="X")
        unnamed = await engine.generate([PROMPT], _params())
    assert [r.token_ids for r in default] == [r.token_ids for r in explicit]
    assert [r.token_ids for r in unnamed] != [r.token_ids for r in explicit]  # a fresh id: fresh noise


async def test_the_single_request_form_returns_one_result(tiny_checkpoint: Path, daemon: DaemonProcess) -> None:
    params = _params(n=1)
    async with _engine(tiny_checkpoint, "specactor") as engine:
        local = await engine.generate(PROMPT, params, request_id="solo")
        streamed = [r async for r in engine.stream(PROMPT, _params(), request_id="many")]
        with pytest.raises(ValueError, match="flat list of token ids"):
            await engine.generate([PROMPT], params, request_id="bad")
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        remote = await client.generate(PROMPT, params, request_id="solo")
    assert local.request_id == remote.request_id == "solo"
    assert local.token_ids == remote.token_ids and len(local.logprobs) == len(local.token_ids)
    assert sorted(r.request_id for r in streamed) == [f"many#{s}" for s in range(N)]


async def test_the_verl_style_example_runs_many_concurrent_single_requests(
        tiny_checkpoint: Path, daemon: DaemonProcess) -> None:
    example = load_script("examples/verl_style.py")
    order: list[str] = []
    outputs = await example.rollout(daemon.endpoint, [PROMPT, OTHER], 3, SamplingParams(max_tokens=TOKENS),
                                    on_done=lambda out: order.append(out.request_id))
    assert len(outputs) == 6 and len(order) == 6
    assert [o.request_id.rsplit("-", 2)[1:] for o in outputs] == [[f"p{i}", f"s{s}"] for i in range(2)
                                                                  for s in range(3)]
    async with _engine(tiny_checkpoint, "autoregressive") as engine:
        for out in outputs:
            prompt = PROMPT if "-p0-" in out.request_id else OTHER
            ref = await engine.generate(prompt, SamplingParams(max_tokens=TOKENS), request_id=out.request_id)
            assert out.token_ids == ref.token_ids and out.stop_reason == ref.finish_reason
            assert out.log_probs == pytest.approx(ref.logprobs, abs=1e-4)
    # verl's dict as verl sends it (top_k -1, a neutral penalty, logprobs, no max_tokens) maps onto the
    # same sampler; anything that would change the sampler is refused, naming it
    params = example.sampling_params_from_verl({"temperature": 0.7, "top_p": 1.0, "top_k": -1,
                                                "repetition_penalty": 1.0, "logprobs": 1}, 64)
    assert (params.temperature, params.top_k, params.max_tokens) == (0.7, 0, 64)
    with pytest.raises(ValueError, match="repetition_penalty 1.1"):
        example.sampling_params_from_verl({"repetition_penalty": 1.1}, 64)
    with pytest.raises(ValueError, match="does not take: min_p"):
        example.sampling_params_from_verl({"min_p": 0.1}, 64)
    # the trainer's side of the example's server: a weight push, after which results carry its step
    from specactor.weight_update import read_checkpoint

    async with example.RolloutServer(daemon.endpoint) as server:
        await server.update_weights(read_checkpoint(tiny_checkpoint), step=3)
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        assert (await client.health())["policy_version"] == 3
        after = await client.generate(PROMPT, SamplingParams(max_tokens=TOKENS), request_id=outputs[0].request_id)
    assert after.policy_version == 3 and after.token_ids == outputs[0].token_ids  # the same weights, pushed again
