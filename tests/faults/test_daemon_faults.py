"""The daemon under faults (real processes, tiny model): a verifier SIGKILLed mid-rollout at T=1,
hostile calls from hypothesis while a valid request runs, a client that pauses and dies, a call
over the frame limit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import zmq
from hypothesis import HealthCheck, given, settings

from specactor.bench.hostile_calls import OVERSIZED, acceptable, bodies, send_hostile
from specactor.protocol import SamplingParams
from specactor.server.client import RolloutClient
from tests.server.conftest import reference_tokens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(daemon_factory, tiny_checkpoint):
    return daemon_factory("--mode", "specactor", "--model", str(tiny_checkpoint), "--client-timeout", "3")


async def test_a_verifier_killed_mid_rollout_through_the_daemon_loses_nothing(daemon, tiny_model, prompts) -> None:
    _, model, tok = tiny_model
    params = SamplingParams(temperature=1.0, max_tokens=300, seed=11, n=2)
    async with RolloutClient(daemon.endpoint, timeout_s=300) as client:
        task = asyncio.ensure_future(client.generate(prompts[:3], params, request_ids=["k0", "k1", "k2"]))
        while (await client.stats()).get("verifier", {}).get("steps", 0) < 20:
            assert not task.done(), "finished before the kill"
            await asyncio.sleep(0.05)
        os.kill(int((await client.stats())["verifier"]["pid"]), signal.SIGKILL)
        results = await task
        health = await client.health()
    assert health["ok"] and health["restarts"] == {"verifier": 1}
    for result in results:
        rid, sample = result.request_id.split("#")
        prompt = prompts[int(rid[1])]
        assert result.token_ids == reference_tokens(model, tok, prompt, params, rid, int(sample)), result.request_id


async def test_hostile_calls_are_answered_or_ignored_while_a_valid_request_completes(daemon, tiny_model,
                                                                                       prompts) -> None:
    _, model, tok = tiny_model
    params = SamplingParams(temperature=1.0, max_tokens=200, seed=3)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.endpoint)
    seen = {"cases": 0, "answered": 0}

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body=bodies())
    def fuzz(body: bytes) -> None:
        replies = send_hostile(sock, body, wait_ms=100)
        seen["cases"] += 1
        seen["answered"] += bool(replies)
        assert all(acceptable(r) for r in replies), replies

    async with RolloutClient(daemon.endpoint, timeout_s=300) as client:
        valid = asyncio.ensure_future(client.generate(prompts[:1], params, request_ids=["valid"]))
        await asyncio.to_thread(fuzz)
        oversized = send_hostile(sock, OVERSIZED, wait_ms=5000)
        result = (await valid)[0]
        health = await client.health()
    sock.close()
    assert oversized and oversized[0]["kind"] == "error" and "over the limit" in oversized[0]["error"]
    assert seen["cases"] >= 300 and seen["answered"] >= 0.8 * seen["cases"]
    assert result.token_ids == reference_tokens(model, tok, prompts[0], params, "valid")
    assert health["ok"] and daemon.proc.poll() is None


PAUSING_CLIENT = textwrap.dedent("""
    import asyncio, sys
    from specactor.server.client import RolloutClient

    async def main(endpoint):
        async with RolloutClient(endpoint) as client:
            await client.pause()
            print("PAUSED", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1]))
""")


async def test_a_client_that_pauses_and_dies_does_not_leave_the_daemon_paused(daemon, prompts) -> None:
    child = subprocess.Popen([sys.executable, "-c", PAUSING_CLIENT, daemon.endpoint], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    assert (await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)).startswith("PAUSED")
    async with RolloutClient(daemon.endpoint, timeout_s=60) as client:
        await asyncio.sleep(4)  # longer than --client-timeout: a live pauser's heartbeats hold the pause
        assert (await client.health())["paused"]
        child.kill()
        child.wait()
        for _ in range(100):
            if not (await client.health())["paused"]:
                break
            await asyncio.sleep(0.1)
        assert not (await client.health())["paused"]
        result = await client.generate(prompts[:1], SamplingParams(max_tokens=4, seed=1), request_ids=["after"])
        assert result[0].token_ids
    assert any("server.pause_released" in line for line in daemon.log)


async def test_a_call_over_the_frame_limit_is_refused_by_the_client_before_sending(daemon) -> None:
    async with RolloutClient(daemon.endpoint) as client:
        assert client.timeout_s == 600.0  # finite by default
        with pytest.raises(ValueError, match="over the daemon's limit"):
            await client.generate([[70000] * (14 << 20)])  # 5 bytes a token id: ~73 MB
        assert (await client.health())["ok"]
