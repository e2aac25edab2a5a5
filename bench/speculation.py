"""Speedup of coupled, decoupled and policy-driven speculation over autoregressive.

    python bench/speculation.py [--drafters ngram,suffix,model] [--batches 1,8,32] [--n 4]
                                [--temperatures 0,1] [--tokens 96] [--repeats 3]

For each temperature and batch size B, ceil(B/n) HumanEval chat prompts with n
samples each (a GRPO group; n is capped at B) are decoded with the same seeds
by every configuration, all through RolloutEngine with the verifier in its own
process over ipc (the same engine, so only the drafting differs):

  autoregressive       no drafts
  coupled <d>          drafter d, strict draft-then-verify barrier, k tokens
  decoupled <d>        drafter d, decoupled (specactor mode, static assignment)
  specactor            the cheap drafters (ngram, suffix), Fastest-of-N policy (bandit, windows, racing)
  specactor +model     every drafter, Fastest-of-N policy

The verifier gets every core (or --verifier-threads); a model drafter in its own
process shares them, and the policy prices it so (EngineConfig.drafters_on_verifier).

Runs are interleaved across repeats (AR, then each config, then again) so that
drift on a shared machine hits them alike; the medians are reported. Time is
measured after start-up (model loading excluded), from submitting the batch to
the last result. Every sample is compared token for token with autoregressive.
Writes bench/results/speculation.json and prints a markdown table.
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

from specactor.config import EngineConfig
from specactor.rollout_engine import RolloutEngine
from specactor.events import configure_events
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer


async def run_once(config: EngineConfig, prompts: list[list[int]], params: SamplingParams
                   ) -> tuple[float, list[list[int]], dict]:
    async with RolloutEngine(config) as engine:
        # one short request first so that lazy initialisation is not timed
        await engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=2), request_ids=["warm"])
        start = time.perf_counter()
        results = await engine.generate(prompts, params, request_ids=[f"p{i}" for i in range(len(prompts))])
        elapsed = time.perf_counter() - start
        stats = await engine.stats()
    per_method: dict[str, list[int]] = {}
    for r in results:
        for method, counts in r.stats.per_method.items():
            acc = per_method.setdefault(method, [0, 0, 0])
            acc[0] += counts["drafted"]
            acc[1] += counts["accepted"]
            acc[2] += counts["steps"]
    stats["per_method"] = per_method
    stats["verify_steps"] = sum(r.stats.verify_steps for r in results)
    return elapsed, [r.token_ids for r in results], stats


def configs(drafters: list[str], args: argparse.Namespace, batch: int) -> dict[str, EngineConfig]:
    common = dict(k=args.k, window=args.window, max_batch=batch, max_len=1024, transport="ipc", processes=True,
                  verifier_threads=args.verifier_threads, drafter_threads=args.drafter_threads)
    out = {"autoregressive": EngineConfig(mode="autoregressive", **common)}
    for d in drafters:
        out[f"coupled {d}"] = EngineConfig(mode="coupled", drafters=[d], **common)
        out[f"decoupled {d}"] = EngineConfig(mode="specactor", drafters=[d], policy=False, **common)
    cheap = [d for d in drafters if d != "model"]
    out["specactor"] = EngineConfig(mode="specactor", drafters=cheap or drafters, policy=True, **common)
    if "model" in drafters and cheap:
        out["specactor +model"] = EngineConfig(mode="specactor", drafters=drafters, policy=True, **common)
    return out


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafters", default="ngram,suffix,model")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verifier-threads", type=int, default=None,
                        help="torch threads of the verifier (default: every core, minus the model drafter's)")
    parser.add_argument("--drafter-threads", type=int, default=1,
                        help="torch threads of a model drafter in its own process (default 1)")
    parser.add_argument("--events", default=None, help="write every run's events here (JSON lines)")
    parser.add_argument("--only", default="", help="comma-separated config names to run (default all)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "speculation.json"))
    args = parser.parse_args()
    drafters = args.drafters.split(",")
    if args.events:
        configure_events(args.events, console_level=None)
    tok = Tokenizer(resolve_model(None))
    rows = []
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            n = min(args.n, batch)
            prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}])
                       for p in humaneval_prompts(-(-batch // n))]
            params = SamplingParams(temperature=temperature, max_tokens=args.tokens, seed=17, n=n)
            todo = configs(drafters, args, len(prompts) * n)
            if args.only:
                todo = {k: v for k, v in todo.items() if k in args.only.split(",") or k == "autoregressive"}
            times: dict[str, list[float]] = {name: [] for name in todo}
            outputs: dict[str, list[list[int]]] = {}
            stats: dict[str, dict] = {}
            differing = {name: 0 for name in todo}
            for _ in range(args.repeats):
                for name, config in todo.items():
                    t, out, st = asyncio.run(run_once(config, prompts, params))
                    times[name].append(t)
                    stats[name] = st
                    if name == "autoregressive":
                        outputs.setdefault(name, out)
                    differing[name] = max(differing[name], sum(a != b for a, b in zip(out, outputs[
                        "autoregressive"])))
                    print(f"T={temperature} B={len(prompts) * n} {name:18s} {t:6.2f}s", flush=True)
            ar = statistics.median(times["autoregressive"])
            tokens = sum(map(len, outputs["autoregressive"]))
            for name in todo:
                st = stats[name]
                median = statistics.median(times[name])
                verifier = st.get("verifier", {})
                rows.append({
                    "temperature": temperature, "batch": len(prompts) * n, "config": name, "median_s": median,
                    "times_s": times[name], "speedup": ar / median, "tokens": tokens,
                    "tokens_per_s": tokens / median, "differing_samples": differing[name],
                    # per request and verify step (tokens committed per step = this + 1)
                    "accepted_per_step": verifier.get("accepted", 0) / max(st["verify_steps"], 1),
                    "per_method": st["per_method"], "policy": st.get("policy", {}),
                })
    print()
    print("| T | batch | config | median time | speedup vs AR | tokens/s | accepted/step | differing |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['temperature']:g} | {r['batch']} | {r['config']} | {r['median_s']:.2f} s | "
              f"{r['speedup']:.2f}x | {r['tokens_per_s']:.1f} | {r['accepted_per_step']:.2f} | "
              f"{r['differing_samples']} |")
    result = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "rows": rows,
              "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
