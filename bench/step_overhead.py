"""Where an engine step's time goes on a device: the timed forward of the cost profile against the
engine's own step, on the caller's thread and on a worker thread beside an asyncio loop (as the
verifier actor runs it), and the step's busiest host-side operations.

    python bench/step_overhead.py [--shape smollm2-135m] [--device cuda] [--dtype bfloat16] [--batch 32]
                                  [--graphs on,off]

A small model on a GPU is bound by the host: every operation is a kernel launch of a few
microseconds, so a step costs about the same at any batch and chunk length, and anything the host
does beside the launches (Python bookkeeping, another thread holding the GIL, a synchronising
copy) shows up whole in the step's time. With CUDA graphs (the engine's default on a GPU) a
step's kernels replay with one launch; ``--graphs on,off`` measures both, and a verify step of
4 draft tokens a row beside the decode step (what speculation costs). Weights are random (``bench/cost_profile.py --shape``):
a step's time does not depend on their values. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import statistics
import time

import torch

from specactor.bench.model_shapes import SHAPES, random_model
from specactor.config import DTYPES, check_device, torch_dtype
from specactor.protocol import SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.engine.kv_cache import KVCache


#: --graphs: the engine's cuda_graphs argument for each setting (default: on for a GPU)
GRAPH_SETTINGS = {"on": True, "off": False, "default": None}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine_with_batch(model, batch: int, device: str, temperature: float, graphs: bool | None = None) -> Engine:
    """An engine decoding ``batch`` requests whose contexts differ (as in a rollout), past prefill."""
    engine = Engine(model, max_batch=batch, max_len=1024, cuda_graphs=graphs)
    g = torch.Generator().manual_seed(0)
    for i in range(batch):
        prompt = torch.randint(0, model.cfg.vocab_size, (64 + 9 * i,), generator=g).tolist()
        engine.add(Sequence(f"r{i}", prompt, SamplingParams(temperature=temperature, max_tokens=400), seed=i))
    for _ in range(3):
        engine.step()
    return engine


def verify_step(engine: Engine, draft_len: int = 4):
    """A step in which every row verifies ``draft_len`` draft tokens (token 0: rejected at once, so
    every step is the same shape and the contexts still grow one token a step)."""
    return lambda: engine.step({seq.request_id: ("probe", [0] * draft_len) for seq in engine.running})


def timed_steps(step, device: str, n: int) -> dict[str, float]:
    """Median wall time of ``n`` steps (each ends in the sampler's sync) and the forward time the engine
    reports (on a GPU its device time, by CUDA events)."""
    walls, forwards = [], []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        report = step()
        sync(device)
        walls.append(time.perf_counter() - t0)
        forwards.append(report.forward_s)
    return {"step_ms": round(statistics.median(walls) * 1e3, 2),
            "forward_ms": round(statistics.median(forwards) * 1e3, 2)}


async def on_worker_thread(engine: Engine, device: str, n: int, chatter_s: float | None) -> dict[str, float]:
    """Steps run by a one-thread executor while this loop waits (and, with ``chatter_s``, wakes that
    often to do a little Python, like an actor receiving messages)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    async def chatter() -> None:
        while not stop.is_set():
            sum(range(2000))  # ~20 us of Python, what decoding one small message costs
            await asyncio.sleep(chatter_s)

    task = asyncio.create_task(chatter()) if chatter_s else None
    try:
        return await loop.run_in_executor(pool, timed_steps, lambda: engine.step(), device, n)
    finally:
        stop.set()
        if task:
            await task
        pool.shutdown()


def profile_forward_ms(model, batch: int, device: str, repeats: int) -> float:
    """The version-1 cost profile's measurement: every row at one context, one token each,
    synchronised. One fixed shape, repeated: what a per-shape kernel cache (cuDNN's) pays only once."""
    cache = KVCache(model.cfg, batch, 600, dtype=model.embed.weight.dtype, device=device)
    tokens = torch.randint(0, model.cfg.vocab_size, (batch,)).to(device)
    times = []
    for _ in range(repeats + 1):
        cache.lengths[:batch] = [512] * batch
        sync(device)
        t0 = time.perf_counter()
        model(tokens, [1] * batch, cache)
        sync(device)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times[1:]) * 1e3, 2)


def top_host_ops(step, device: str, count: int = 12) -> dict:
    """One step under the profiler: its busiest host-side operations, and on a GPU the kernels'
    own time summed (how much of the step the GPU computes) with the count of kernels run."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:count]
    out: dict = {"host_ops": [{"op": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)}
                              for e in rows]}
    if device.startswith("cuda"):
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        out["kernels"] = len(kernels)
        out["kernel_ms"] = round(sum(getattr(e, "device_time_total", 0) for e in kernels) / 1e3, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--graphs", default="default",
                        help="comma-separated: on, off (CUDA graphs; on a CPU 'on' runs the padded step uncaptured) "
                             "or default (the engine's choice: on for a GPU)")
    args = parser.parse_args()
    try:
        check_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    unknown = [g for g in args.graphs.split(",") if g not in GRAPH_SETTINGS]
    if unknown:
        parser.error(f"--graphs {','.join(unknown)}: choose from {', '.join(GRAPH_SETTINGS)}")
    model = random_model(args.shape, torch_dtype(args.dtype), args.device)
    out: dict = {"shape": args.shape, "device": args.device, "dtype": args.dtype, "batch": args.batch,
                 "torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name()
    out["profile_forward_ms"] = profile_forward_ms(model, args.batch, args.device, args.steps)
    for graphs in args.graphs.split(","):
        tag = "" if graphs == "default" else f"graphs_{graphs}_"
        for temperature in (0.0, 1.0):
            engine = engine_with_batch(model, args.batch, args.device, temperature, GRAPH_SETTINGS[graphs])
            timed_steps(engine.step, args.device, 2)  # a graph's capture happens at its first step
            out[f"{tag}T{temperature:g}_caller_thread"] = timed_steps(engine.step, args.device, args.steps)
            timed_steps(verify_step(engine), args.device, 2)
            out[f"{tag}T{temperature:g}_verify4_caller_thread"] = timed_steps(verify_step(engine), args.device,
                                                                              args.steps)
            out[f"{tag}T{temperature:g}_worker_thread"] = asyncio.run(
                on_worker_thread(engine, args.device, args.steps, None))
            out[f"{tag}T{temperature:g}_worker_thread_chatter_1ms"] = asyncio.run(
                on_worker_thread(engine, args.device, args.steps, 0.001))
            if temperature == 1.0:
                out[f"{tag}T1_profiled_step"] = top_host_ops(engine.step, args.device)
                out[f"{tag}T1_profiled_verify4"] = top_host_ops(verify_step(engine), args.device)
            print(json.dumps(out), flush=True)
    print(json.dumps(out, indent=1), flush=True)


if __name__ == "__main__":
    main()
