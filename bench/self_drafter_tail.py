"""The rollout's tail alone, drafted by the target's own quantised copy: batch <= 2 at T=1.

    python bench/self_drafter_tail.py [--prompts 2] [--max-tokens 256] [--repeats 2]

Runs the same requests (HumanEval prompts, n=1, T=1, seeded) through several engine setups,
interleaved (every second repeat in reverse order), and reports each setup's wall time of
``generate`` (the model loaded and the cost profile measured beforehand) against
autoregressive, the tokens accepted per drafted token, and whether every sample is the
autoregressive one:

- ``autoregressive``: no drafts, the verifier on every core;
- ``coupled, <quant>, 2+2``: the verifier waits for each draft; verifier and drafter each
  given every core, taking turns (they never compute at once);
- ``specactor, <quant>, 1+1``: decoupled, the verifier and the drafter on a core each,
  steered by the policy.

``--quants`` picks the model drafter's copies (default: llama-q8_0 and torch's int8w).

Beside them, the ceilings on this machine's cost profile (the verifier's, on every core) and the
run's own sample lengths, the oracle choosing every window (``specactor.bench.ceilings``): a
perfect drafter that costs nothing; the first copy at the acceptance it showed here, costing
nothing; and that copy at its measured cost a proposal per batch size
(:mod:`specactor.drafters.cost_profile`), added to the verify step, as coupled on shared cores.
Writes ``--out`` (JSON) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from specactor.config import DRAFT_QUANTS, EngineConfig
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.rollout_engine import RolloutEngine
from specactor.tokenizer import Tokenizer


def setups(quants: list[str], cores: int) -> dict[str, dict]:
    out = {"autoregressive": dict(mode="autoregressive", verifier_threads=cores)}
    for quant in quants:
        out[f"coupled, {quant}, {cores}+{cores}"] = dict(mode="coupled", drafters=["model"], draft_quant=quant,
                                                         verifier_threads=cores, drafter_threads=cores)
        half = max(1, cores // 2)
        out[f"specactor, {quant}, {half}+{half}"] = dict(mode="specactor", drafters=["model"], draft_quant=quant,
                                                         verifier_threads=half, drafter_threads=half)
    return out


async def run_once(fields: dict, prompts: list[list[int]], params: SamplingParams, max_len: int) -> dict:
    config = EngineConfig(max_batch=len(prompts), max_len=max_len, **fields)
    async with RolloutEngine(config) as engine:
        t0 = time.perf_counter()
        results = await engine.generate(prompts, params, request_ids=[f"p{i}" for i in range(len(prompts))])
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": {r.request_id: r.token_ids for r in results},
            "drafted": sum(r.stats.drafted for r in results), "accepted": sum(r.stats.accepted for r in results)}


def ceilings(folder, quant: str, lengths: list[int], acceptance: float, cores: int) -> dict[str, float]:
    """The oracle's speedups over autoregressive on this machine's profile (see the docstring)."""
    from specactor.bench.ceilings import uniform_drafter
    from specactor.drafters.cost_profile import PREFILL, ensure_draft_profile
    from specactor.drafters.model import default_model_drafter
    from specactor.engine.profiling import resolve_profile
    from specactor.policy.cost_model import CostModel, DraftCost

    cost = CostModel.from_profile(resolve_profile("auto", folder, dtype="float32", device="cpu", threads=cores))
    drafter = default_model_drafter(folder, quant=quant, max_slots=max(2, len(lengths)), max_len=1024,
                                    threads=cores)
    table = {b: s for b, s in ensure_draft_profile(drafter, str(folder), cores).items() if b != PREFILL}
    priced = DraftCost()
    priced.adopt_table(table)
    out = {}
    for name, p, draft in (("perfect drafter, free", 1.0, None), (f"{quant} at its acceptance, free", acceptance, None),
                           (f"{quant} at its acceptance and measured cost", acceptance, priced)):
        speedup, tail = uniform_drafter(lengths, cost, p, draft)
        out[name] = round(speedup, 3)
    out["profile"] = cost.source
    out["draft_ms_by_batch"] = {b: round(1000 * s, 2) for b, s in table.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2, help="HumanEval prompts (the batch: n=1 each)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quants", default="llama-q8_0,int8w", help=f"model drafter copies, from {DRAFT_QUANTS}")
    ap.add_argument("--out", type=Path, default=Path("bench/results/drafters/self_drafter_tail.json"))
    args = ap.parse_args()
    quants = [q for q in args.quants.split(",") if q]
    bad = [q for q in quants if q not in DRAFT_QUANTS]
    if bad or args.prompts < 1 or args.max_tokens < 1 or args.repeats < 1:
        ap.error(f"--quants takes {', '.join(DRAFT_QUANTS)} (got {bad[0]!r})" if bad
                 else "--prompts, --max-tokens and --repeats must be >= 1")
    folder = resolve_model(None)
    tok = Tokenizer(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}])
               for p in humaneval_prompts(args.prompts)]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=0)
    max_len = max(map(len, prompts)) + args.max_tokens + 8
    cores = os.cpu_count() or 2
    plan = setups(quants, cores)
    runs: dict[str, list[dict]] = {name: [] for name in plan}
    for r in range(args.repeats):
        for name in (list(plan) if r % 2 == 0 else list(reversed(plan))):
            run = asyncio.run(run_once(plan[name], prompts, params, max_len))
            runs[name].append(run)
            print(f"[{r}] {name}: {run['seconds']:.2f} s, accepted {run['accepted']}/{run['drafted']}", flush=True)
    reference = runs["autoregressive"][0]["tokens"]
    base = statistics.median(run["seconds"] for run in runs["autoregressive"])
    rows = []
    for name, done in runs.items():
        seconds = statistics.median(run["seconds"] for run in done)
        drafted, accepted = sum(run["drafted"] for run in done), sum(run["accepted"] for run in done)
        differing = sum(run["tokens"][rid] != reference[rid] for run in done for rid in reference)
        rows.append({"setup": name, "seconds": [round(run["seconds"], 3) for run in done],
                     "median_s": round(seconds, 3), "speedup": round(base / seconds, 3),
                     "accepted_per_drafted": round(accepted / drafted, 3) if drafted else None,
                     "differing": differing, "samples": len(reference) * len(done)})
    print(f"\n{args.prompts} prompts x 1 sample, T={args.temperature:g}, up to {args.max_tokens} tokens, "
          f"{cores} cores, median of {args.repeats}\n")
    print("| setup | wall s (median) | vs autoregressive | accepted / drafted | differing |")
    print("|---|---|---|---|---|")
    for row in rows:
        acc = "-" if row["accepted_per_drafted"] is None else f"{row['accepted_per_drafted']:.2f}"
        print(f"| {row['setup']} | {row['median_s']:.2f} | {row['speedup']:.2f}x | {acc} | "
              f"{row['differing']} of {row['samples']} |")
    first = next((row for row in rows if row["accepted_per_drafted"] is not None), None)
    bounds = {}
    if first is not None:
        quant = first["setup"].split(", ")[1]
        lengths = [len(tokens) for tokens in reference.values()]
        bounds = ceilings(folder, quant, lengths, first["accepted_per_drafted"], cores)
        print("\nceilings (oracle windows, this machine's profile, these lengths): "
              + "; ".join(f"{k} {v:.2f}x" for k, v in bounds.items() if isinstance(v, float)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "ceilings": bounds,
        "prompts": args.prompts, "max_tokens": args.max_tokens, "temperature": args.temperature,
        "repeats": args.repeats, "cores": cores, "rows": rows,
        "output_tokens": sum(map(len, reference.values())),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {cores} cores",
    }, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
