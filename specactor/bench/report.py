"""The bench's markdown tables (speed beside its ceilings, per epoch and phase; run details) and figure."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from specactor.bench.ceilings import MAX_WINDOW


def _by_mode(report: dict[str, Any], temperature: float) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = defaultdict(list)
    for run in report["runs"]:
        if run["temperature"] == temperature:
            rows[run["mode"]].append(run)
    return rows


BOUNDS = (("oracle", "oracle"), ("zero_cost", "zero-cost drafter"), ("perfect", "perfect drafter"))
OWN_PLAN = {"oracle": "oracle", "zero_cost": "zero-cost", "perfect": "perfect"}  # ceilings.py's labels


def _ceilings(report: dict[str, Any], temperature: float) -> dict[int, dict]:
    return {c["epoch"]: c for c in report.get("ceilings", []) if c["temperature"] == temperature}


def _x(base: float | None, value: float | None) -> str:
    return f"{base / value:.2f}x" if base and value else "-"


def _cell(seconds: float | None, base: float | None) -> str:
    """``seconds (speedup)``; the speedup is the baseline's seconds over these."""
    return "-" if seconds is None else f"{seconds:.2f} s ({_x(base, seconds)})"


def _totals(runs: list[dict]) -> dict[str, float]:
    return {k: sum(r[k] for r in runs) for k in ("makespan_s", "phase1_s", "phase2_s")}


def _bound_totals(ceilings: list[dict], key: str) -> dict[str, float]:
    return {k: sum(c[key][k] for c in ceilings) for k in ("makespan_s", "phase1_s", "phase2_s")}


def _speed_row(mode: str, epoch: str, own: dict[str, float], base: dict[str, float] | None,
               bounds: list[dict[str, float]] | None, ar_sim: dict[str, float] | None, note: str) -> str:
    """One row of the speed table: the mode's makespan and phases with their speedups, each
    followed by the ceilings' (whose speedups are against simulated autoregressive)."""
    cells = [mode, epoch]
    for key in ("makespan_s", "phase1_s", "phase2_s"):
        cells.append(_cell(own[key], None if base is None else base[key]))
        for bound in bounds or [None, None, None]:
            cells.append("-" if bound is None or ar_sim is None else _cell(bound[key], ar_sim[key]))
    cells.append(note)
    return "| " + " | ".join(cells) + " |"


def _speed_table(rows: dict[str, list[dict]], ceilings: dict[int, dict]) -> list[str]:
    header = ["mode", "epoch", "makespan (x)"] + [b for _, b in BOUNDS] + ["phase 1: batch (x)"] + \
        [b for _, b in BOUNDS] + ["phase 2: tail (x)"] + [b for _, b in BOUNDS] + ["note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    base_runs = {r["epoch"]: r for r in rows.get("autoregressive", [])}
    for mode, runs in rows.items():
        note = runs[0].get("note", "")
        comparable = not note
        for run in runs:
            c = ceilings.get(run["epoch"]) if comparable else None
            base = base_runs.get(run["epoch"]) if comparable else None
            lines.append(_speed_row(mode, str(run["epoch"] + 1), _totals([run]), base and _totals([base]),
                                    c and [c[k] for k, _ in BOUNDS], c and c["autoregressive"], note))
        if len(runs) > 1:
            epochs = [r["epoch"] for r in runs]
            base = [base_runs[e] for e in epochs if e in base_runs] if comparable else []
            cs = [ceilings[e] for e in epochs if e in ceilings] if comparable else []
            complete = len(base) == len(runs) and len(cs) == len(runs)
            lines.append(_speed_row(mode, "all", _totals(runs), _totals(base) if len(base) == len(runs) else None,
                                    [_bound_totals(cs, k) for k, _ in BOUNDS] if complete else None,
                                    _bound_totals(cs, "autoregressive") if complete else None, note))
    return lines


def _detail_table(rows: dict[str, list[dict]]) -> list[str]:
    lines = ["| mode | epoch | samples | capped | tokens | tokens/s | mean accepted length | peak (added) | "
             "CPU s: caller / children | differing |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, runs in rows.items():
        for r in runs:
            accepted = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
            lines.append(f"| {mode} | {r['epoch'] + 1} | {r.get('samples', '-')} | {r.get('capped', '-')} | "
                         f"{r['tokens']} | {r['tokens_per_s']:.1f} | {accepted} | {r['peak_mb']:.0f} MB "
                         f"({r['added_mb']:.0f}) | {_cpu(r)} | {'-' if r['differing'] is None else r['differing']} |")
    return lines


def _cpu(run: dict) -> str:
    """CPU seconds of the calling process and of its children over the run (older results lack them)."""
    if "caller_cpu_s" not in run:
        return "-"
    return f"{run['caller_cpu_s']:.1f} / {run['children_cpu_s']:.1f}"


def _repeat_notes(rows: dict[str, list[dict]]) -> list[str]:
    """Each repeat's makespan and its paired speedup (against autoregressive in the same repeat)."""
    lines = []
    for mode, runs in rows.items():
        for run in runs:
            pairs = run.get("repeats_s") or []
            if len(pairs) < 2 or mode == "autoregressive":
                continue
            ratios = sorted(base / own for own, base in pairs)
            lines.append(f"- {mode}, epoch {run['epoch'] + 1}, {len(pairs)} interleaved repeats: makespans "
                         + ", ".join(f"{own:.1f} s" for own, _ in pairs) + "; paired speedups "
                         + ", ".join(f"{base / own:.2f}x" for own, base in pairs)
                         + f" (median {ratios[(len(ratios) - 1) // 2]:.2f}x, worst {ratios[0]:.2f}x)")
    return lines


def _ceiling_notes(ceilings: dict[int, dict]) -> list[str]:
    lines = []
    for epoch, c in sorted(ceilings.items()):
        methods = ", ".join(f"{m} p={v['mean_p']:.2f} on {v['mean_rate']:.0%} of steps ({v['requests']} samples)"
                            for m, v in c.get("methods", {}).items()) or "none (no mode drafted on these samples)"
        inherited = "".join(f"; {label}: its own plan was no faster than the {c[k]['plan']} plan's, kept"
                            for k, label in BOUNDS if c[k]["plan"] != OWN_PLAN[k])
        lines.append(f"- epoch {epoch + 1}: the tail (phase 2) is {c['tail_share']:.0%} of autoregressive's "
                     f"makespan; {c['capped']} of {c['samples']} samples hit the {c['max_tokens']}-token cap; "
                     f"calibration scale {c['scale']:.3f} (measured {c['measured_autoregressive']['makespan_s']:.2f} s "
                     f"/ simulated {c['simulated_autoregressive_s']:.2f} s autoregressive); acceptance (mean over "
                     f"samples): {methods}{inherited}.")
        if c.get("replayed"):
            r = c["replayed"]
            lines.append(f"- epoch {epoch + 1}, replayed on autoregressive's tokens with {', '.join(r['methods'])} "
                         f"(every draft's verdict is the engine's; step times from the profile, calibrated): the "
                         f"policy {r['policy']['makespan_s']:.2f} s ({r['policy']['speedup']:.2f}x; tail "
                         f"{r['policy']['phase2_s']:.2f} s), what it would make of these samples on an ideal "
                         f"engine; clairvoyant drafts (every token these drafters get right, no wrong one) "
                         f"{r['clairvoyant']['makespan_s']:.2f} s ({r['clairvoyant']['speedup']:.2f}x; tail "
                         f"{r['clairvoyant']['phase2_s']:.2f} s), the ceiling of a policy over them.")
    return lines


def _repeats_line(repeats: int) -> str:
    if repeats < 2:
        return "One run per mode: on a machine whose speed drifts, ratios below ~10% are noise. "
    return (f"Every mode ran {repeats} times, interleaved; the tables show, per mode and epoch, the run with "
            f"the median makespan, and the notes each repeat's speedup against autoregressive in the same repeat. ")


def _epochs_line(w: dict[str, Any]) -> str:
    temperatures, epochs = w.get("temperatures") or [], w["epochs"]
    other = w.get("other_epochs", epochs)
    if len(temperatures) < 2 or other == epochs:
        return f"{epochs} epoch(s)"
    return f"{epochs} epoch(s) at T={temperatures[0]:g}, {other} at T={', '.join(f'{t:g}' for t in temperatures[1:])}"


def markdown(report: dict[str, Any]) -> str:
    w = report["workload"]
    window = report.get("engine", {}).get("window", MAX_WINDOW)  # reports from before the window was recorded
    lines = [f"# specactor bench ({report['date']}, {report['machine']})", "",
             f"Command: `{report['command']}`. Workload: {w['prompts']} HumanEval prompts x {w['n']} samples, "
             f"each as long as the model's EOS makes it up to {w['max_tokens']} tokens, {_epochs_line(w)}; "
             f"epoch 2 runs after one real GRPO step, with epoch 1's samples in the drafters' history. "
             f"{_repeats_line(w.get('repeats', 1))}"
             f"Whole bench: {report['wall_s']} s.", "",
             *([f"**Partial report**, {report['partial']}.", ""] if report.get("partial") else []),
             "Speed: per epoch and over all epochs (all), the makespan and its two phases: phase 1 lasts until "
             "half of the samples have finished (large batch), phase 2 is the rest (the tail); each run "
             "has its own halfway point, so a faster phase 1 can leave more of the work to phase 2. (x) is "
             "autoregressive's time over the mode's, for the same epoch and phase. Beside each figure, its "
             f"ceilings from the same run, simulated on the policy's cost model (profile: "
             f"{report.get('ceilings_profile', 'packaged')}) and calibrated so that simulated "
             "autoregressive takes the measured time (their (x) is against simulated autoregressive): "
             f"*oracle*, per sample and batch size the best drafting method and window 0-{window} (0: none) at the "
             "acceptance that sample showed (pooled over every mode that drafted on it), paying the cost model's "
             "drafting time; *zero-cost drafter*, the same with free drafting; *perfect drafter*, free drafting "
             "with every token accepted. Each bound is at least the one before it (a stronger drafter can imitate "
             "a weaker one), and the oracle at least autoregressive. Details: samples that hit the length cap, "
             "tokens/s, mean accepted draft length, peak resident memory of the process tree (added: above what it "
             "held before the mode started), and samples whose tokens differ from autoregressive "
             "(transformers and vLLM sample differently, so only at T=0).", ""]
    for temperature in report["workload"]["temperatures"]:
        rows = _by_mode(report, temperature)
        if not rows:
            continue
        ceilings = _ceilings(report, temperature)
        lines += [f"## Temperature {temperature:g}", "", *_speed_table(rows, ceilings), "",
                  *_repeat_notes(rows), *_ceiling_notes(ceilings), "", *_detail_table(rows), ""]
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
    bars = modes + [label for _, label in BOUNDS if report.get("ceilings")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    width = 0.8 / max(len(temperatures), 1)
    for i, temperature in enumerate(temperatures):
        rows = _by_mode(report, temperature)
        ceilings = _ceilings(report, temperature).values()
        values = [sum(r["makespan_s"] for r in rows.get(m, [])) for m in modes] + \
            [sum(c[k]["makespan_s"] for c in ceilings) for k, _ in BOUNDS if report.get("ceilings")]
        left.bar([x + i * width for x in range(len(bars))], values, width, label=f"T={temperature:g}")
    labels = [m + (" *" if any(r.get("note") for r in report["runs"] if r["mode"] == m) else "") for m in bars]
    left.set_xticks([x + width * (len(temperatures) - 1) / 2 for x in range(len(bars))], labels, rotation=25,
                    ha="right")
    left.set_ylabel("makespan, all epochs (s)")
    left.set_title("Makespan per mode and its ceilings (lower is better; * a subset of the prompts)")
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
