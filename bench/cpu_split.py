"""Where a speculative mode's time goes when it drafts nothing: autoregressive and specactor on the
bench's long-tail workload, one after the other, with the CPU time of the calling process (which
hosts the coordinator, the policy and the cheap drafters) and the verifier's median forward time
per batch size from the events.

    python bench/cpu_split.py [--max-tokens 768] [--temperature 1] [--out bench/results/cpu_split]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import time
from pathlib import Path

from specactor.bench.runners import Mode, run_engine
from specactor.bench.suite import BenchOptions, build_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", default="bench/results/cpu_split")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = build_workload(BenchOptions(max_tokens=args.max_tokens, epochs=1))
    report = {}
    for name in ("autoregressive", "specactor"):
        events = out / f"events-{name}.jsonl"
        events.unlink(missing_ok=True)
        mode = Mode(name, "engine", engine_mode=name, drafters=["ngram", "suffix"])
        cpu0 = time.process_time()
        record = asyncio.run(run_engine(mode, work, args.temperature, None, events=str(events)))[0]
        cpu = time.process_time() - cpu0
        by_batch: dict[int, list[float]] = collections.defaultdict(list)
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "verify.step":
                by_batch[event["batch_size"]].append(event["forward_ms"])
        report[name] = {"makespan_s": round(record.makespan_s, 2), "caller_cpu_s": round(cpu, 2),
                        "drafted": record.drafted, "tokens": record.tokens,
                        "forward_ms_by_batch": {b: round(statistics.median(v), 1)
                                                for b, v in sorted(by_batch.items()) if len(v) >= 5}}
        print(name, json.dumps(report[name]), flush=True)
    report["speedup"] = round(report["autoregressive"]["makespan_s"] / report["specactor"]["makespan_s"], 3)
    (out / "cpu_split.json").write_text(json.dumps(report, indent=1))
    print(f"speedup {report['speedup']}x; wrote {out / 'cpu_split.json'}")


if __name__ == "__main__":
    main()
