"""The bench's markdown on a synthetic report (no model): every speed figure beside its ceilings,
per epoch and phase, the tail's share, the capped samples, and the subset note."""

from __future__ import annotations

import pytest

from specactor.bench.ceilings import from_samples
from specactor.bench.measure import RunRecord
from specactor.bench.report import markdown
from specactor.bench.suite import MODES, BenchOptions, temperature_ceilings
from specactor.policy.cost_model import CostModel, DraftCost


def _cost() -> CostModel:
    chunks = [1, 2, 4, 8, 16]
    return CostModel([1, 8, 64], chunks, [[0.02 + 0.0004 * b * c for c in chunks] for b in (1, 8, 64)],
                     draft={"ngram": DraftCost(2e-5, 5e-4)})


def _record(mode: str, epoch: int, finishes: list[float], lengths: list[int], per_method: dict | None = None,
            capped: int = 0, note: str = "") -> RunRecord:
    record = RunRecord(mode, 1.0, epoch, makespan_s=max(finishes), tokens=sum(lengths), note=note,
                       finishes=list(zip(finishes, lengths)), differing=0)
    for i, n in enumerate(lengths):
        record.outputs[f"s{i}"] = [1] * n
        record.samples[f"s{i}"] = {"tokens": n, "finish_reason": "length" if i < capped else "stop",
                                   "verify_steps": n, "per_method": per_method or {}}
    return record


def _report() -> dict:
    lengths = [20, 40, 60, 200]
    drafts = {"ngram": {"drafted": 100, "accepted": 60, "steps": 25}}
    by_mode = {"autoregressive": [_record("autoregressive", e, [1.0, 2.0, 3.0, 10.0], lengths, capped=1)
                                  for e in (0, 1)],
               "specactor": [_record("specactor", e, [0.5, 1.0, 2.0, 6.0], lengths, drafts) for e in (0, 1)],
               "transformers+pld": [_record("transformers+pld", e, [4.0, 8.0], [20, 40], note="first 1 of 2 prompts")
                                    for e in (0, 1)]}
    runs = [r.summary() for records in by_mode.values() for r in records]
    return {"date": "d", "machine": "m", "command": "c", "wall_s": 1.0, "runs": runs,
            "ceilings": temperature_ceilings(by_mode, _cost(), 200), "update": None, "skipped": {},
            "workload": {"prompts": 2, "n": 2, "max_tokens": 200, "epochs": 2, "temperatures": [1.0]}}


def test_the_default_is_the_long_tail_workload() -> None:
    opts = BenchOptions()
    assert (opts.prompts, opts.n, opts.max_tokens, opts.temperatures, opts.epochs, opts.other_epochs, opts.modes) == (
        8, 4, 768, (1.0, 0.0), 2, 1, ("autoregressive", "specactor"))
    assert BenchOptions.quick().max_tokens <= 64 and BenchOptions.quick().prompts <= 2
    assert MODES["transformers+pld"].max_prompts == 2  # it cannot batch


def test_ceilings_per_epoch_come_from_the_run_and_are_stored() -> None:
    report = _report()
    assert [c["epoch"] for c in report["ceilings"]] == [0, 1]
    c = report["ceilings"][0]
    assert c["capped"] == 1 and c["samples"] == 4 and c["max_tokens"] == 200
    assert c["tail_share"] == (10.0 - 2.0) / 10.0  # after the 2nd of 4 samples finished
    assert c["acceptance_from"] == ["specactor"]  # the subset run is left out
    assert c["autoregressive"]["makespan_s"] == 10.0
    assert c["perfect"]["speedup"] >= c["zero_cost"]["speedup"] >= c["oracle"]["speedup"] >= 1.0


def test_markdown_puts_the_ceilings_beside_every_speedup() -> None:
    report = _report()
    table = markdown(report)
    header = next(line for line in table.splitlines() if line.startswith("| mode | epoch | makespan"))
    assert header.count("oracle") == 3 and header.count("perfect drafter") == 3  # makespan, phase 1, phase 2
    row = next(line for line in table.splitlines() if line.startswith("| specactor | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "6.00 s (1.67x)"  # makespan (speedup)
    c = report["ceilings"][0]
    assert cells[3] == f"{c['oracle']['makespan_s']:.2f} s ({10.0 / c['oracle']['makespan_s']:.2f}x)"
    assert cells[6] == "1.00 s (2.00x)" and cells[10] == "5.00 s (1.60x)"  # phase 1 and phase 2, measured
    assert any(line.startswith("| specactor | all | 12.00 s (1.67x)") for line in table.splitlines())
    pld = next(line for line in table.splitlines() if line.startswith("| transformers+pld | 1 |"))
    assert "first 1 of 2 prompts" in pld and "8.00 s (-)" in pld  # no speedup against another workload
    assert "the tail (phase 2) is 80% of autoregressive's makespan; 1 of 4 samples hit the 200-token cap" in table
    assert "calibration scale" in table


def test_from_samples_and_the_suite_agree() -> None:
    report = _report()
    by_run = {r["mode"]: r["per_sample"] for r in report["runs"] if r["epoch"] == 0 and not r["note"]}
    again = from_samples(by_run, _cost(), 10.0)
    assert again["oracle"] == report["ceilings"][0]["oracle"]


def test_repeats_report_the_median_run_and_every_paired_speedup() -> None:
    from specactor.bench.suite import median_runs, record_repeats

    lengths = [20, 40, 60, 200]
    makespans = [(10.0, 9.0), (12.0, 13.0), (11.0, 10.0)]  # (autoregressive, specactor) per repeat
    repeats = [{"autoregressive": [_record("autoregressive", 0, [1.0, 2.0, 3.0, ar], lengths)],
                "specactor": [_record("specactor", 0, [1.0, 2.0, 3.0, spec], lengths)]} for ar, spec in makespans]
    repeats[2]["specactor"][0].differing = 1  # one repeat differed: the median row must say so
    chosen = median_runs(repeats)
    assert chosen["autoregressive"][0].makespan_s == 11.0 and chosen["specactor"][0].makespan_s == 10.0
    assert chosen["specactor"][0].differing == 1
    pairs = record_repeats(repeats, chosen["specactor"][0])
    assert pairs == [[9.0, 10.0], [13.0, 12.0], [10.0, 11.0]]
    report = _report()
    report["workload"]["repeats"] = 3
    report["runs"] = [chosen[mode][0].summary() | {"repeats_s": record_repeats(repeats, chosen[mode][0])}
                      for mode in ("autoregressive", "specactor")]
    table = markdown(report)
    assert "3 interleaved repeats: makespans 9.0 s, 13.0 s, 10.0 s" in table
    assert "paired speedups 1.11x, 0.92x, 1.10x (median 1.10x, worst 0.92x)" in table
    assert "ran 3 times, interleaved" in table


def test_the_report_replays_the_policy_and_clairvoyant_drafts_on_the_run_s_tokens() -> None:
    """Given each sample's prompt, every epoch's ceilings also hold the policy and clairvoyant drafts
    replayed on autoregressive's tokens, and the markdown says what they are."""
    report = _report()
    lengths = [20, 40, 60, 200]
    by_mode = {"autoregressive": [_record("autoregressive", e, [1.0, 2.0, 3.0, 10.0], lengths) for e in (0, 1)],
               "specactor": [_record("specactor", e, [0.5, 1.0, 2.0, 6.0], lengths) for e in (0, 1)]}
    prompts = {f"s{i}": [7, 8, 9] for i in range(4)}
    report["ceilings"] = temperature_ceilings(by_mode, _cost(), 200, prompts=prompts)
    replayed = report["ceilings"][0]["replayed"]
    assert replayed["methods"] == ["ngram", "suffix"]  # the specactor mode's drafters
    assert replayed["autoregressive"]["makespan_s"] == pytest.approx(10.0)
    assert replayed["clairvoyant"]["speedup"] > 1.0  # the samples repeat one token: drafts are right
    assert "clairvoyant drafts" in markdown(report)
    assert "replayed" not in temperature_ceilings(by_mode, _cost(), 200)[0]  # no prompts, no replay


def test_the_replayed_policy_is_told_the_run_s_max_tokens_and_temperature(monkeypatch) -> None:
    """What the live policy is told (specactor/policy/makespan.py: the closed-batch check), the
    replay's is too: the bench's max_tokens, and whether the temperature is 0."""
    import specactor.bench.replay_runs as replay_runs

    told: list[tuple] = []
    real = replay_runs.replay_ceilings

    def spy(*args, **kwargs):
        told.append(args[6:8])
        return real(*args, **kwargs)

    monkeypatch.setattr(replay_runs, "replay_ceilings", spy)
    lengths = [20, 40, 60, 200]
    prompts = {f"s{i}": [7, 8, 9] for i in range(4)}
    for temperature in (1.0, 0.0):
        by_mode = {mode: [_record(mode, 0, [1.0, 2.0, 3.0, 10.0], lengths)] for mode in ("autoregressive", "specactor")}
        for records in by_mode.values():
            records[0].temperature = temperature
        temperature_ceilings(by_mode, _cost(), 200, prompts=prompts)
    assert told == [(200, False), (200, True)]
