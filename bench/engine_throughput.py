"""Autoregressive decoding speed: float32 vs bfloat16, and the in-process Engine vs RolloutEngine.

    python bench/engine_throughput.py [--batches 1,32] [--tokens 128] [--repeats 3]
                                      [--dtypes float32,bfloat16] [--paths engine,rollout]

``engine``: the target Engine in this process (what ``specactor rollout`` ran
for ``--mode autoregressive`` before every mode went through RolloutEngine).
``rollout``: ``RolloutEngine(EngineConfig(mode="autoregressive"))``, the
verifier in its own process: the baseline every entry point uses now.
Batch B is ceil(B/4) HumanEval chat prompts x 4 samples (T=1, the same seeds
everywhere, lengths set by EOS up to --tokens). Start-up and model loading are
not timed; runs are interleaved across repeats and the medians reported, with
the number of samples whose tokens differ from float32 on the same path.
Writes bench/results/engine_throughput.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from specactor.config import EngineConfig
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer

GROUP = 4


def workload(batch: int, tokens: int) -> tuple[list[list[int]], list[str], SamplingParams]:
    tok = Tokenizer(resolve_model(None))
    count = math.ceil(batch / GROUP)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(count)]
    n = min(GROUP, batch)
    return prompts, [f"p{i}" for i in range(count)], SamplingParams(temperature=1.0, max_tokens=tokens, n=n, seed=7)


def run_engine(dtype: str, prompts: list[list[int]], ids: list[str], params: SamplingParams,
               max_len: int) -> tuple[float, list[list[int]]]:
    from specactor.engine.llm_engine import Engine
    from specactor.engine.sequence import Sequence, sample_sequences
    from specactor.engine.weights import load_causal_lm

    folder = resolve_model(None)
    model = load_causal_lm(folder, dtype=getattr(torch, dtype))
    eos = set(model.cfg.eos_token_ids) | {Tokenizer(folder).eos_token_id}
    seqs = sample_sequences(prompts, params, ids)
    engine = Engine(model, max_batch=len(seqs), max_len=max_len, eos_token_ids=eos)
    engine.run([Sequence("warm", prompts[0], SamplingParams(temperature=0, max_tokens=2), seed=0)])
    start = time.perf_counter()
    engine.run(seqs)
    return time.perf_counter() - start, [s.output_ids for s in seqs]


async def run_rollout(dtype: str, prompts: list[list[int]], ids: list[str], params: SamplingParams,
                      max_len: int) -> tuple[float, list[list[int]]]:
    from specactor.rollout_engine import RolloutEngine

    config = EngineConfig(mode="autoregressive", dtype=dtype, max_batch=len(prompts) * params.n, max_len=max_len)
    async with RolloutEngine(config) as engine:
        await engine.generate(prompts[0], SamplingParams(temperature=0, max_tokens=2), request_id="warm")
        start = time.perf_counter()
        results = await engine.generate(prompts, params, request_ids=ids)
        return time.perf_counter() - start, [r.token_ids for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--paths", default="engine,rollout")
    parser.add_argument("--out", default="bench/results/engine_throughput.json")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    batches = [int(b) for b in args.batches.split(",")]
    dtypes, paths = args.dtypes.split(","), args.paths.split(",")
    rows = []
    for batch in batches:
        prompts, ids, params = workload(batch, args.tokens)
        max_len = max(map(len, prompts)) + args.tokens
        times: dict[tuple[str, str], list[float]] = {}
        outputs: dict[tuple[str, str], list[list[int]]] = {}
        for repeat in range(args.repeats):
            for path in paths:
                for dtype in dtypes:
                    if path == "engine":
                        wall, out = run_engine(dtype, prompts, ids, params, max_len)
                    else:
                        wall, out = asyncio.run(run_rollout(dtype, prompts, ids, params, max_len))
                    times.setdefault((path, dtype), []).append(wall)
                    outputs[(path, dtype)] = out
                    tokens = sum(map(len, out))
                    print(f"batch {batch} {path} {dtype} repeat {repeat}: {wall:.2f} s, {tokens / wall:.1f} tok/s",
                          flush=True)
        for (path, dtype), walls in times.items():
            out = outputs[(path, dtype)]
            tokens = sum(map(len, out))
            reference = outputs.get((path, dtypes[0]), out)
            rows.append({"batch": batch, "path": path, "dtype": dtype, "tokens": tokens,
                         "median_s": statistics.median(walls), "runs_s": walls,
                         "tokens_per_s": tokens / statistics.median(walls),
                         "differ_from_" + dtypes[0]: sum(a != b for a, b in zip(out, reference))})
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()} {os.cpu_count()} cores, "
              f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}", "args": vars(args), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\n| batch | path | dtype | tokens | median s | tokens/s | vs engine {dtypes[0]} | samples differing |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r["batch"] == row["batch"] and r["path"] == paths[0] and r["dtype"] == dtypes[0])
        print(f"| {row['batch']} | {row['path']} | {row['dtype']} | {row['tokens']} | {row['median_s']:.2f} | "
              f"{row['tokens_per_s']:.1f} | {row['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
              f"{row['differ_from_' + dtypes[0]]} |")


if __name__ == "__main__":
    main()
