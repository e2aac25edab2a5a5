"""Interleaved A/B of the policy's largest window on the long-tail workload.

    python bench/window_ab.py --temperature 0 --windows 8,16 --repeats 3

Runs autoregressive, then specactor at each window, then again, ``--repeats``
times (interleaved, so the machine's drift hits every configuration alike), on
the bench's default workload (8 HumanEval prompts x 4, EOS up to 768 tokens,
one epoch). Prints one JSON line per run (makespan, its two phases: before
and after half of the samples finished, and samples whose tokens differ from
the same repeat's autoregressive run) and the medians; writes them all to
``--out``. The window is EngineConfig.window: the most draft tokens a verify
step checks per request (the policy picks 0 to it per request).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

from specactor.bench.runners import run_mode
from specactor.bench.suite import MODES, BenchOptions, build_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--windows", default="8,16", help="comma-separated windows for the specactor runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "window_ab.json"))
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    work = build_workload(BenchOptions(temperatures=(args.temperature,), epochs=1, max_tokens=args.max_tokens))
    rows: list[dict] = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for repeat in range(args.repeats):
        reference: dict = {}
        for name, window in [("autoregressive", None)] + [("specactor", w) for w in windows]:
            engine = work.engine if window is None else replace(work.engine, window=window)
            record = run_mode(MODES[name], replace(work, engine=engine), args.temperature, None, None)[0]
            phase1, phase2 = record.phases
            reference = reference or record.outputs
            rows.append({"repeat": repeat, "mode": name, "window": window, "makespan_s": round(record.makespan_s, 3),
                         "phase1_s": round(phase1, 3), "phase2_s": round(phase2, 3),
                         "differing": sum(v != reference.get(k) for k, v in record.outputs.items())})
            print(json.dumps(rows[-1]), flush=True)
            Path(args.out).write_text(json.dumps({"temperature": args.temperature, "runs": rows}, indent=1))
    for window in [None] + windows:
        runs = [r for r in rows if r["window"] == window]
        label = "autoregressive" if window is None else f"specactor window {window}"
        paired = [base["makespan_s"] / r["makespan_s"] for r in runs
                  for base in rows if base["window"] is None and base["repeat"] == r["repeat"]]
        print(f"{label}: makespan median {statistics.median(r['makespan_s'] for r in runs):.2f} s, tail median "
              f"{statistics.median(r['phase2_s'] for r in runs):.2f} s, paired speedups "
              f"{', '.join(f'{x:.2f}' for x in paired)}")


if __name__ == "__main__":
    main()
