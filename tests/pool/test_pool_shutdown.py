"""A pool that started Ray itself leaves no process behind when it closes: not Ray's, not a
replica's, not an engine's, even after one of its replicas was killed and restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from specactor.pool import RolloutPool
from specactor.protocol import SamplingParams
from tests.pool.conftest import pool_config, ray


def _ours(model: Path) -> list[psutil.Process]:
    """Processes that descend from this one, or that run an actor of this model (an orphan included)."""
    found = {p.pid: p for p in psutil.Process().children(recursive=True)}
    for proc in psutil.process_iter(["cmdline"]):
        if str(model) in " ".join(proc.info["cmdline"] or []):
            found[proc.pid] = proc
    return [p for p in found.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


async def test_closing_a_pool_stops_every_process_it_started(tiny_checkpoint: Path) -> None:
    assert not ray.is_initialized()
    before = {p.pid for p in _ours(tiny_checkpoint)}
    async with RolloutPool(pool_config(tiny_checkpoint), replicas=2, check_every_s=0.5) as pool:
        assert ray.is_initialized()
        assert len(await pool.generate([[1, 2, 3]], SamplingParams(max_tokens=8), request_ids=["a"])) == 1
        os.kill((await pool.health())["replicas"][1]["pid"], signal.SIGKILL)
        for _ in range(600):
            replica = (await pool.health())["replicas"][1]
            if replica["state"] == "up" and replica["restarts"] == 1:
                break
            await asyncio.sleep(0.1)
        assert replica["state"] == "up" and replica["restarts"] == 1
    assert not ray.is_initialized()
    deadline = time.monotonic() + 30
    while (left := [p for p in _ours(tiny_checkpoint) if p.pid not in before]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not left, [" ".join(p.cmdline())[:200] for p in left]


def test_a_pool_without_ray_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_ray(name: str, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ImportError, match=r"specactor\[ray\]"):
        asyncio.run(RolloutPool(replicas=2).start())
