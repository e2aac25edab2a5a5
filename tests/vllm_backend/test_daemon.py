"""`specactor serve --backend vllm`: the same daemon and RolloutClient as with our engine, vLLM
verifying. The policy steers the drafters (its assignments and vLLM's verify steps are in the
event log), drafts are accepted, and every sample is the autoregressive one of our own engine."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="backend vllm: install it with `bash scripts/setup.sh --vllm`")

from specactor.event_log import read_events  # noqa: E402
from specactor.protocol import FinishReason, SamplingParams  # noqa: E402
from specactor.server.client import RolloutClient  # noqa: E402
from tests.server.conftest import reference_tokens, start_daemon  # noqa: E402

pytestmark = pytest.mark.slow


async def test_the_daemon_serves_rollouts_on_vllm_steered_by_the_policy(session_cache, default_model,
                                                                        tmp_path) -> None:
    from specactor.prompts import humaneval_prompts

    _, model, tok = default_model
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(4)]
    ids = [f"h{i}" for i in range(len(prompts))]
    params = SamplingParams(temperature=0.0, max_tokens=128, seed=3, n=2)
    events = tmp_path / "events.jsonl"
    daemon = start_daemon(session_cache, "--backend", "vllm", "--mode", "specactor", "--profile", "packaged",
                          "--events", str(events))
    try:
        async with RolloutClient(daemon.endpoint, timeout_s=600) as client:
            health = await client.health()
            results = await client.generate(prompts, params, request_ids=ids)
            stats = await client.stats()
    finally:
        daemon.stop()
    assert health["ok"] and health["mode"] == "specactor"
    assert len(results) == 8
    for result in results:
        prompt_id, sample = result.request_id.split("#")
        expected = reference_tokens(model, tok, prompts[ids.index(prompt_id)], params, prompt_id, int(sample))
        assert result.token_ids == expected, result.request_id
        assert len(result.logprobs) == len(result.token_ids) and all(lp <= 0 for lp in result.logprobs)
        assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert sum(r.stats.accepted for r in results) > 0 and stats["verifier"]["accepted"] > 0
    log = read_events(events)
    names = {e["event"] for e in log}
    assert {"server.ready", "verify.step", "policy.assign", "request.finished"} <= names
    assigned = {m for e in log if e["event"] == "policy.assign" for m in e["methods"]}
    assert assigned and assigned <= {"ngram", "suffix"}  # the policy put requests on the drafters
    steps = [e for e in log if e["event"] == "verify.step"]
    assert sum(e["drafted"] for e in steps) > 0 and sum(e["accepted"] for e in steps) > 0
    assert sum(e["accepted"] for e in steps) == stats["verifier"]["accepted"]
