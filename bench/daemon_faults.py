"""The daemon under faults, on the default model: memory over thousands of requests, hostile
calls, and the time to recover from a verifier kill.

    python bench/daemon_faults.py [--requests 5000] [--fuzz 1000] [--out bench/results/daemon_faults.json]

1. Memory: RSS of the daemon's process tree after 200 and after ``--requests`` short requests
   (T=1, 4 tokens), issued in waves of 32 by clients that stream, abort a quarter of their
   requests mid-flight, and every fourth wave disconnect mid-stream without a word. The
   growth between the two readings must stay within 50 MB.
2. Hostile calls: ``--fuzz`` bodies from specactor/bench/hostile_calls.py (random bytes,
   random msgpack, real call kinds with wrong fields, truncated msgpack) on a raw socket while
   a valid request runs, then one call over the frame limit. Counts the answered ones; the
   valid request must come out with the autoregressive tokens (those of an undisturbed daemon
   run) and the daemon must still be healthy.
3. Recovery: SIGKILL the verifier during a 32-sample rollout; seconds until the supervisor's new
   verifier serves (health ok) and until the rollout completes, beside the same rollout
   undisturbed, and whether any sample differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

import psutil
import zmq

from specactor import RolloutClient, SamplingParams
from specactor.prompts import humaneval_prompts
from specactor.cli.serve import DaemonProcess

SHORT = SamplingParams(temperature=1.0, max_tokens=4)


def tree_rss_mb(pid: int) -> float:
    return sum(process_rss_mb(pid).values())


def process_rss_mb(pid: int) -> dict[str, float]:
    """RSS of the daemon's process and of each child, by the actor it serves."""
    proc = psutil.Process(pid)
    out = {}
    for p in [proc, *proc.children(recursive=True)]:
        try:
            cmd = " ".join(p.cmdline())
            name = "daemon" if p.pid == pid else next(
                (n for n in ("verifier", "draft-model", "draft-learned") if f'"name":"{n}"' in cmd), str(p.pid))
            out[name] = out.get(name, 0.0) + p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return out


async def wave(endpoint: str, index: int) -> int:
    """32 requests from a fresh client: streamed; a quarter aborted; every 4th wave the client
    disconnects after the first result. Returns how many requests it issued."""
    prompts = [[1, 9690, 198, 20 + i % 50, 30 + index % 50] for i in range(32)]
    ids = [f"w{index}-{i}" for i in range(32)]
    client = RolloutClient(endpoint, timeout_s=120)
    client.connect()
    try:
        stream = client.stream(prompts, SHORT, request_ids=ids)
        first = await stream.__anext__()
        if index % 4 == 3:
            return 32  # leaves without a word: the daemon must notice and free everything
        for rid in ids[1:9]:
            if rid != first.request_id:
                await client.abort(rid)
        async for _ in stream:
            pass
        return 32
    finally:
        await client.close()


async def memory(endpoint: str, pid: int, total: int) -> dict:
    issued, readings = 0, {}
    index = 0
    while issued < total:
        issued += await wave(endpoint, index)
        index += 1
        if issued >= 200 and "after_200" not in readings:
            await asyncio.sleep(5)  # disconnected clients reaped (--client-timeout 2)
            readings["after_200"] = (issued, tree_rss_mb(pid))
            by_process = {"after_200": process_rss_mb(pid)}
            print(f"  {issued} requests: {readings['after_200'][1]:.1f} MB", flush=True)
        if index % 20 == 0:
            print(f"  {issued} requests ...", flush=True)
    await asyncio.sleep(5)
    readings["after_all"] = (issued, tree_rss_mb(pid))
    by_process["after_all"] = process_rss_mb(pid)
    async with RolloutClient(endpoint) as client:
        health = await client.health()
        stats = await client.stats()
    return {"requests": issued, "rss_mb": {k: round(v[1], 1) for k, v in readings.items()},
            "growth_mb": round(readings["after_all"][1] - readings["after_200"][1], 1),
            "by_process_mb": {k: {n: round(v, 1) for n, v in d.items()} for k, d in by_process.items()},
            "in_flight_after": health["in_flight"], "verifier_requests_after": stats["verifier"]["requests"]}


async def fuzz(endpoint: str, cases: int, prompt: list[int]) -> dict:
    from hypothesis import HealthCheck, given, settings

    from specactor.bench.hostile_calls import OVERSIZED, acceptable, bodies, send_hostile

    params = SamplingParams(temperature=1.0, max_tokens=200, seed=3)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    seen = {"cases": 0, "answered": 0, "bad_replies": 0}

    @settings(max_examples=cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies())
    def run(body: bytes) -> None:
        replies = send_hostile(sock, body, wait_ms=100)
        seen["cases"] += 1
        seen["answered"] += bool(replies)
        seen["bad_replies"] += sum(not acceptable(r) for r in replies)

    async with RolloutClient(endpoint, timeout_s=600) as client:
        undisturbed = (await client.generate([prompt], params, request_ids=["valid"]))[0].token_ids
        valid = asyncio.ensure_future(client.generate([prompt], params, request_ids=["valid"]))
        started = time.perf_counter()
        await asyncio.to_thread(run)
        oversized = send_hostile(sock, OVERSIZED, wait_ms=10000)
        seconds = time.perf_counter() - started
        result = (await valid)[0]
        health = await client.health()
    sock.close()
    return {**seen, "seconds": round(seconds, 1), "oversized_answered": bool(oversized and
                                                                            oversized[0]["kind"] == "error"),
            "valid_request_identical": result.token_ids == undisturbed, "healthy_after": health["ok"]}


async def recovery(endpoint: str, prompts: list[list[int]]) -> dict:
    params = SamplingParams(temperature=1.0, max_tokens=128, seed=21, n=4)
    ids = [f"r{i}" for i in range(len(prompts))]
    async with RolloutClient(endpoint, timeout_s=600) as client:
        t0 = time.perf_counter()
        undisturbed = await client.generate(prompts, params, request_ids=ids)
        plain_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        task = asyncio.ensure_future(client.generate(prompts, params, request_ids=ids))
        while (await client.stats())["verifier"].get("steps", 0) < 30:
            await asyncio.sleep(0.05)
        os.kill(int((await client.stats())["verifier"]["pid"]), signal.SIGKILL)
        killed = time.perf_counter()
        while not (await client.health())["ok"]:
            await asyncio.sleep(0.05)
        serving = time.perf_counter() - killed
        results = await task
        total_s = time.perf_counter() - t0
        health = await client.health()
    differ = sum(a.token_ids != b.token_ids for a, b in zip(results, undisturbed))
    return {"samples": len(results), "undisturbed_s": round(plain_s, 2), "with_kill_s": round(total_s, 2),
            "kill_to_serving_s": round(serving, 2), "differing": differ, "restarts": health["restarts"]}


async def main(args: argparse.Namespace) -> dict:
    from specactor.tokenizer import Tokenizer
    from specactor.engine.model_registry import resolve_model

    tok = Tokenizer(resolve_model(None))
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(8)]
    daemon = DaemonProcess.start("--mode", args.mode, "--client-timeout", "2", "--max-len", "1024")
    try:
        out: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()} {os.cpu_count()} cores",
                     "command": " ".join(["python", *sys.argv])}
        parts = args.parts.split(",")
        if "memory" in parts:
            print("memory ...", flush=True)
            out["memory"] = await memory(daemon.endpoint, daemon.proc.pid, args.requests)
            print(json.dumps(out["memory"]), flush=True)
        if "fuzz" in parts:
            print("hostile calls ...", flush=True)
            out["fuzz"] = await fuzz(daemon.endpoint, args.fuzz, prompts[0])
            print(json.dumps(out["fuzz"]), flush=True)
        if "recovery" in parts:
            print("verifier kill ...", flush=True)
            out["recovery"] = await recovery(daemon.endpoint, prompts)
            print(json.dumps(out["recovery"]), flush=True)
    finally:
        daemon.stop()
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--fuzz", type=int, default=1000)
    parser.add_argument("--parts", default="memory,fuzz,recovery", help="which of memory, fuzz, recovery to run")
    parser.add_argument("--mode", default="specactor", help="the daemon's --mode")
    parser.add_argument("--out", default="bench/results/daemon_faults.json")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
