"""Where a speculative mode's time goes when it drafts (almost) nothing: autoregressive and
specactor on the bench's long-tail workload, interleaved, with the CPU seconds of the calling
process (coordinator, policy, cheap drafters) and of its children (the verifier), and the
verifier's median forward time per batch size from each run's events.

    python bench/cpu_split.py [--backend torch|vllm] [--repeats 2] [--prompts 8] [--n 4]
                              [--max-tokens 768] [--temperature 1] [--out bench/results/cpu_split]

If the speculative mode is slower and its forwards are slower at the same batch size while
the caller's CPU is small, the machinery is not what costs (the machine drifted, or the
forwards themselves changed); if the caller's CPU is large, it took the verifier's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
from dataclasses import replace
from pathlib import Path

from specactor.bench.runners import Mode, run_engine
from specactor.bench.suite import BenchOptions, build_workload, repeat_order
from specactor.config import EngineConfig

MODES = ("autoregressive", "specactor")


def _forward_ms_by_batch(events: Path) -> dict[int, list[float]]:
    """Every verify step's forward by the batch it ran (0: the first step, whose batch is
    counted before its prompts join; on vLLM it prefills most of them, seconds long)."""
    by_batch: dict[int, list[float]] = collections.defaultdict(list)
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "verify.step":
            by_batch[event["batch_size"]].append(event["forward_ms"])
    return by_batch


def _run(name: str, work, temperature: float, events: Path) -> dict:
    events.unlink(missing_ok=True)
    mode = Mode(name, "engine", engine_mode=name, drafters=["ngram", "suffix"])
    record = asyncio.run(run_engine(mode, work, temperature, None, events=str(events)))[0]
    return {"makespan_s": round(record.makespan_s, 2), "caller_cpu_s": round(record.caller_cpu_s, 2),
            "children_cpu_s": round(record.children_cpu_s, 2), "drafted": record.drafted, "tokens": record.tokens}


def _add_forwards(run: dict, events: Path) -> None:
    """The verifier's forwards from a run's events, read once every run is over (the verifier's
    process may still be writing its last lines when the engine's context exits)."""
    by_batch = _forward_ms_by_batch(events)
    run["steps"] = sum(map(len, by_batch.values()))
    run["forward_s"] = round(sum(sum(v) for v in by_batch.values()) / 1000, 2)
    run["forward_ms_by_batch"] = {b: round(statistics.median(v), 1) for b, v in sorted(by_batch.items()) if len(v) >= 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("torch", "vllm"), default="torch")
    parser.add_argument("--repeats", type=int, default=2,
                        help="pairs, interleaved (this machine drifts); every second pair runs specactor first")
    parser.add_argument("--prompts", type=int, default=8, help="HumanEval prompts (batch = prompts x n)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", default="bench/results/cpu_split")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    opts = BenchOptions(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, epochs=1,
                        engine=replace(EngineConfig(), backend=args.backend))
    work = build_workload(opts)
    repeats = []
    for repeat in range(args.repeats):
        order = repeat_order(MODES, repeat)  # ABBA: the modes take turns going first
        runs = {name: _run(name, work, args.temperature, out / f"events-{name}-{args.backend}-{repeat + 1}.jsonl")
                for name in order}
        runs["first"] = order[0]
        runs["speedup"] = round(runs["autoregressive"]["makespan_s"] / runs["specactor"]["makespan_s"], 3)
        repeats.append(runs)
        print(f"repeat {repeat + 1}: " + json.dumps(runs), flush=True)
        (out / f"cpu_split_{args.backend}.json").write_text(json.dumps({"repeats": repeats}, indent=1))  # so far
    for repeat, runs in enumerate(repeats):
        for name in MODES:
            _add_forwards(runs[name], out / f"events-{name}-{args.backend}-{repeat + 1}.jsonl")
        # forwards at the same batch size, specactor's over autoregressive's: the verifier's own speed
        ar, spec = runs["autoregressive"]["forward_ms_by_batch"], runs["specactor"]["forward_ms_by_batch"]
        ratios = [spec[b] / ar[b] for b in ar if b in spec and b]
        runs["forward_ratio_median"] = round(statistics.median(ratios), 3) if ratios else None
        # what the makespan holds beside the forwards: the step loop, start-up, the last result's way back
        for name in MODES:
            runs[name]["outside_forwards_s"] = round(runs[name]["makespan_s"] - runs[name]["forward_s"], 2)
    report = {"backend": args.backend, "temperature": args.temperature, "prompts": args.prompts, "n": args.n,
              "max_tokens": args.max_tokens, "repeats": repeats,
              "speedup_median": statistics.median(r["speedup"] for r in repeats),
              "forward_ratio_median": statistics.median(r["forward_ratio_median"] or 1.0 for r in repeats)}
    (out / f"cpu_split_{args.backend}.json").write_text(json.dumps(report, indent=1))
    print(f"speedups {[r['speedup'] for r in repeats]}; forward ratios "
          f"{[r['forward_ratio_median'] for r in repeats]}; wrote {out / f'cpu_split_{args.backend}.json'}")


if __name__ == "__main__":
    main()
