"""The learned drafter: acceptance per draft position after 1, 2 and 3 rounds of training, its
drafting cost against a target decode step, and layer-skipping self-drafting beside it.

    python bench/learned_drafter.py [--prompts 8] [--held-out 4] [--n 4] [--max-tokens 256]
                                    [--epochs 3] [--out bench/results/learned_drafter.json]

Epoch e: the target (autoregressive, T=1) rolls out the training prompts x n with epoch e's seeds;
the drafter is measured on those new samples *before* it trains on them (same prompts, new
samples: what the next RL epoch sees) and on held-out prompts (T=1 and T=0 rollouts of prompts it
never trains on), then trains on them. Acceptance is teacher-forced: at every 8th output position
of a sample the drafter proposes 4 tokens from the committed context with the target's noise;
position j counts as accepted when the first j drafted tokens equal the target's. No weight update
happens here (the target is fixed), so this isolates what the drafter learns from the rollouts.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specactor.drafters.base import DraftState
from specactor.drafters.learned import LearnedDrafter
from specactor.drafters.model import ModelDrafter
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import sample_sequences
from specactor.engine.kv_cache import KVCache
from specactor.engine.weights import load_causal_lm

K = 4


def rollout(engine: Engine, prompts: list[list[int]], ids: list[str], n: int, temperature: float, max_tokens: int,
            seed: int) -> list:
    seqs = sample_sequences(prompts, SamplingParams(temperature=temperature, max_tokens=max_tokens, n=n, seed=seed),
                            ids)
    return engine.run(seqs)


def acceptance(drafter: ModelDrafter, seqs: list, temperature: float, stride: int = 8) -> dict:
    """Per draft position j: the share of proposals whose first j tokens were all right."""
    hits, proposals = [0] * (K + 1), 0
    for seq in seqs:
        out = seq.output_ids
        states = [DraftState(f"{seq.request_id}@{t}", seq.prompt_ids, committed=out[:t], seed=seq.seed,
                             temperature=temperature) for t in range(0, len(out) - K, stride)]
        for i in range(0, len(states), drafter.max_slots):
            chunk = states[i:i + drafter.max_slots]
            for s in chunk:
                drafter.start(s)
            for s, draft in zip(chunk, drafter.propose(chunk, K)):
                tally(hits, draft, out[len(s.committed):])
                proposals += 1
                drafter.finish(s)
    return summarise(hits, proposals)


def tally(hits: list[int], draft: list[int], truth: list[int]) -> None:
    """Count one proposal: position j is right when the first j drafted tokens all are."""
    right = 0
    while right < min(K, len(draft), len(truth)) and draft[right] == truth[right]:
        right += 1
    for j in range(1, right + 1):
        hits[j] += 1


def summarise(hits: list[int], proposals: int) -> dict:
    return {"per_position": [round(hits[j] / max(proposals, 1), 4) for j in range(1, K + 1)],
            "mean_accepted": round(sum(hits[1:]) / max(proposals, 1), 3), "proposals": proposals}


def draft_ms_per_token(drafter: ModelDrafter, seq, repeats: int = 15) -> float:
    """Batch 1, decoupled-style: one proposal of K tokens after each committed token."""
    state = DraftState("cost", seq.prompt_ids, committed=seq.output_ids[:64], seed=1, temperature=1.0)
    drafter.start(state)
    drafter.propose([state], K)
    times = []
    for i in range(repeats):
        state.committed.append(seq.output_ids[64 + i] if 64 + i < len(seq.output_ids) else 0)
        t0 = time.perf_counter()
        drafter.propose([state], K)
        times.append(time.perf_counter() - t0)
    drafter.finish(state)
    return 1000 * statistics.median(times) / K


def decode_ms(model, seq, repeats: int = 15) -> float:
    """The target's decode step at batch 1 (context 64 + prompt), packed as the engine runs it."""
    cache = KVCache(model.cfg, 1, 2048)
    context = seq.prompt_ids + seq.output_ids[:64]
    model(torch.tensor(context), [len(context)], cache, torch.tensor([len(context) - 1]))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(torch.tensor([5]), [1], cache)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def layer_skip(target_folder: Path, layers: int) -> ModelDrafter:
    """Self-drafting with the target's first ``layers`` layers, its final norm and head (untrained)."""
    model = load_causal_lm(target_folder)
    model.layers = model.layers[:layers]
    model.cfg = replace(model.cfg, num_layers=layers)  # the drafter's KV cache: those layers only
    model.pack()
    return ModelDrafter(model, max_slots=64, max_len=2048)


def write_report(out: str, report: dict, started: float) -> None:
    """The report as JSON at ``out``, with the script's wall time."""
    report["wall_s"] = round(time.perf_counter() - started, 1)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--held-out", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--out", default="bench/results/learned_drafter.json")
    args = parser.parse_args()
    started = time.perf_counter()
    folder = resolve_model(None)
    tok = Tokenizer(folder)
    texts = humaneval_prompts(args.prompts + args.held_out)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in texts]
    ids = [f"p{i}" for i in range(len(prompts))]
    target = load_causal_lm(folder)
    eos = set(target.cfg.eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    engine = Engine(target, max_batch=64, max_len=max(map(len, prompts)) + args.max_tokens, eos_token_ids=eos)
    train_p, train_ids = prompts[:args.prompts], ids[:args.prompts]
    held_p, held_ids = prompts[args.prompts:], ids[args.prompts:]
    held = {t: rollout(engine, held_p, held_ids, 2, t, args.max_tokens, seed=99) for t in (1.0, 0.0)}
    drafter = LearnedDrafter(target, layers=args.layers, vocab=args.vocab, max_slots=64, max_len=2048,
                             max_train_s=None)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()} "
                    f"{torch.get_num_threads()} threads, torch {torch.__version__}", "args": vars(args),
                    "epochs": [], "layer_skip": []}
    probe = held[1.0][0]
    report["target_decode_ms"] = round(decode_ms(target, probe), 2)
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        fresh = rollout(engine, train_p, train_ids, args.n, 1.0, args.max_tokens, seed=epoch)
        roll_s = time.perf_counter() - t0
        row = {"epoch": epoch, "rollout_s": round(roll_s, 1), "rollout_tokens": sum(len(s.output_ids) for s in fresh),
               "trained_rounds_before": len(drafter.reports)}
        if drafter.trained:
            row["same_prompts_new_samples_T1"] = acceptance(drafter, fresh, 1.0)
        for seq in fresh:
            drafter.add_rollout(seq.prompt_ids, seq.output_ids)
        train = drafter.train()
        row["train"] = asdict(train) if train else None
        row["held_out_T1"] = acceptance(drafter, held[1.0], 1.0)
        row["held_out_T0"] = acceptance(drafter, held[0.0], 0.0)
        row["draft_ms_per_token"] = round(draft_ms_per_token(drafter, probe), 2)
        report["epochs"].append(row)
        print(json.dumps(row), flush=True)
    for layers in (2, 4, 8):
        skip = layer_skip(folder, layers)
        row = {"layers": layers, "held_out_T1": acceptance(skip, held[1.0], 1.0),
               "held_out_T0": acceptance(skip, held[0.0], 0.0), "draft_ms_per_token": round(draft_ms_per_token(skip, probe), 2)}
        report["layer_skip"].append(row)
        print(json.dumps(row), flush=True)
    write_report(args.out, report, started)


if __name__ == "__main__":
    main()
