"""The bench's markdown table and figure."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def _by_mode(report: dict[str, Any], temperature: float) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = defaultdict(list)
    for run in report["runs"]:
        if run["temperature"] == temperature:
            rows[run["mode"]].append(run)
    return rows


def markdown(report: dict[str, Any]) -> str:
    w = report["workload"]
    lines = [f"# specactor bench ({report['date']}, {report['machine']})", "",
             f"Command: `{report['command']}`. Workload: {w['prompts']} HumanEval prompts x {w['n']} samples, "
             f"capped at {w['max_tokens']} tokens (the model's EOS ends many earlier), {w['epochs']} epoch(s); epoch 2 "
             f"runs after one real GRPO step, with epoch 1's samples in the drafters' history. Makespan is the sum "
             f"over epochs; speedup is autoregressive's makespan over the mode's. Tail: time after 90% of the "
             f"samples finished. Peak: the process tree's resident memory during the run (added: above what it "
             f"held before the mode started). Differing: samples whose tokens differ from autoregressive "
             f"(transformers and vLLM sample differently, so only at T=0). Whole bench: {report['wall_s']} s.", ""]
    for temperature in report["workload"]["temperatures"]:
        rows = _by_mode(report, temperature)
        if not rows:
            continue
        base = sum(r["makespan_s"] for r in rows.get("autoregressive", [])) or None
        lines += [f"## Temperature {temperature:g}", "",
                  "| mode | makespan | speedup | epoch makespans | tokens/s | mean accepted length | tail | "
                  "peak (added) | differing |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for mode, runs in rows.items():
            makespan = sum(r["makespan_s"] for r in runs)
            tokens = sum(r["tokens"] for r in runs)
            epochs = " / ".join(f"{r['makespan_s']:.2f}" for r in runs)
            accepted = [f"{r['mean_accepted_length']:.2f}" for r in runs if r["mean_accepted_length"] is not None]
            differing = [r["differing"] for r in runs]
            speedup = f"{base / makespan:.2f}x" if base and makespan else "-"
            lines.append(
                f"| {mode} | {makespan:.2f} s | {speedup} | {epochs} s | {tokens / max(makespan, 1e-9):.1f} | "
                f"{' / '.join(accepted) or '-'} | {sum(r['tail_s'] for r in runs):.2f} s | "
                f"{max(r['peak_mb'] for r in runs):.0f} MB ({max(r['added_mb'] for r in runs):.0f}) | "
                f"{'-' if None in differing else sum(differing)} |")
        lines.append("")
    stats = report.get("update")
    if stats:
        lines.append(f"- policy update before epoch 2 (one GRPO step on epoch 1's prompts sampled at T=1): mean "
                     f"HumanEval test reward {stats['mean_test_reward']:.3f}, {int(stats['samples'])} samples with "
                     f"a non-zero advantage, grad norm {stats['grad_norm']:.3f}")
    for mode, why in report.get("skipped", {}).items():
        lines.append(f"- {mode}: skipped ({why})")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], out: str | Path) -> Path:
    """Makespan per mode and temperature; committed tokens over time per mode (first temperature)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = report["workload"]["temperatures"]
    modes = list(dict.fromkeys(r["mode"] for r in report["runs"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    width = 0.8 / max(len(temperatures), 1)
    for i, temperature in enumerate(temperatures):
        rows = _by_mode(report, temperature)
        values = [sum(r["makespan_s"] for r in rows.get(m, [])) for m in modes]
        left.bar([x + i * width for x in range(len(modes))], values, width, label=f"T={temperature:g}")
    left.set_xticks([x + width * (len(temperatures) - 1) / 2 for x in range(len(modes))], modes, rotation=25,
                    ha="right")
    left.set_ylabel("makespan, all epochs (s)")
    left.set_title("Makespan per mode (lower is better)")
    left.legend()
    first = _by_mode(report, temperatures[0])
    for mode in modes:
        offset, xs, ys, total = 0.0, [0.0], [0], 0
        for run in first.get(mode, []):
            for t, n in sorted(run["finishes"]):
                total += n
                xs.append(offset + t)
                ys.append(total)
            offset += run["makespan_s"]
        right.step(xs, [y / max(x, 1e-9) if x else 0 for x, y in zip(xs, ys)], where="post", label=mode)
    right.set_xlabel("time since the first epoch started (s; epochs back to back)")
    right.set_ylabel("output tokens/s so far (tokens of finished samples / time)")
    right.set_title(f"Throughput over time, T={temperatures[0]:g}")
    right.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
