"""vLLM with and without specactor on the long-tail workload, side by side in one script.

    python bench/vllm_backend.py [--prompts 8] [--n 4] [--max-tokens 768] [--temperature 1]
                                 [--modes ...] [--repeats 1] [--out bench/results/vllm_backend.json]

Modes (each run after the other on the same machine, the HumanEval prompts in GRPO groups, lengths
set by EOS up to ``--max-tokens``):

- ``vllm``: stock vLLM 0.32, no speculation (its own sampler; a separate process, unpatched);
- ``vllm+ngram``: stock vLLM with its own ngram speculation (4 tokens, prompt lookup 2-4);
- ``vllm+suffix``: stock vLLM with its suffix decoding (Arctic Inference's suffix trees over the
  prompt and earlier outputs, vLLM's defaults: up to 24 tokens, sized by the match); needs
  ``arctic-inference`` (``bash scripts/setup.sh --vllm-suffix``) and is left out, with a note,
  when it is not installed;
- ``vllm+keyed``: vLLM as specactor's verifier without drafts (``--backend vllm --mode
  autoregressive``): specactor's position-keyed sampler, so the same tokens as the next mode;
- ``vllm+specactor``: vLLM verifying what specactor's drafters (ngram, suffix) propose under the
  Fastest-of-N policy (``--backend vllm --mode specactor``);
- ``torch``, ``torch+specactor``: specactor's own engine, autoregressive and speculative.

Per mode: makespan, tokens/s, drafted/accepted, the time after half the samples finished (the
tail), and whether its samples equal those of the mode it must match (``vllm+specactor`` against
``vllm+keyed``; ``torch+specactor`` against ``torch``; at T=0 also ``vllm+specactor``,
``vllm+keyed``, ``vllm+ngram``, ``vllm+suffix`` against stock ``vllm``, where only numerics can make
greedy samples differ). Stock vLLM samples with its own random streams, so its lengths, and so its
makespan, differ from the keyed modes': compare its tokens/s.
With ``--repeats R`` the modes run R times, interleaved, every second time in reverse order (this
machine's speed drifts within minutes, and a run's speed depends on the one before it):
each pair's ratio is taken within a repeat, and the report gives every repeat and the medians.
The specactor modes decide on this machine's cost profile of their backend (measured once at
start-up, outside the timed part, and cached). Where ``vllm+keyed`` ran, the report adds its
ceilings: the policy and clairvoyant drafts replayed on its tokens with vLLM's cost profile
(``replayed``; :func:`specactor.bench.replay_runs.replay_ceilings`), and a perfect drafter on its
sample lengths (:func:`specactor.bench.ceilings.ceilings`), at the specactor mode's own window and
calibrated to its median makespan.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from specactor.bench.vllm_compare import (MODES, STOCK_SPECULATION, Workload, prompt_ids, replayed, run_stock,
                                          stock_worker, summary)
from specactor.config import DTYPES


def workload(args: argparse.Namespace) -> Workload:
    return Workload(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, temperature=args.temperature,
                    dtype=args.dtype, window=args.window, unseeded=args.unseeded)


async def specactor_run(args: argparse.Namespace, mode: str) -> tuple[dict, dict[str, list[int]]]:
    from specactor.config import EngineConfig
    from specactor.rollout_engine import RolloutEngine
    from specactor.protocol import SamplingParams

    prompts, _ = prompt_ids(args.prompts)
    backend = "vllm" if mode.startswith("vllm") else "torch"
    speculative = mode.endswith("specactor")
    config = EngineConfig(backend=backend, mode="specactor" if speculative else "autoregressive",
                          drafters=["ngram", "suffix"], max_batch=len(prompts) * args.n, max_len=1024,
                          window=args.window, dtype=args.dtype)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=7, n=args.n)
    ids = [f"p{i}" for i in range(len(prompts))]
    async with RolloutEngine(config) as engine:
        finish: list[float] = []
        results = []
        start = time.perf_counter()
        async for result in engine.stream(prompts, params, request_ids=ids):
            finish.append(time.perf_counter() - start)
            results.append(result)
        wall = time.perf_counter() - start
    figures = summary(finish, [len(r.token_ids) for r in results], wall,
                      sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results),
                      args.max_tokens)
    return figures, {r.request_id: list(r.token_ids) for r in results}


def _compare(runs: dict[str, dict], tokens: dict[str, dict[str, list[int]]], temperature: float) -> None:
    """Within one repeat: which samples differ from the mode they must match, and the speedups."""
    # stock vLLM samples differently at T > 0; at T = 0 both are greedy and only numerics can differ
    pairs = [("vllm+specactor", "vllm+keyed"), ("torch+specactor", "torch")]
    if temperature == 0:
        pairs += [("vllm+specactor", "vllm"), ("vllm+keyed", "vllm"), ("vllm+ngram", "vllm"), ("vllm+suffix", "vllm")]
    for fast, plain in pairs:
        if fast in tokens and plain in tokens:
            runs[fast]["differing_from_" + plain] = sum(tokens[fast][k] != tokens[plain][k] for k in tokens[plain])
            runs[fast]["speedup_vs_" + plain] = round(runs[plain]["makespan_s"] / runs[fast]["makespan_s"], 3)
    if "vllm+keyed" in tokens and "torch" in tokens:
        runs["vllm+keyed"]["differing_from_torch"] = sum(tokens["vllm+keyed"][k] != tokens["torch"][k]
                                                         for k in tokens["torch"])


def _medians(repeats: list[dict[str, dict]]) -> dict[str, dict]:
    """Per mode, the median over repeats of every number (differing counts: the most seen)."""
    out: dict[str, dict] = {}
    for mode in repeats[0]:
        rows = [r[mode] for r in repeats]
        out[mode] = {key: (max(row[key] for row in rows) if key.startswith("differing")
                           else round(statistics.median(row[key] for row in rows), 3))
                     for key in rows[0] if all(isinstance(row.get(key), (int, float)) for row in rows)}
    return out


def _write(args: argparse.Namespace, version: str, repeats: list[dict[str, dict]], replayed: dict | None = None) -> None:
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.uname().machine} {os.cpu_count()} cores",
                    "vllm": version, "command": "python bench/vllm_backend.py " + " ".join(sys.argv[1:]),
                    "workload": {"prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                                 "temperature": args.temperature, "window": args.window, "dtype": args.dtype},
                    "runs": repeats[0] if len(repeats) == 1 else _medians(repeats)}
    if len(repeats) > 1:
        report["repeats"] = repeats
    if replayed:
        report["replayed"] = replayed
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


def main() -> None:
    from specactor.cli.main import HelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="HumanEval problems")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (a GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=768, help="cap on a sample's length; EOS ends most before it")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="0: greedy, where every mode makes the same tokens")
    parser.add_argument("--modes", default=None,
                        help=f"comma-separated, of {', '.join(MODES)} (default: all of them; vllm+suffix only "
                             "where arctic-inference is installed)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every mode this many times, interleaved; every second time in reverse order")
    parser.add_argument("--window", type=int, default=None,
                        help="specactor's longest window (vLLM's num_speculative_tokens; default: EngineConfig's)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the model's precision in every mode (vLLM's and specactor's)")
    parser.add_argument("--unseeded", action="store_true",
                        help="stock vLLM modes: requests without a per-request seed (vLLM's own generator)")
    parser.add_argument("--out", default="bench/results/vllm_backend.json", help="where the JSON of every run goes")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a stock-vLLM run, in its own process
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(stock_worker(args.worker, workload(args))), flush=True)
        return
    from specactor.bench.suite import repeat_order
    from specactor.vllm_backend import require_vllm, suffix_decoding_missing

    version = require_vllm()
    modes = [m.strip() for m in (args.modes or ",".join(MODES)).split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode {unknown[0]!r}: choose from {', '.join(MODES)}")
    how = suffix_decoding_missing()
    if "vllm+suffix" in modes and how:
        if args.modes:
            parser.error(f"mode 'vllm+suffix' needs vLLM's suffix decoding: {how}")
        print(f"leaving out vllm+suffix: {how}", flush=True)
        modes.remove("vllm+suffix")
    repeats: list[dict[str, dict]] = []
    keyed: dict[str, list[int]] = {}
    for repeat in range(args.repeats):
        runs: dict[str, dict] = {}
        tokens: dict[str, dict[str, list[int]]] = {}
        for mode in repeat_order(modes, repeat):  # ABBA: the modes take turns going first
            print(f"{mode} (repeat {repeat + 1} of {args.repeats}) ...", flush=True)
            if mode in STOCK_SPECULATION:
                runs[mode] = run_stock(mode, workload(args))
                tokens[mode] = runs[mode].pop("token_ids")
            else:
                runs[mode], tokens[mode] = asyncio.run(specactor_run(args, mode))
            print(f"  {runs[mode]}", flush=True)
        _compare(runs, tokens, args.temperature)
        repeats.append(runs)
        _write(args, version, repeats)  # after every repeat: an interrupted run keeps what it measured
        keyed = tokens.get("vllm+keyed", keyed)
    if keyed:
        got = replayed(workload(args), keyed, statistics.median(r["vllm+keyed"]["makespan_s"] for r in repeats))
        print(f"replayed on vllm+keyed's tokens ({got['profile']}): policy {got['policy']['makespan_s']:.2f} s "
              f"({got['policy']['speedup']:.2f}x), clairvoyant drafts {got['clairvoyant']['makespan_s']:.2f} s "
              f"({got['clairvoyant']['speedup']:.2f}x), perfect drafter {got['perfect']['makespan_s']:.2f} s "
              f"({got['perfect']['speedup']:.2f}x)", flush=True)
        _write(args, version, repeats, got)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
