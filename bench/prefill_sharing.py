"""A group's prompt prefilled once against once per sample: the engine alone, interleaved.

    python bench/prefill_sharing.py [--backend torch|vllm] [--prompts 8] [--n 4] [--max-tokens 768]
                                    [--temperatures 1,0] [--repeats 2] [--out bench/results/prefill_sharing.json]

GRPO rolls out n samples of every prompt. With ``share_prompts`` (the default) the engine
prefills one sample of a group and lets the others copy its cached prompt, feeding only the
prompt's last token (on ``--backend vllm``: vLLM's prefix cache, which computes a prompt's full
cache blocks once); without it every sample computes the same prompt. Both run autoregressive
decoding on the bench's workload (HumanEval prompts in groups, lengths set by EOS), one after
the other within each repeat (this machine's speed drifts within minutes). Per run: makespan,
prompt tokens fed, the time of the steps that fed prompts, and how many samples differ between
the two (floating point may flip a near-tie: the first token of a sample that copied its prompt
comes from a one-token step instead of the prompt's own forward). On vLLM the prompt steps' time
is that of the steps in which a sample's first token came (vLLM reports no prefill apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path

from specactor.bench.suite import BenchOptions, build_workload
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import sample_sequences
from specactor.engine.weights import load_causal_lm


def _engine(backend: str, model, work, share: bool):
    max_len = max(map(len, work.prompt_ids)) + work.max_tokens
    batch = len(work.prompt_ids) * work.n
    if backend == "vllm":
        from specactor.vllm_backend.engine import VllmEngine

        return VllmEngine(work.folder, max_batch=batch, max_len=max_len, eos_token_ids=work.eos, prefix_caching=share)
    return Engine(model, max_batch=batch, max_len=max_len, eos_token_ids=work.eos, share_prompts=share)


def _run(backend: str, model, work, temperature: float, share: bool) -> tuple[dict, dict[str, list[int]]]:
    engine = _engine(backend, model, work, share)
    seqs = sample_sequences(work.prompt_ids, work.params(temperature, 0), work.request_ids())
    reports: list = []
    start = time.perf_counter()
    engine.run(seqs, on_step=reports.append)
    makespan = time.perf_counter() - start
    steps = len(reports)
    prefill_tokens = sum(r.prefill_tokens for r in reports)
    prefill_s = sum(r.forward_s for r in reports if r.prefill_tokens)
    tokens = {s.request_id: s.output_ids for s in seqs}
    return ({"makespan_s": round(makespan, 2), "steps": steps, "prompt_tokens_fed": prefill_tokens,
             "prompt_steps_s": round(prefill_s, 2), "tokens": sum(map(len, tokens.values()))}, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("torch", "vllm"), default="torch")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (the GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--temperatures", default="1,0")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="bench/results/prefill_sharing.json")
    args = parser.parse_args()
    work = build_workload(BenchOptions(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, epochs=1))
    model = load_causal_lm(work.folder) if args.backend == "torch" else None
    report = {"date": date.today().isoformat(), "backend": args.backend, "prompts": args.prompts, "n": args.n,
              "max_tokens": args.max_tokens, "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for repeat in range(args.repeats):
            shared, a = _run(args.backend, model, work, temperature, True)
            plain, b = _run(args.backend, model, work, temperature, False)
            row = {"temperature": temperature, "repeat": repeat + 1, "shared": shared, "per_sample": plain,
                   "speedup": round(plain["makespan_s"] / shared["makespan_s"], 3),
                   "samples_differing": sum(a[k] != b[k] for k in a)}
            report["runs"].append(row)
            print(json.dumps(row), flush=True)
            out.write_text(json.dumps(report, indent=1))
    for temperature in sorted({r["temperature"] for r in report["runs"]}):
        ratios = [r["speedup"] for r in report["runs"] if r["temperature"] == temperature]
        report[f"speedup_median_T{temperature:g}"] = statistics.median(ratios)
        print(f"T={temperature:g}: shared prompts {ratios} x (median {statistics.median(ratios):.3f}x)")
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
