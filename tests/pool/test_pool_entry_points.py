"""``specactor rollout --replicas`` and ``specactor serve --replicas``: the same samples as one
engine, through the commands users run (real processes, a local Ray each, the tiny model)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specactor.cli.serve import DaemonProcess
from specactor.protocol import SamplingParams
from specactor.server.client import RolloutClient
from tests.pool.conftest import engine_results, pool_config

pytestmark = pytest.mark.slow


def _rollout(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specactor", "rollout", *args], capture_output=True, text=True,
                          env={**os.environ, "SPECACTOR_CACHE": str(cache)}, timeout=600)


def test_a_rollout_on_replicas_writes_one_engines_samples(tmp_path: Path, session_cache: Path,
                                                          tiny_checkpoint: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [1, 2, 3 + i], "id": f"p{i}", "n": 2}) + "\n"
                               for i in range(4)))
    common = ["--prompts", str(prompts), "--max-tokens", "24", "--model", str(tiny_checkpoint), "--mode",
              "specactor", "--threads", "1", "--seed", "5"]
    pooled, single = tmp_path / "pool.jsonl", tmp_path / "one.jsonl"
    events = tmp_path / "events.jsonl"
    run = _rollout(session_cache, *common, "--out", str(pooled), "--replicas", "2", "--events", str(events))
    assert run.returncode == 0, run.stderr
    assert _rollout(session_cache, *common, "--out", str(single)).returncode == 0
    lines = [json.loads(x) for x in pooled.read_text().splitlines()]
    assert [(x["id"], x["sample"], x["token_ids"]) for x in lines] == \
        [(x["id"], x["sample"], x["token_ids"]) for x in map(json.loads, single.read_text().splitlines())]
    replicas = {json.loads(x).get("replica") for x in events.read_text().splitlines()
                if json.loads(x)["event"] == "request.finished"}
    assert replicas == {0, 1}
    summary = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(events)],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "| replica | requests | tokens |" in summary.stdout
    assert "replica1/verifier" in summary.stdout


async def test_a_daemon_serves_from_a_pool(session_cache: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    events = tmp_path / "daemon.jsonl"
    daemon = DaemonProcess.start("--model", str(tiny_checkpoint), "--max-len", "512", "--max-batch", "8",
                                 "--threads", "1", "--replicas", "2", "--events", str(events),
                                 env={**os.environ, "SPECACTOR_CACHE": str(session_cache)})
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=9, n=2)
    prompts, ids = [[1, 2, 3 + i] for i in range(4)], [f"d{i}" for i in range(4)]
    try:
        assert "2 replicas" in "".join(daemon.log)
        async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
            got = await client.generate(prompts, params, request_ids=ids)
            # verl's shape: a group as concurrent single requests, kept together by their group id
            group = await asyncio.gather(*(client.generate([1, 2, 9], SamplingParams(max_tokens=8),
                                                           request_id=f"p9-s{s}", group_ids=["p9"])
                                           for s in range(4)))
            health = await client.health()
    finally:
        assert daemon.stop() == 0
    finished = {e["request_id"]: e.get("replica") for e in map(json.loads, events.read_text().splitlines())
                if e["event"] == "request.finished"}
    assert len({finished[r.request_id] for r in group}) == 1
    assert {finished[r.request_id] for r in got} == {0, 1}
    (want,) = await engine_results(pool_config(tiny_checkpoint, progress_every_s=1.0), [(prompts, params, ids)])
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r["state"] for r in health["replicas"]] == ["up", "up"] and health["ok"]
