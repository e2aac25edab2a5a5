"""At T=1, do specactor-on-vLLM and vLLM's own sampler both draw from the model's distribution?

    python bench/vllm_distribution.py [--samples 96] [--max-tokens 256] [--out bench/results/vllm_distribution.json]

One vLLM engine (the default model, fp32) runs the same HumanEval prompts twice at T=1: through
specactor's verification (position-keyed sampling, drafts from specactor's ngram drafter on each
sample's own tokens: verified, some accepted) and as plain vLLM requests (vLLM's own sampler, no drafts). Both
runs' tokens are judged against the model, position by position, by
:mod:`specactor.bench.calibration` (rank buckets, chi-square with 4 degrees of freedom); beside
each p-value, the test's power against a 2% shift on the same positions, and a deliberately wrong
sampler (T=1.1) at the same positions, which must fail. The CI test
(``tests/vllm_backend/test_distribution.py``) runs the specactor arm at a smaller size.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def keyed_run(engine, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], int, int]:
    """specactor's verification on vLLM, with the ngram drafter proposing 4 tokens before every step."""
    from specactor.drafters.base import DraftState
    from specactor.drafters.ngram import NgramDrafter
    from specactor.protocol import SamplingParams
    from specactor.engine.sequence import Sequence

    seqs = [Sequence(f"k{i}", p, SamplingParams(temperature=1.0, max_tokens=max_tokens), seed=1000 + i)
            for i, p in enumerate(prompts)]
    drafter = NgramDrafter(min_n=2, max_n=4)
    states = {s.request_id: DraftState(s.request_id, s.prompt_ids, seed=s.seed) for s in seqs}
    for seq in seqs:
        engine.add(seq)
        drafter.start(states[seq.request_id])
    while engine.has_work:
        running = engine.running
        for seq in running:
            state = states[seq.request_id]
            state.committed = list(seq.output_ids)
            drafter.observe(state, 0, [])
        proposals = drafter.propose([states[s.request_id] for s in running], 4)
        engine.step({s.request_id: ("ngram", d) for s, d in zip(running, proposals)})
    return [s.output_ids for s in seqs], sum(s.drafted for s in seqs), sum(s.accepted for s in seqs)


def stock_run(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                            stop_token_ids=sorted(engine.eos_token_ids))
    for i, prompt in enumerate(prompts):
        engine.llm.add_request(f"stock{i}", {"prompt_token_ids": prompt}, params)
    outputs: dict[str, list[int]] = {}
    while engine.llm.has_unfinished_requests():
        for out in engine.llm.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
    return [outputs[f"stock{i}"] for i in range(len(prompts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=96, help="samples per arm (HumanEval prompts x 4)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", default="bench/results/vllm_distribution.json")
    args = parser.parse_args()
    from specactor.bench.calibration import chi_square_p, power_against_a_shift, score
    from specactor.engine.model_registry import resolve_model
    from specactor.prompts import humaneval_prompts
    from specactor.tokenizer import Tokenizer
    from specactor.engine.config import ModelConfig
    from specactor.engine.weights import load_causal_lm
    from specactor.vllm_backend import require_vllm
    from specactor.vllm_backend.engine import VllmEngine

    version = require_vllm()
    folder = resolve_model(None)
    tok = Tokenizer(folder)
    texts = humaneval_prompts(max(1, args.samples // 4))
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in texts for _ in range(4)]
    prompts = prompts[:args.samples]
    eos = sorted(set(ModelConfig.from_dir(folder).eos_token_ids) | {tok.eos_token_id})
    engine = VllmEngine(folder, max_batch=48, max_len=max(map(len, prompts)) + args.max_tokens + 8,
                        eos_token_ids=eos, max_draft=4)
    model = load_causal_lm(folder)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.uname().machine} {os.cpu_count()} cores",
                    "vllm": version, "samples": len(prompts), "max_tokens": args.max_tokens, "arms": {}}
    t0 = time.perf_counter()
    keyed, drafted, accepted = keyed_run(engine, prompts, args.max_tokens)
    keyed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    stock = stock_run(engine, prompts, args.max_tokens)
    stock_s = time.perf_counter() - t0
    for arm, outputs, seconds, extra in (("specactor", keyed, keyed_s, {"drafted": drafted, "accepted": accepted}),
                                         ("vllm", stock, stock_s, {})):
        q, draws, wrong = score(model, list(zip(prompts, outputs)), wrong_temperature=1.1)
        row = {"positions": len(draws), "generate_s": round(seconds, 1), "p_value": chi_square_p(q, draws),
               "power_vs_2pct_shift": power_against_a_shift(q), "wrong_sampler_T1.1_p_value": chi_square_p(q, wrong),
               "bucket_share_observed": [round(float((draws == b).float().mean()), 4) for b in range(5)],
               "bucket_share_expected": [round(float(x), 4) for x in q.mean(0)], **extra}
        report["arms"][arm] = row
        print(arm, json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
