"""Autoregressive engine vs Hugging Face transformers ``generate``.

    python bench/vs_transformers.py [--tokens 64] [--repeats 3]

Same HumanEval chat prompts, greedy, same number of new tokens (EOS ignored,
so both produce exactly ``--tokens`` per request), both on all cores:
- batch 1: ``--batch1-prompts`` prompts one after another;
- batch 32: 32 prompts at once (transformers with left padding and an
  attention mask; our engine with its ragged batch).
Reports output tokens/s (medians of ``--repeats``), the ratio, and how many
outputs are token-identical. Writes bench/results/vs_transformers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.engine.weights import load_causal_lm


def ours(model, prompts: list[list[int]], batch: int, tokens: int) -> tuple[float, list[list[int]]]:
    outputs = []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        engine = Engine(model, max_batch=len(chunk), max_len=max(map(len, chunk)) + tokens)
        seqs = engine.run(Sequence(f"r{j}", p, SamplingParams(temperature=0, max_tokens=tokens), seed=0)
                          for j, p in enumerate(chunk))
        outputs += [s.output_ids for s in seqs]
    return len(prompts) * tokens / (time.perf_counter() - start), outputs


def hf_generate(hf, prompts: list[list[int]], batch: int, tokens: int, pad: int) -> tuple[float, list[list[int]]]:
    outputs = []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False, pad_token_id=pad)
        outputs += out[:, width:].tolist()
    return len(prompts) * tokens / (time.perf_counter() - start), outputs


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch1-prompts", type=int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "vs_transformers.json"))
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    folder = resolve_model(None)
    model = load_causal_lm(folder)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # generate exactly --tokens, like our engine
    tok = Tokenizer(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(32)]
    result: dict = {"date": time.strftime("%Y-%m-%d"), "tokens": args.tokens, "repeats": args.repeats,
                    "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
                               f"transformers {transformers.__version__}"}
    for label, batch, chunk in (("batch 1", 1, prompts[: args.batch1_prompts]), ("batch 32", 32, prompts)):
        ours_rates, hf_rates = [], []
        for _ in range(args.repeats):
            rate, ours_out = ours(model, chunk, batch, args.tokens)
            ours_rates.append(rate)
            rate, hf_out = hf_generate(hf, chunk, batch, args.tokens, pad=0)
            hf_rates.append(rate)
        same = sum(a == b for a, b in zip(ours_out, hf_out))
        row = {"specactor_tok_s": statistics.median(ours_rates), "transformers_tok_s": statistics.median(hf_rates),
               "runs": {"specactor": ours_rates, "transformers": hf_rates},
               "identical_outputs": f"{same}/{len(chunk)}"}
        row["ratio"] = row["specactor_tok_s"] / row["transformers_tok_s"]
        result[label] = row
        print(f"{label}: specactor {row['specactor_tok_s']:.1f} tok/s, transformers {row['transformers_tok_s']:.1f} "
              f"tok/s, ratio {row['ratio']:.2f}x, identical {row['identical_outputs']}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
