"""What a pool of replicas costs: RolloutPool against one RolloutEngine on the same cores.

    python bench/pool.py [--repeats 3] [--modes autoregressive,specactor]

On this machine's cores, side by side and interleaved, medians of ``--repeats``:

- the long-tail workload (8 HumanEval prompts x 4 samples, T=1, up to 768 tokens) on one engine
  whose verifier has every core, on a pool of ``--replicas`` replicas of one core each, and on as
  many engines of one core each started by hand, each given its share of the prompts: the
  throughput ratios (target >= 0.95), the samples compared token by token, and each setup's
  busiest verifier's step time beside its makespan (its ceiling: a makespan cannot be shorter);
- the router's cost per request (``Router.route``, 2 / 64 / 512 replicas) and the pool's whole
  submit path per sample (check, expand, route, hand to Ray);
- a weight update of the default model (a state dict, then a 1-token request) on one engine and
  on the pool.

Writes ``--out``/pool.json and each run's events (gzip).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from specactor import EngineConfig, RolloutEngine, SamplingParams
from specactor.bench.suite import BenchOptions, build_workload
from specactor.event_log import read_events, summarize
from specactor.pool import RolloutPool
from specactor.pool.router import Router

ONE_TOKEN = SamplingParams(max_tokens=1, seed=0)


def router_cost_us(replicas: int, requests: int = 20_000) -> float:
    """Microseconds a routing decision takes with ``replicas`` live replicas (new groups, each
    finishing after the next 2 * replicas arrive: a full pool's steady state)."""
    router, live = Router(replicas), list(range(replicas))
    placed: list[tuple[int, int]] = []
    began = time.perf_counter()
    for i in range(requests):
        placed.append((router.route(f"g{i}", 800, live), 800))
        if len(placed) > 2 * replicas:
            router.finished(*placed.pop(0))
    return (time.perf_counter() - began) / requests * 1e6


def progress_cost_ns(samples: int = 512, tokens: int = 16, rounds: int = 200) -> float:
    """Nanoseconds the caller spends per committed token a replica reports: the report pickled and
    unpickled (as Ray carries it) and merged into the pool's record of the sample."""
    import pickle

    from specactor.calls import Job

    pool = RolloutPool(replicas=1)
    loop = asyncio.new_event_loop()
    for i in range(samples):
        job = Job(f"s{i}", f"s{i}", 0, [1, 2, 3], SamplingParams())
        pool._samples[job.request_id] = _sample_record(job, loop)
    began = time.perf_counter()
    for r in range(rounds):
        news = {f"s{i}": (0, r * tokens, list(range(tokens)), [-0.5] * tokens) for i in range(samples)}
        pool._progress(pickle.loads(pickle.dumps(("progress", news)))[1])
    loop.close()
    return (time.perf_counter() - began) / (rounds * samples * tokens) * 1e9


def _sample_record(job: Any, loop: asyncio.AbstractEventLoop) -> Any:
    from specactor.pool.pool import _Sample

    return _Sample(job, job.parent_id, 100, loop.create_future())


async def rollout(runner: Any, work: Any, temperature: float) -> dict[str, Any]:
    """Run the workload once; makespan, tokens, the submit path's time and every sample's tokens."""
    params = SamplingParams(temperature=temperature, max_tokens=work.max_tokens, n=work.n, seed=work.seed(0))
    began = time.perf_counter()
    submitted = await runner.submit(work.prompt_ids, params, work.request_ids())
    submit_s = time.perf_counter() - began
    results = await asyncio.gather(*(future for _, future in submitted))
    makespan = time.perf_counter() - began
    return {"makespan_s": makespan, "tokens": sum(len(r.token_ids) for r in results),
            "submit_ms_per_sample": submit_s * 1000 / len(results),
            "errors": sum(bool(r.error) for r in results),
            "outputs": {r.request_id: list(r.token_ids) for r in results}}


class HandSplit:
    """The baseline a pool replaces: ``replicas`` engines started by hand, one core each, each given
    every other prompt (no Ray, no router, no progress stream)."""

    def __init__(self, config: EngineConfig, replicas: int) -> None:
        self.engines = [RolloutEngine(config) for _ in range(replicas)]

    async def __aenter__(self) -> "HandSplit":
        await asyncio.gather(*(engine.start() for engine in self.engines))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(engine.close() for engine in self.engines))

    async def submit(self, prompts: list[list[int]], params: SamplingParams, ids: list[str]) -> list[Any]:
        share = len(self.engines)
        submitted = []
        for i, engine in enumerate(self.engines):
            submitted += await engine.submit(prompts[i::share], params, ids[i::share])
        return submitted


async def one_setup(setup: str, config: EngineConfig, replicas: int, work: Any, temperature: float,
                    events: Path) -> dict[str, Any]:
    config = replace(config, events_path=str(events))
    if setup == "engines":
        runner: Any = HandSplit(replace(config, verifier_threads=max(1, (os.cpu_count() or 2) // replicas)),
                                replicas)
    elif setup == "pool":
        runner = RolloutPool(replace(config, verifier_threads=max(1, (os.cpu_count() or 2) // replicas)),
                             replicas=replicas)
    else:
        runner = RolloutEngine(replace(config, verifier_threads=os.cpu_count() or 2))
    started = time.perf_counter()
    async with runner:
        startup = time.perf_counter() - started
        run = await rollout(runner, work, temperature)
    run["startup_s"] = startup
    log = read_events(events)
    summary = summarize(log)
    verifier_busy: dict[str, float] = {}  # by process: engines started by hand share actor names
    for e in log:
        if e["event"] == "verify.step":
            key = f"{e.get('replica', '')}/{e['pid']}"
            verifier_busy[key] = verifier_busy.get(key, 0.0) + float(e.get("step_ms", 0)) / 1000
    run["verifier_busy_s"] = verifier_busy
    run["ceiling_s"] = max(verifier_busy.values()) if verifier_busy else 0.0  # the busiest verifier's steps
    run["step_ms_by_batch"] = {b: at.median_step_ms for b, at in summary.by_batch.items()}
    with open(events, "rb") as src, gzip.open(f"{events}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    events.unlink()
    return run


async def weight_update_s(setup: str, config: EngineConfig, replicas: int, state: dict[str, Any],
                          repeats: int) -> list[float]:
    """Seconds an update of ``state`` takes, until a 1-token request has run on the new weights."""
    config = replace(config, mode="autoregressive", max_batch=2, max_len=64)
    runner: Any = RolloutPool(config, replicas=replicas) if setup == "pool" else RolloutEngine(config)
    times = []
    async with runner:
        for _ in range(repeats):
            began = time.perf_counter()
            await runner.update_weights(state)
            await runner.generate([[1, 2, 3]] * replicas, ONE_TOKEN)  # touches every replica
            times.append(time.perf_counter() - began)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--modes", default="autoregressive,specactor")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--update-repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pool"))
    parser.add_argument("--costs-only", action="store_true",
                        help="only the router's and the progress reports' costs (seconds, no Ray)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    costs = {"router_us": {r: router_cost_us(r) for r in (2, 64, 512)}, "progress_ns_per_token": progress_cost_ns()}
    print("router, us a request:", {r: round(us, 2) for r, us in costs["router_us"].items()},
          f"progress, ns a token: {costs['progress_ns_per_token']:.0f}", flush=True)
    if args.costs_only:
        (out / "costs.json").write_text(json.dumps(costs, indent=1) + "\n")
        return
    import ray

    from specactor.pool.placement import join_ray

    join_ray(None)  # once, for every pool: as a pool starts it (workers at normal priority)
    work = build_workload(BenchOptions(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, epochs=1))
    base = EngineConfig(max_batch=len(work.prompt_ids) * work.n,
                        max_len=max(map(len, work.prompt_ids)) + work.max_tokens)
    report: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "date": time.strftime("%Y-%m-%d"), "replicas": args.replicas, "temperature": args.temperature,
        "workload": f"{args.prompts} HumanEval prompts x {args.n}, up to {args.max_tokens} tokens",
        **costs, "modes": {}}
    for mode in args.modes.split(","):
        config = replace(base, mode=mode, drafters=["ngram", "suffix"])
        runs: dict[str, list[dict[str, Any]]] = {"single": [], "pool": [], "engines": []}
        for repeat in range(args.repeats):
            order = ["single", "pool", "engines"]
            for setup in order[repeat % 3:] + order[:repeat % 3]:
                events = out / f"{mode}-{setup}-{repeat}.events.jsonl"
                run = await one_setup(setup, config, args.replicas, work, args.temperature, events)
                runs[setup].append(run)
                print(f"{mode} {setup} #{repeat}: {run['makespan_s']:.2f} s, {run['tokens']} tokens, busiest "
                      f"verifier {run['ceiling_s']:.2f} s, submit {run['submit_ms_per_sample']:.2f} ms/sample",
                      flush=True)
        reference = runs["single"][0]["outputs"]
        differ = sum(run["outputs"].get(rid) != tokens for setup in runs.values() for run in setup
                     for rid, tokens in reference.items())
        ratios = [s["makespan_s"] / p["makespan_s"] for s, p in zip(runs["single"], runs["pool"])]
        by_hand = [e["makespan_s"] / p["makespan_s"] for e, p in zip(runs["engines"], runs["pool"])]
        report["modes"][mode] = {
            "single_makespan_s": statistics.median(r["makespan_s"] for r in runs["single"]),
            "pool_makespan_s": statistics.median(r["makespan_s"] for r in runs["pool"]),
            "engines_makespan_s": statistics.median(r["makespan_s"] for r in runs["engines"]),
            "throughput_ratios": ratios, "throughput_ratio_median": statistics.median(ratios),
            "pool_vs_engines_by_hand": by_hand, "pool_vs_engines_by_hand_median": statistics.median(by_hand),
            "engines_busiest_verifier_s": statistics.median(r["ceiling_s"] for r in runs["engines"]),
            "step_ms_by_batch": {k: v[0]["step_ms_by_batch"] for k, v in runs.items()},
            "single_verifier_busy_s": statistics.median(r["ceiling_s"] for r in runs["single"]),
            "pool_busiest_verifier_s": statistics.median(r["ceiling_s"] for r in runs["pool"]),
            "pool_submit_ms_per_sample": statistics.median(r["submit_ms_per_sample"] for r in runs["pool"]),
            "single_submit_ms_per_sample": statistics.median(r["submit_ms_per_sample"] for r in runs["single"]),
            "tokens": runs["single"][0]["tokens"], "samples_differing": differ,
            "samples_compared": len(reference) * 3 * args.repeats,
            "errors": sum(r["errors"] for setup in runs.values() for r in setup),
            "startup_s": {k: statistics.median(r["startup_s"] for r in v) for k, v in runs.items()},
        }
        print(mode, {k: v for k, v in report["modes"][mode].items() if k != "step_ms_by_batch"}, flush=True)
    from specactor.engine.model_registry import resolve_model
    from specactor.engine.weights import load_state_dict

    state = load_state_dict(resolve_model(None))
    update = {}
    for setup in ("single", "pool"):
        times = await weight_update_s(setup, EngineConfig(verifier_threads=1), args.replicas, state,
                                      args.update_repeats)
        update[setup] = {"median_s": statistics.median(times), "runs_s": times}
        print(f"weight update, {setup}: {update[setup]['median_s']:.2f} s", flush=True)
    report["weight_update"] = update
    ray.shutdown()
    (out / "pool.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out / 'pool.json'}")


if __name__ == "__main__":
    asyncio.run(main())
