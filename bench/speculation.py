"""Speedup of coupled and decoupled speculation over autoregressive decoding.

    python bench/speculation.py [--drafters ngram,suffix] [--batches 1,8,32] [--tokens 96] [--repeats 3]

For each batch size B, the first B HumanEval chat prompts (one sample each) are
decoded with the same seeds by: the autoregressive engine (in this process),
then, per drafter, ``coupled`` and ``specactor`` (decoupled) through
RolloutEngine with the verifier in its own process (ipc). Each run's time is
measured after the actors have started (model loading excluded). Every
speculative sample is checked token for token against autoregressive.
Medians of ``--repeats``; writes bench/results/speculation.json and a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from specactor.coordinator import EngineConfig, RolloutEngine
from specactor.models import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer
from specactor.verifier.engine import Engine, Sequence
from specactor.verifier.weights import load_causal_lm


def autoregressive(model, eos, prompts, params) -> tuple[float, list[list[int]]]:
    seqs = [Sequence(f"r{i}", p, params, seed=params.seed) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    Engine(model, max_batch=len(prompts), max_len=1024, eos_token_ids=eos).run(seqs)
    return time.perf_counter() - start, [s.output_ids for s in seqs]


async def speculative(mode, drafter, prompts, params, k, window) -> tuple[float, list[list[int]], dict]:
    config = EngineConfig(mode=mode, drafters=[drafter], k=k, window=window, max_batch=len(prompts), max_len=1024,
                          transport="ipc", processes=True)
    async with RolloutEngine(config) as engine:
        # one warm-up request so that lazy initialisation is not timed
        await engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=2), request_ids=["warm"])
        start = time.perf_counter()
        results = await engine.generate(prompts, [params] * len(prompts),
                                        request_ids=[f"r{i}" for i in range(len(prompts))])
        elapsed = time.perf_counter() - start
        stats = await engine.stats()
    return elapsed, [r.token_ids for r in results], stats.get("verifier", {})


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafters", default="ngram,suffix")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "speculation.json"))
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    folder = resolve_model(None)
    model = load_causal_lm(folder)
    tok = Tokenizer(folder)
    eos = set(model.cfg.eos_token_ids) | {tok.eos_token_id}
    all_prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}])
                   for p in humaneval_prompts(max(int(b) for b in args.batches.split(",")))]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.tokens, seed=17)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = all_prompts[:batch]
        ar_times, ref = [], None
        for _ in range(args.repeats):
            t, ref = autoregressive(model, eos, prompts, params)
            ar_times.append(t)
        ar = statistics.median(ar_times)
        tokens = sum(map(len, ref))
        for drafter in args.drafters.split(","):
            entry = {"batch": batch, "drafter": drafter, "ar_s": ar, "tokens": tokens}
            for mode in ("coupled", "specactor"):
                times, differing, stats = [], 0, {}
                for _ in range(args.repeats):
                    t, out, stats = asyncio.run(speculative(mode, drafter, prompts, params, args.k, args.window))
                    times.append(t)
                    differing = max(differing, sum(a != b for a, b in zip(out, ref)))
                entry[f"{mode}_s"] = statistics.median(times)
                entry[f"{mode}_speedup"] = ar / entry[f"{mode}_s"]
                entry[f"{mode}_differing_samples"] = differing
                entry[f"{mode}_accepted_per_step"] = stats.get("accepted", 0) / max(stats.get("steps", 1), 1)
            entry["decoupled_over_coupled"] = entry["coupled_s"] / entry["specactor_s"]
            rows.append(entry)
            print(f"B={batch:2d} {drafter:6s} AR {ar:6.1f}s  coupled {entry['coupled_s']:6.1f}s "
                  f"({entry['coupled_speedup']:.2f}x)  decoupled {entry['specactor_s']:6.1f}s "
                  f"({entry['specactor_speedup']:.2f}x)  dec/coup {entry['decoupled_over_coupled']:.2f}x  "
                  f"differing {entry['coupled_differing_samples']}/{entry['specactor_differing_samples']}",
                  flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "rows": rows,
              "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
