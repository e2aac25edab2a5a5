"""Clients that die and daemons that are told to stop: nothing leaks, nothing is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from specactor.protocol import FinishReason, SamplingParams
from specactor.server.client import RolloutClient

pytestmark = pytest.mark.slow

DYING_CLIENT = textwrap.dedent("""
    import asyncio, sys
    from specactor.protocol import SamplingParams
    from specactor.server.client import RolloutClient

    async def main(endpoint):
        async with RolloutClient(endpoint) as client:
            params = [SamplingParams(max_tokens=2, seed=1)] + [SamplingParams(max_tokens=400, seed=s) for s in (2, 3)]
            async for result in client.stream([[1, 2, 3]] * 3, params, request_ids=["d0", "d1", "d2"]):
                print("GOT", result.request_id, flush=True)  # then the test kills us mid-stream

    asyncio.run(main(sys.argv[1]))
""")


async def _until(predicate, timeout: float, what: str):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_a_client_killed_mid_stream_leaks_nothing(daemon_factory, prompts) -> None:
    daemon = daemon_factory("--client-timeout", "2")
    child = subprocess.Popen([sys.executable, "-c", DYING_CLIENT, daemon.endpoint], stdout=subprocess.PIPE,
                             text=True, env={**os.environ})
    assert child.stdout is not None
    first = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 120)
    assert first.startswith("GOT d0"), first
    child.kill()  # SIGKILL: no goodbye, its socket just goes away
    child.wait()
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        assert (await client.health())["in_flight"] == 2  # still running: nobody has noticed yet

        async def freed():
            stats = await client.stats()
            return (await client.health())["in_flight"] == 0 and stats["verifier"]["requests"] == 0

        await _until(freed, 2 + 10, "the dead client's requests to be aborted")
        result = await client.generate(prompts[:1], SamplingParams(max_tokens=8, seed=4), request_ids=["next"])
        assert result[0].finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and result[0].token_ids
    assert any("server.client_gone" in line for line in daemon.log)


async def test_sigterm_answers_every_request_in_flight(daemon_factory, prompts) -> None:
    daemon = daemon_factory("--drain-timeout", "1")
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        params = [SamplingParams(max_tokens=4, seed=1)] + [SamplingParams(max_tokens=300, seed=s) for s in (2, 3)]
        task = asyncio.create_task(client.generate(prompts[:3], params, request_ids=["s0", "s1", "s2"]))
        await _until(lambda: _in_flight(client, 3), 60, "three requests in flight")
        daemon.proc.send_signal(signal.SIGTERM)
        results = await asyncio.wait_for(task, 120)
    assert [r.request_id for r in results] == ["s0", "s1", "s2"]
    assert all(r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT) for r in results)
    assert any(r.finish_reason == FinishReason.ABORT for r in results[1:]), \
        "300-token requests cannot finish in a 1 s drain"
    assert await asyncio.to_thread(daemon.proc.wait, 60) == 0
    assert any("server.shutdown" in line or "stopped" in line for line in daemon.log)


async def _in_flight(client: RolloutClient, count: int) -> bool:
    return (await client.health())["in_flight"] == count
