"""At T=1, does stock vLLM's own speculative decoding still sample from the model's distribution?

    python bench/vllm_spec_distribution.py [--prompts 24] [--n 4] [--max-tokens 256]
                                           [--modes vllm,vllm+ngram,vllm+suffix]
                                           [--out bench/results/vllm_spec_distribution.json]

Why: on the long-tail workload stock vLLM's speculative modes ran 15-22 of 32 samples to the
768-token cap against 8 without speculation (`bench/vllm_backend.py`, T=1, the same seeds). A
lossless speculative sampler changes which samples come out, not their distribution; so either
that was chance or vLLM's speculative path samples from something else. Each mode runs in its own
unpatched vLLM process (``bench/vllm_backend.py``'s stock worker,
:func:`specactor.bench.vllm_compare.run_stock`: the HumanEval prompts in GRPO groups, seeded
requests, T=1) and its tokens are judged against the model position by position
(:mod:`specactor.bench.calibration`: rank buckets, chi-square with 4 degrees of freedom), with the
test's power against a 2% shift and a deliberately wrong sampler (T=1.1) on the same positions.
Plain ``vllm`` is the control: it must pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from specactor.bench.vllm_compare import STOCK_SPECULATION, Workload, prompt_ids, run_stock


def main() -> None:
    from specactor.cli.main import HelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--prompts", type=int, default=24, help="HumanEval problems")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=256, help="cap on a sample's length")
    parser.add_argument("--modes", default="vllm,vllm+ngram,vllm+suffix",
                        help="stock vLLM modes of bench/vllm_backend.py to judge (vllm is the control)")
    parser.add_argument("--unseeded", action="store_true",
                        help="requests without a per-request seed (vLLM's own generator), to tell a seeded "
                             "path's fault from the speculative sampler's")
    parser.add_argument("--out", default="bench/results/vllm_spec_distribution.json", help="where the JSON goes")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in STOCK_SPECULATION]
    if unknown:
        parser.error(f"unknown mode {unknown[0]!r}: choose from {', '.join(STOCK_SPECULATION)}")
    from specactor.vllm_backend import suffix_decoding_missing

    how = suffix_decoding_missing()
    if "vllm+suffix" in modes and how:
        parser.error(f"mode 'vllm+suffix' needs vLLM's suffix decoding: {how}")
    if min(args.prompts, args.n, args.max_tokens) < 1:
        parser.error("--prompts, --n and --max-tokens must be at least 1")
    # what is judged: the model's own distribution, at T=1
    work = Workload(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, temperature=1.0,
                    unseeded=args.unseeded)

    from specactor.bench.calibration import chi_square_p, power_against_a_shift, score
    from specactor.engine.model_registry import resolve_model
    from specactor.engine.weights import load_causal_lm
    from specactor.vllm_backend import require_vllm

    version = require_vllm()
    prompts, _ = prompt_ids(args.prompts)
    model = load_causal_lm(resolve_model(None))
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.uname().machine} {os.cpu_count()} cores",
                    "vllm": version, "command": "python bench/vllm_spec_distribution.py " + " ".join(sys.argv[1:]),
                    "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens, "seeded": not args.unseeded,
                    "modes": {}}
    for mode in modes:
        print(f"{mode} ...", flush=True)
        run = run_stock(mode, work)
        samples = [(prompts[i], run["token_ids"][f"p{i}#{s}"]) for i in range(args.prompts) for s in range(args.n)]
        q, draws, wrong = score(model, samples, wrong_temperature=1.1)
        try:
            p_value = chi_square_p(q, draws)
        except ValueError as exc:  # too few positions where the model is uncertain
            raise SystemExit(f"{mode}: {exc}: give it more --prompts, --n or --max-tokens") from None
        row = {"positions": len(draws), "tokens_per_s": run["tokens_per_s"], "capped": run["capped"],
               "mean_length": round(sum(len(o) for _, o in samples) / len(samples), 1),
               "drafted": run["drafted"], "accepted": run["accepted"],
               "p_value": p_value, "power_vs_2pct_shift": power_against_a_shift(q),
               "wrong_sampler_T1.1_p_value": chi_square_p(q, wrong),
               "bucket_share_observed": [round(float((draws == b).float().mean()), 4) for b in range(5)],
               "bucket_share_expected": [round(float(x), 4) for x in q.mean(0)]}
        report["modes"][mode] = row
        print(f"  {json.dumps(row)}", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))  # after every mode: a stopped run keeps what it judged
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
