"""vLLM with and without specactor on the long-tail workload (``bench/vllm_backend.py`` is the
command line): the workload, a stock-vLLM run in its own unpatched process, and the ceilings
replayed on the ``vllm+keyed`` mode's samples.

A stock run is ``python -m specactor.bench.vllm_compare --worker MODE ...`` in a child process
(vLLM is imported there, never in the caller), which prints its result as one ``RESULT {json}``
line. vLLM is needed only by that child; the ceilings are replays.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specactor.config import DTYPES

MODES = ("vllm", "vllm+ngram", "vllm+suffix", "vllm+keyed", "vllm+specactor", "torch", "torch+specactor")
# stock vLLM, each in its own unpatched process, with its own speculative method or none
STOCK_SPECULATION: dict[str, dict | None] = {
    "vllm": None,
    "vllm+ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "vllm+suffix": {"method": "suffix"},
}


@dataclass(frozen=True)
class Workload:
    """What every mode runs: ``prompts`` HumanEval problems, ``n`` samples each (a GRPO group), up to
    ``max_tokens`` each, at ``temperature``, in ``dtype``; ``window``: specactor's longest window
    (None: EngineConfig's); ``unseeded``: stock vLLM's requests without a per-request seed."""

    prompts: int = 8
    n: int = 4
    max_tokens: int = 768
    temperature: float = 1.0
    dtype: str = "float32"
    window: int | None = None
    unseeded: bool = False


def prompt_ids(prompts: int) -> tuple[list[list[int]], list[int]]:
    """The first ``prompts`` HumanEval problems in the default model's chat template, and its EOS ids."""
    from specactor.engine.model_registry import resolve_model
    from specactor.prompts import humaneval_prompts
    from specactor.tokenizer import Tokenizer
    from specactor.engine.config import ModelConfig

    folder = resolve_model(None)
    tok = Tokenizer(folder)
    ids = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(prompts)]
    eos = sorted(set(ModelConfig.from_dir(folder).eos_token_ids) | {tok.eos_token_id})
    return ids, eos


def summary(finish_s: list[float], tokens: list[int], wall: float, drafted: int, accepted: int,
            max_tokens: int) -> dict:
    """One run's figures: makespan, tokens/s, the tail (after half the samples finished), drafts."""
    from specactor.bench.measure import phase_split  # the bench's own phases (the tail: after half finished)

    return {"makespan_s": round(wall, 2), "tokens": sum(tokens), "tokens_per_s": round(sum(tokens) / wall, 1),
            "tail_s": round(phase_split(finish_s, wall)[1], 2), "drafted": drafted, "accepted": accepted,
            "capped": sum(t >= max_tokens for t in tokens)}


def stock_worker(mode: str, work: Workload) -> dict:
    """Stock vLLM, in this (separate, unpatched) process: LLMEngine stepped here, finish times kept."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    from vllm import EngineArgs, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine

    from specactor.engine.model_registry import resolve_model
    from specactor.seeds import sample_seed

    prompts, eos = prompt_ids(work.prompts)
    spec = STOCK_SPECULATION[mode]
    folder = str(resolve_model(None))
    llm = LLMEngine.from_engine_args(EngineArgs(model=folder, tokenizer=folder, dtype=work.dtype, enforce_eager=True,
                                                max_model_len=1024, max_num_seqs=len(prompts) * work.n, seed=0,
                                                # a chunked prefill of a seeded request crashes vLLM 0.32 on
                                                # CPU ("CPU Generator does not use offset"): never chunk
                                                max_num_batched_tokens=32768,
                                                # vLLM's default, as its users run it (a group's prompt
                                                # computed once); specactor's modes share prompts too
                                                enable_prefix_caching=True, speculative_config=spec))
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        for s in range(work.n):
            rid = f"p{i}#{s}"
            llm.add_request(rid, {"prompt_token_ids": prompt}, SamplingParams(
                temperature=work.temperature, max_tokens=work.max_tokens, stop_token_ids=eos, ignore_eos=True,
                seed=None if work.unseeded else sample_seed(7, f"p{i}", s, 0), detokenize=False,
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
    figures = summary(finish, [len(t) for t in tokens.values()], wall, drafted, accepted, work.max_tokens)
    return {**figures, "token_ids": tokens}


def run_stock(mode: str, work: Workload) -> dict:
    """One stock-vLLM run of ``mode`` (a key of STOCK_SPECULATION) in its own unpatched process, on
    ``work`` (prompts, n, max_tokens, temperature, dtype, unseeded): its summary and its token ids
    per sample (``token_ids``). SystemExit with the child's output if it fails."""
    proc = subprocess.run([sys.executable, "-m", __name__, "--worker", mode, "--prompts", str(work.prompts),
                           "--n", str(work.n), "--max-tokens", str(work.max_tokens), "--dtype", work.dtype,
                           "--temperature", str(work.temperature)] + ["--unseeded"] * work.unseeded,
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


def replayed(work: Workload, keyed_tokens: dict[str, list[int]], keyed_s: float) -> dict:
    """The policy and clairvoyant drafts replayed on vllm+keyed's samples (``keyed_tokens`` by
    request id ``p{i}#{s}``, ``keyed_s`` its makespan), on vLLM's cost profile, at the window the
    specactor mode runs at (``work.window``, else vLLM's default), and a perfect drafter's makespan
    (every draft token right, drafting free) on the same lengths."""
    from specactor.bench.ceilings import ceilings
    from specactor.bench.replay_runs import replay_ceilings
    from specactor.bench.suite import ceiling_cost
    from specactor.config import EngineConfig

    prompts, _ = prompt_ids(work.prompts)
    samples = [(rid, prompts[int(rid.split("#")[0][1:])], tokens) for rid, tokens in keyed_tokens.items()]
    config = EngineConfig(backend="vllm", dtype=work.dtype, window=work.window)
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


def _worker_main(argv: list[str] | None = None) -> None:
    """``python -m specactor.bench.vllm_compare --worker MODE ...``: one stock run, printed as RESULT."""
    parser = argparse.ArgumentParser(description="one stock-vLLM run of run_stock's, in its own process")
    parser.add_argument("--worker", required=True, choices=sorted(STOCK_SPECULATION))
    parser.add_argument("--prompts", type=int, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--dtype", required=True, choices=DTYPES)
    parser.add_argument("--unseeded", action="store_true")
    args = parser.parse_args(argv)
    work = Workload(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, temperature=args.temperature,
                    dtype=args.dtype, unseeded=args.unseeded)
    print("RESULT " + json.dumps(stock_worker(args.worker, work)), flush=True)


if __name__ == "__main__":
    _worker_main()
