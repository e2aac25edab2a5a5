"""Drafter acceptance on HumanEval: a model drafter with shared noise vs argmax vs n-gram.

    .venv/bin/python bench/drafter_acceptance.py                # 8 prompts, k=4, 64 tokens (~4 min)
    .venv/bin/python bench/drafter_acceptance.py -n 4 --drafters int8w,int8w-argmax,fp32,ngram --speed-quants ""

1. Reference outputs: the fp32 target engine decodes N HumanEval prompts (chat
   template) autoregressively at each temperature (default 1 and 0),
   ``--max-tokens`` tokens each, with a per-request seed.
2. Replay: at every output position t of every reference (with t + k inside
   it), the drafter proposes k tokens from the *true* context (prompt +
   reference[:t], empty lookahead, the request's seed and temperature), and
   we count how many leading tokens equal reference[t:t+k]. This is exactly
   what the verifier would accept (it accepts a draft token only where it
   equals the target's own position-keyed sample), measured at every
   position instead of only at the ones a real run visits.

Reported per drafter and temperature: ``acc@j`` = fraction of positions whose
first j drafted tokens are all accepted (j = 1..k), ``mean acc`` = mean
accepted length (0..k), and the drafting time per drafted token during the
replay (all prompts batched). A speed section times steady-state drafting
(k-token proposals continuing a lookahead, one token fed per forward) at
batch 1 and 8 for each model copy, taking the fastest of ``--repeats`` rounds
(the machine is shared, so the minimum is the least disturbed figure).

Drafters: ``ngram``, ``suffix``, or ``QUANT`` (shared noise) / ``QUANT-argmax`` with QUANT
one of ``int8w`` (int8 weight-only, bf16 activations: the default draft
model), ``int8`` (torch.ao dynamic quantisation), ``bf16``, ``fp32`` (the
target itself: the upper bound; exactly 4.00 would need batch-invariant
float rounding, which holds here up to rare near-ties); ``llama-q8_0`` / ``llama-q4_0``: the
target's weights quantised by :mod:`specactor.engine.gguf_export` and run by llama.cpp
(:class:`specactor.drafters.llama_cpp_copy.LlamaCppDrafter`; needs ``scripts/setup.sh --llama-cpp``). Writes
``bench/results/drafter_acceptance.json`` and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from specactor.drafters.base import DraftState
from specactor.drafters.model import QUANT_MODES, ModelDrafter, load_draft_model
from specactor.drafters.registry import make_drafter
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer
from specactor.seeds import derive_seed
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.engine.weights import load_causal_lm

ROOT = Path(__file__).resolve().parent
#: model copies run by llama.cpp: the target's weights written as GGUF at that quantisation
LLAMA_QUANTS = ("llama-q8_0", "llama-q4_0")


def references(target, prompts, temperature, max_tokens, eos) -> list[list[int]]:
    engine = Engine(target, max_batch=len(prompts), max_len=max(map(len, prompts)) + max_tokens + 8,
                    eos_token_ids=eos)
    seqs = engine.run(Sequence(f"p{i}", p, SamplingParams(temperature=temperature, max_tokens=max_tokens),
                               seed=derive_seed("drafter-bench", i)) for i, p in enumerate(prompts))
    return [s.output_ids for s in seqs]


def replay(drafter, prompts, refs, temperature, k) -> dict:
    """Propose k tokens at every position of every reference; count the accepted prefix."""
    states = [DraftState(f"p{i}", list(p), seed=derive_seed("drafter-bench", i), temperature=temperature)
              for i, p in enumerate(prompts)]
    for s in states:
        drafter.start(s)
    prefix_ok = [0] * (k + 1)  # prefix_ok[j]: positions whose first j tokens were all accepted
    positions = 0
    accepted_total = 0
    drafted = 0
    seconds = 0.0
    active = list(range(len(states)))
    for t in range(max(map(len, refs))):
        for i in [i for i in active if t + k > len(refs[i])]:
            drafter.finish(states[i])
            active.remove(i)
        if not active:
            break
        batch = [states[i] for i in active]
        t0 = time.perf_counter()
        proposals = drafter.propose(batch, k)
        seconds += time.perf_counter() - t0
        for i, state, draft in zip(active, batch, proposals):
            ref = refs[i][t:t + k]
            n = 0
            while n < min(len(draft), k) and draft[n] == ref[n]:
                n += 1
            for j in range(n + 1):
                prefix_ok[j] += 1
            positions += 1
            accepted_total += n
            drafted += len(draft)
            # the caller's protocol: the proposal becomes the lookahead, then the verdict arrives
            state.lookahead.extend(draft)
            state.observe(t, [refs[i][t]])
            drafter.observe(state, t, [refs[i][t]])
            state.lookahead.clear()  # replay from the true context, not from what survived
    for i in active:
        drafter.finish(states[i])
    return {
        "positions": positions,
        "acc": [prefix_ok[j] / max(positions, 1) for j in range(1, k + 1)],
        "mean_accepted": accepted_total / max(positions, 1),
        "drafted": drafted,
        "ms_per_token": 1000 * seconds / max(drafted, 1),
    }


def speed(make, prompts, batch, k, rounds, repeats) -> float:
    """Fastest ms per drafted token over ``repeats`` rounds of steady-state drafting; ``make(slots,
    max_len)`` builds the drafter."""
    drafter = make(batch, max(map(len, prompts)) + k * rounds * (repeats + 2) + 8)
    states = [DraftState(f"s{i}", list(prompts[i % len(prompts)]), seed=i, temperature=1.0) for i in range(batch)]
    for s in states:
        drafter.start(s)
    for s, d in zip(states, drafter.propose(states, k)):  # prefill, not timed
        s.lookahead.extend(d)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = 0
        for _ in range(rounds):
            for s, d in zip(states, drafter.propose(states, k)):
                s.lookahead.extend(d)
                n += len(d)
        best = min(best, (time.perf_counter() - t0) / n)
    return 1000 * best


def parse_drafters(text: str) -> list[tuple[str, str | None, str]]:
    """'int8,int8-argmax,ngram' -> [(label, quant or None, noise)]."""
    out = []
    for label in [x.strip() for x in text.split(",") if x.strip()]:
        if label in ("ngram", "suffix"):
            out.append((label, None, ""))
            continue
        quant, noise = (label.removesuffix("-argmax"), "argmax") if label.endswith("-argmax") else (label, "shared")
        if (quant not in QUANT_MODES and quant not in LLAMA_QUANTS) or noise not in ("shared", "argmax"):
            raise SystemExit(f"unknown drafter {label!r}: use ngram, suffix or QUANT[-argmax], "
                             f"QUANT in {QUANT_MODES + LLAMA_QUANTS}")
        out.append((label, quant, noise))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--num-prompts", type=int, default=8)
    ap.add_argument("-k", type=int, default=4, help="tokens per proposal")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="1,0")
    ap.add_argument("--drafters", default="int8w,int8w-argmax,int8,bf16,ngram")
    ap.add_argument("--speed-quants", default="fp32,int8w,bf16,int8",
                    help="model copies timed at batch 1 and 8 (empty: skip the speed section)")
    ap.add_argument("--speed-batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--model", default=None, help="target model (default: the default model)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "drafter_acceptance.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    folder = resolve_model(args.model)
    tok = Tokenizer(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}])
               for p in humaneval_prompts(args.num_prompts)]
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    target = load_causal_lm(folder)
    drafters = parse_drafters(args.drafters)
    temps = [float(x) for x in args.temperatures.split(",")]
    models: dict[str, object] = {"fp32": target}

    def drafter_for(quant: str, slots: int, max_len: int, noise: str = "shared"):
        if quant in LLAMA_QUANTS:
            from specactor.drafters.llama_cpp_copy import LlamaCppDrafter

            return LlamaCppDrafter.from_folder(folder, max_slots=slots, max_len=max_len,
                                               quant=quant.removeprefix("llama-"), noise=noise)
        return ModelDrafter(model_for(quant), max_slots=slots, max_len=max_len, noise=noise)

    def model_for(quant: str):
        if quant not in models:
            t0 = time.perf_counter()
            models[quant] = load_draft_model(folder, quant)
            print(f"loaded {quant} copy in {time.perf_counter() - t0:.1f} s", flush=True)
        return models[quant]

    rows = []
    for temp in temps:
        t0 = time.perf_counter()
        refs = references(target, prompts, temp, args.max_tokens, eos)
        print(f"T={temp:g}: references ({sum(map(len, refs))} tokens) in {time.perf_counter() - t0:.1f} s",
              flush=True)
        for label, quant, noise in drafters:
            t0 = time.perf_counter()
            if quant is None:
                drafter = make_drafter(label)
            else:
                drafter = drafter_for(quant, len(prompts), max(map(len, prompts)) + args.max_tokens + args.k + 8, noise)
            r = replay(drafter, prompts, refs, temp, args.k)
            r.update(drafter=label, temperature=temp)
            rows.append(r)
            print(f"  {label:14s} mean accepted {r['mean_accepted']:.2f} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)

    speeds = []
    for quant in [q for q in args.speed_quants.split(",") if q]:
        for b in [int(x) for x in args.speed_batches.split(",")]:
            ms = speed(lambda slots, max_len, q=quant: drafter_for(q, slots, max_len), prompts, b, args.k,
                       rounds=4, repeats=args.repeats)
            speeds.append({"model": quant, "batch": b, "ms_per_token": ms})
            print(f"  speed {quant} batch {b}: {ms:.2f} ms/token", flush=True)

    k = args.k
    print()
    print(f"Acceptance on {len(prompts)} HumanEval prompts, {args.max_tokens} reference tokens, k={k}")
    print()
    print("| drafter | T | " + " | ".join(f"acc@{j}" for j in range(1, k + 1)) + " | mean acc | ms/token (replay) |")
    print("|---|---|" + "---|" * k + "---|---|")
    for r in rows:
        print(f"| {r['drafter']} | {r['temperature']:g} | " + " | ".join(f"{a:.2f}" for a in r["acc"])
              + f" | {r['mean_accepted']:.2f} | {r['ms_per_token']:.2f} |")
    if speeds:
        print()
        print(f"Steady-state drafting time per token (fastest of {args.repeats}), threads={torch.get_num_threads()}")
        print()
        batches = sorted({s["batch"] for s in speeds})
        print("| model | " + " | ".join(f"batch {b}" for b in batches) + " |")
        print("|---|" + "---|" * len(batches))
        for quant in dict.fromkeys(s["model"] for s in speeds):
            cells = [next(f"{s['ms_per_token']:.2f} ms" for s in speeds if s["model"] == quant and s["batch"] == b)
                     for b in batches]
            print(f"| {quant} | " + " | ".join(cells) + " |")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "model": args.model or "smollm2-135m",
        "num_prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "k": k,
        "threads": torch.get_num_threads(),
        "acceptance": rows,
        "speed": speeds,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
