"""What the `model` drafter's proposals cost on this machine, per batch size: the table the policy
prices the copy by (``specactor.drafters.cost_profile``), for each copy and thread count asked.

    python bench/draft_cost.py [--quants llama-q8_0,int8w] [--threads 1,2] [--batches 1,2,4,8,16,32]
    python bench/draft_cost.py --device cuda --quants bf16,int8w,int4w --threads 1

For a llama.cpp copy it also times the proposals with every decode batched (``split_below = 0``),
to show what running small decodes a token at a time saves. Milliseconds of a proposal round
giving each row one token (k=4 proposals after a 128-token prompt a row, median of 3), and the
milliseconds a prompt token costs to feed. Writes ``--out`` (JSON) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch

from specactor.config import DRAFT_QUANTS
from specactor.drafters.cost_profile import PREFILL, measure_draft_cost
from specactor.drafters.model import default_model_drafter
from specactor.engine.model_registry import resolve_model


def _ints(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        parser.error(f"{flag} takes comma-separated integers (got {text!r})")
    if not values or min(values) < 1:
        parser.error(f"{flag} takes integers >= 1 (got {text!r})")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quants", default="llama-q8_0,int8w", help=f"copies, from {', '.join(DRAFT_QUANTS)}")
    parser.add_argument("--threads", default="1,2", help="thread counts to time each copy on")
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="where the torch copies run (cpu, cuda, cuda:N)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/drafters/draft_cost.json"))
    args = parser.parse_args()
    quants = [q for q in args.quants.split(",") if q]
    bad = [q for q in quants if q not in DRAFT_QUANTS]
    if bad:
        parser.error(f"--quants takes {', '.join(DRAFT_QUANTS)} (got {bad[0]!r})")
    threads, batches = _ints(args.threads, "--threads", parser), _ints(args.batches, "--batches", parser)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.device != "cpu" and any(q.startswith("llama-") for q in quants):
        parser.error("llama.cpp's copies run on the CPU: --device cpu for them")
    folder = resolve_model(None)
    rows = []
    for quant in quants:
        for n in threads:
            torch.set_num_threads(n)
            drafter = default_model_drafter(folder, quant=quant, max_slots=max(batches), max_len=1024, threads=n,
                                            device=args.device)
            variants = [("as built", None)]
            if hasattr(drafter, "split_below"):
                variants.append(("every decode batched", 0))
            for label, split in variants:
                if split is not None:
                    drafter.split_below = split
                table = measure_draft_cost(drafter, tuple(batches), repeats=args.repeats)
                rows.append({"quant": quant, "threads": n, "decodes": label,
                             "split_below": getattr(drafter, "split_below", None),
                             "ms_by_batch": {b: round(1000 * s, 2) for b, s in table.items() if b != PREFILL},
                             "prefill_ms_per_token": round(1000 * table[PREFILL], 3)})
                print(f"{quant} x{n} ({label}): " + ", ".join(f"b{b} {v} ms" for b, v in rows[-1]["ms_by_batch"].items())
                      + f"; feeding {rows[-1]['prefill_ms_per_token']} ms a token", flush=True)
    print("\n| copy | threads | decodes | " + " | ".join(f"batch {b}" for b in batches) + " | feeding a token |")
    print("|---|---|---|" + "---|" * len(batches) + "---|")
    for row in rows:
        cells = [f"{row['ms_by_batch'].get(b, '-')} ms" for b in batches]
        print(f"| {row['quant']} | {row['threads']} | {row['decodes']} | " + " | ".join(cells)
              + f" | {row['prefill_ms_per_token']} ms |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "repeats": args.repeats,
                                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "machine": f"{platform.machine()} {torch.get_num_threads()} threads max"},
                                   indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
