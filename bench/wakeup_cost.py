"""What a neighbour process waking once per step costs the verifier's forward on a small CPU.

    python bench/wakeup_cost.py [--batch 9] [--context 512] [--steps 40] [--blocks 8]
                                [--work-us 0,400,2000] [--out bench/results/wakeup_cost.json]

In specactor mode the cheap drafters and the policy live in the caller's process and get a
message after every verify step of a request they track; in autoregressive mode the caller
wakes only for progress reports. On 2 cores the verifier's torch forward runs 2 OpenMP
threads, so any other runnable thread takes a core from one of them and the other waits at
the next barrier. This measures that directly: decode forwards of the default model at a
fixed batch and context, in alternating blocks, with a neighbour process that after every
forward receives one message and computes ``work_us`` of Python (0: it only wakes), against
blocks with the neighbour asleep. Medians per condition; ratios within the same run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

from specactor.cli.engine_flags import positive_int


def _neighbour(conn, work_us: float) -> None:
    """Wake on every message, compute ``work_us`` of Python, sleep again; None ends it."""
    while True:
        msg = conn.recv()
        if msg is None:
            return
        until = time.perf_counter() + work_us / 1e6
        while time.perf_counter() < until:
            pass


def _microseconds(text: str) -> list[float]:
    """``--work-us``: comma-separated non-negative numbers."""
    try:
        values = [float(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of microseconds: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"microseconds must be >= 0: {text!r}")
    return values


def main() -> None:
    from specactor.cli.main import HelpFormatter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--batch", type=positive_int, default=9, help="rows per forward (the T=1 tail runs at 9-14)")
    parser.add_argument("--context", type=positive_int, default=512, help="cached tokens per row")
    parser.add_argument("--steps", type=positive_int, default=40, help="forwards per block")
    parser.add_argument("--blocks", type=positive_int, default=8, help="blocks per condition, alternating")
    parser.add_argument("--work-us", type=_microseconds, default="0,400,2000",
                        help="comma-separated CPU microseconds the neighbour spends per wake-up")
    parser.add_argument("--out", default="bench/results/wakeup_cost.json")
    args = parser.parse_args()

    import torch

    from specactor.engine.model_registry import resolve_model
    from specactor.engine.kv_cache import KVCache
    from specactor.engine.weights import load_causal_lm

    model = load_causal_lm(resolve_model(None))
    model.pack()
    cache = KVCache(model.cfg, args.batch, args.context + 2)
    for t in (cache.k, cache.v):
        t[:, :, :, :args.context].normal_()
    q_lens = [1] * args.batch

    def forward() -> float:
        tokens = torch.randint(0, model.cfg.vocab_size, (args.batch,))
        cache.lengths[:args.batch] = [args.context] * args.batch
        t0 = time.perf_counter()
        model(tokens, q_lens, cache)
        return time.perf_counter() - t0

    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "threads": torch.get_num_threads(),
                    "batch": args.batch, "context": args.context, "steps": args.steps, "blocks": args.blocks,
                    "command": "python bench/wakeup_cost.py " + " ".join(sys.argv[1:]),
                    "conditions": []}
    with torch.inference_mode():
        for _ in range(5):
            forward()  # warm-up
        for work_us in args.work_us:
            parent, child = mp.get_context("spawn").Pipe()
            proc = mp.get_context("spawn").Process(target=_neighbour, args=(child, work_us), daemon=True)
            proc.start()
            quiet: list[float] = []
            woken: list[float] = []
            for block in range(2 * args.blocks):
                wake = block % 2 == 1
                for _ in range(args.steps):
                    if wake:
                        parent.send(b"verdict")  # it wakes during the next forward, as a drafter does
                    (woken if wake else quiet).append(forward())
            parent.send(None)
            proc.join()
            row = {"work_us": work_us, "quiet_ms": round(statistics.median(quiet) * 1000, 3),
                   "woken_ms": round(statistics.median(woken) * 1000, 3)}
            row["ratio"] = round(row["woken_ms"] / row["quiet_ms"], 4)
            row["added_ms"] = round(row["woken_ms"] - row["quiet_ms"], 3)
            report["conditions"].append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
