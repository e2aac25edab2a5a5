"""How many samples change with the batch size, and between autoregressive and specactor.

    python bench/batch_invariance.py [--prompts 64] [--n 4] [--tokens 256] [--batches 32,8,1]
                                     [--batch1-prompts N] [--dtype float32|bfloat16] [--device cpu|cuda]
                                     [--out PATH]

The same HumanEval samples (prompts x n, T=1, seeds by the one seed rule) are
decoded by the autoregressive engine at each batch size, and by specactor
(ngram + suffix, Fastest-of-N) at the first batch size. Position-keyed
sampling makes the tokens a function of the logits alone; what can still
change them is floating point: a batched matmul may sum in another order, and
where the two best Gumbel-perturbed scores are closer than that rounding, the
pick flips and the sample diverges from there on. This counts those samples
against the first batch size's autoregressive run, with the position where
each one first differs. Results are written after every run to
bench/results/batch_invariance.json, so a long run never loses what it did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

import torch

from specactor.config import DTYPES, EngineConfig, check_device, torch_dtype
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer


def decode_engine(prompts: list[list[int]], ids: list[str], params: SamplingParams, batch: int,
                  max_len: int, dtype: str, device: str = "cpu") -> dict[str, list[int]]:
    """The autoregressive engine in this process at ``batch`` requests per step."""
    from specactor.engine.llm_engine import Engine
    from specactor.engine.sequence import sample_sequences
    from specactor.engine.weights import load_causal_lm

    folder = resolve_model(None)
    model = load_causal_lm(folder, dtype=torch_dtype(dtype), device=device)
    eos = set(model.cfg.eos_token_ids) | {Tokenizer(folder).eos_token_id}
    seqs = sample_sequences(prompts, params, ids)
    Engine(model, max_batch=batch, max_len=max_len, eos_token_ids=eos).run(seqs)
    return {s.request_id: s.output_ids for s in seqs}


async def decode_specactor(prompts: list[list[int]], ids: list[str], params: SamplingParams, batch: int,
                           max_len: int, dtype: str, device: str = "cpu") -> dict[str, list[int]]:
    from specactor.rollout_engine import RolloutEngine

    config = EngineConfig(mode="specactor", drafters=["ngram", "suffix"], max_batch=batch, max_len=max_len,
                          dtype=dtype, device=device)
    async with RolloutEngine(config) as engine:
        return {r.request_id: r.token_ids for r in await engine.generate(prompts, params, request_ids=ids)}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batches", default="32,8,1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--batch1-prompts", type=int, default=None,
                        help="decode only the first N prompts' samples at batch 1 (it is the slowest by far)")
    parser.add_argument("--out", default="bench/results/batch_invariance.json")
    args = parser.parse_args()
    try:
        check_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    torch.set_num_threads(os.cpu_count() or 1)
    tok = Tokenizer(resolve_model(None))
    problems = humaneval_prompts(args.prompts)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in problems]
    ids = [p.id for p in problems]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.tokens, n=args.n, seed=args.seed)
    max_len = max(map(len, prompts)) + args.tokens
    batches = [int(b) for b in args.batches.split(",")]
    runs = [(f"autoregressive batch {b}", "engine", b) for b in batches]
    runs.insert(1, (f"specactor batch {batches[0]}", "specactor", batches[0]))
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args),
                    "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"
                    + (f", {torch.cuda.get_device_name(args.device)}" if args.device.startswith("cuda") else ""),
                    "samples": len(prompts) * args.n, "runs": []}
    reference: dict[str, list[int]] = {}
    for name, kind, batch in runs:
        start = time.perf_counter()
        if kind == "engine":
            count = args.batch1_prompts if batch == 1 and args.batch1_prompts else len(prompts)
            out = decode_engine(prompts[:count], ids[:count], params, batch, max_len, args.dtype, args.device)
        else:
            out = asyncio.run(decode_specactor(prompts, ids, params, batch, max_len, args.dtype, args.device))
        wall = time.perf_counter() - start
        reference = reference or out
        firsts = {rid: first_difference(out[rid], reference[rid]) for rid in out}
        differing = {rid: pos for rid, pos in firsts.items() if pos is not None}
        report["runs"].append({"name": name, "batch": batch, "wall_s": round(wall, 1),
                               "samples": len(out), "tokens": sum(map(len, out.values())),
                               "differing": len(differing),
                               "first_difference_at": differing})
        print(f"{name}: {wall:.0f} s, {len(differing)} of {len(out)} samples differ from {runs[0][0]}"
              + (f" (first at positions {sorted(differing.values())})" if differing else ""), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
