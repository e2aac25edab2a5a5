"""The bench end to end on a tiny workload: every engine mode is token-identical to
autoregressive across a real policy update, and the report, table and figure are written."""

from __future__ import annotations

import json

import pytest

from specactor.bench.measure import RunRecord
from specactor.bench.report import markdown
from specactor.bench.suite import BenchOptions, events_name, repeat_order, run_suite, write_outputs
from specactor.config import EngineConfig

pytestmark = pytest.mark.slow


def test_tail_is_the_time_after_ninety_percent_finished() -> None:
    record = RunRecord("m", 1.0, 0, makespan_s=10.0, finishes=[(float(t), 1) for t in range(1, 11)])
    assert record.tail_s == pytest.approx(1.0)  # the 9th of 10 finished at 9 s
    assert RunRecord("m", 1.0, 0, makespan_s=3.0, finishes=[(3.0, 5)]).tail_s == 0.0
    eight = RunRecord("m", 1.0, 0, makespan_s=8.0, finishes=[(float(t), 1) for t in range(1, 9)])
    assert eight.tail_s == pytest.approx(1.0)  # the last of 8 samples is the tail


def test_bench_runs_every_engine_mode_and_transformers(session_cache, tiny_checkpoint, monkeypatch, tmp_path) -> None:
    """On the tiny model (the bench takes its model from the engine flags): what is tested here is the
    harness, not the speed; bench/RESULTS.md has the real model's figures."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    opts = BenchOptions(prompts=1, n=2, max_tokens=12, temperatures=(1.0,), epochs=2,
                        modes=("autoregressive", "transformers", "coupled suffix", "specactor"), out=str(tmp_path),
                        engine=EngineConfig(model=str(tiny_checkpoint)))
    lines: list[str] = []
    report = run_suite(opts, lines.append)
    runs = {(r["mode"], r["epoch"]): r for r in report["runs"]}
    assert set(runs) == {(m, e) for m in opts.modes for e in (0, 1)}
    for mode in ("autoregressive", "coupled suffix", "specactor"):
        assert runs[(mode, 0)]["differing"] == 0 and runs[(mode, 1)]["differing"] == 0, mode
        assert runs[(mode, 0)]["policy_version"] == 0 and runs[(mode, 1)]["policy_version"] == 1, mode
    assert runs[("transformers", 0)]["differing"] is None  # another sampler: not comparable at T=1
    assert all(r["tokens"] > 0 and r["makespan_s"] > 0 and r["peak_mb"] > 0 for r in report["runs"])
    assert {"mean_test_reward", "samples", "grad_norm"} <= set(report["update"])
    for (mode, epoch), run in runs.items():  # what the ceilings and the phase columns are computed from
        assert run["phase1_s"] + run["phase2_s"] == pytest.approx(run["makespan_s"], abs=2e-3)
        assert len(run["per_sample"]) == 2 and run["samples"] == 2, mode
        if mode != "transformers":
            assert all(s["verify_steps"] >= 1 and "per_method" in s for s in run["per_sample"].values()), mode
    assert [c["epoch"] for c in report["ceilings"]] == [0, 1]
    for c in report["ceilings"]:
        assert c["autoregressive"]["makespan_s"] == pytest.approx(runs[("autoregressive", c["epoch"])]["makespan_s"],
                                                                  abs=1e-3)
        assert c["perfect"]["speedup"] >= c["zero_cost"]["speedup"] >= c["oracle"]["speedup"] >= 1.0
        assert c["scale"] > 0 and 0 <= c["tail_share"] <= 1 and c["samples"] == 2
    assert any("policy update" in line for line in lines)
    events = [json.loads(line) for line in (tmp_path / "events-specactor-T1.jsonl").read_text().splitlines()]
    assert any(e["event"] == "policy.assign" for e in events)  # the policy's decisions, for the note's "why"
    baseline = [json.loads(line) for line in (tmp_path / "events-autoregressive-T1.jsonl").read_text().splitlines()]
    assert any(e["event"] == "verify.step" for e in baseline)  # the baseline's steps, to compare at equal batch
    paths = write_outputs(report, tmp_path)
    assert json.loads(paths[0].read_text())["workload"]["n"] == 2
    table = paths[1].read_text()
    assert "| specactor | 1 |" in table and "| transformers | 1 |" in table and "perfect drafter" in table
    assert paths[2].stat().st_size > 10_000  # the PNG


def test_the_other_temperatures_run_their_own_number_of_epochs(session_cache, tiny_checkpoint, monkeypatch,
                                                                tmp_path) -> None:
    """The default bench: two epochs (with the update) at T=1, the main case; one at T=0."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    opts = BenchOptions(prompts=1, n=2, max_tokens=8, temperatures=(1.0, 0.0), epochs=2, other_epochs=1,
                        modes=("autoregressive",), out=str(tmp_path), engine=EngineConfig(model=str(tiny_checkpoint)))
    report = run_suite(opts, lambda line: None)
    assert sorted((r["temperature"], r["epoch"]) for r in report["runs"]) == [(0.0, 0), (1.0, 0), (1.0, 1)]
    assert report["workload"]["other_epochs"] == 1
    assert "2 epoch(s) at T=1, 1 at T=0" in markdown(report)


def test_a_bench_stopped_part_way_keeps_the_runs_and_temperatures_it_finished(session_cache, tiny_checkpoint,
                                                                             monkeypatch, tmp_path) -> None:
    """A time limit or a machine taken back stops a bench mid-way: what finished is on disk."""
    import specactor.bench.suite as suite

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    real = suite.run_mode

    def stopping(mode, work, temperature, *args, **kwargs):
        if temperature == 0.0 and mode.name == "specactor":
            raise KeyboardInterrupt  # what a stop looks like from here
        return real(mode, work, temperature, *args, **kwargs)

    monkeypatch.setattr(suite, "run_mode", stopping)
    opts = BenchOptions(prompts=1, n=2, max_tokens=8, temperatures=(1.0, 0.0), epochs=1,
                        modes=("autoregressive", "specactor"), out=str(tmp_path),
                        engine=EngineConfig(model=str(tiny_checkpoint)))
    with pytest.raises(KeyboardInterrupt):
        run_suite(opts, lambda line: None)
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(r["temperature"], r["mode"]) for r in runs] == [(1.0, "autoregressive"), (1.0, "specactor"),
                                                            (0.0, "autoregressive")]
    assert all(r["makespan_s"] > 0 and r["repeat"] == 0 for r in runs)
    report = json.loads((tmp_path / "suite.json").read_text())
    assert {r["temperature"] for r in report["runs"]} == {1.0} and report["partial"]
    text = (tmp_path / "suite.md").read_text()
    assert "**Partial report**" in text and "## Temperature 1" in text and "## Temperature 0" not in text


def test_repeats_alternate_the_order_of_the_modes(session_cache, tiny_checkpoint, monkeypatch, tmp_path) -> None:
    """A run inherits the machine the run before it left: every second repeat goes last to
    first, and the samples are still compared with autoregressive's when it ran second."""
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    opts = BenchOptions(prompts=1, n=2, max_tokens=8, temperatures=(1.0,), epochs=1, repeats=2,
                        modes=("autoregressive", "specactor"), out=str(tmp_path),
                        engine=EngineConfig(model=str(tiny_checkpoint)))
    lines: list[str] = []
    report = run_suite(opts, lines.append)
    started = [line.split(" (repeat")[0] for line in lines if line.endswith("...")]
    assert started == ["T=1 autoregressive", "T=1 specactor", "T=1 specactor", "T=1 autoregressive"]
    compared = [line for line in lines if "differing from autoregressive" in line]
    assert compared == ["  specactor epoch 1: differing from autoregressive 0"] * 2
    assert [len(r["repeats_s"]) for r in report["runs"]] == [2, 2]
    assert [repeat_order(("a", "b", "c"), r) for r in range(3)] == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_bad_mode_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        run_suite(BenchOptions(modes=("autoregressive", "fast")))
    with pytest.raises(ValueError, match="autoregressive mode must come first"):
        run_suite(BenchOptions(modes=("specactor", "autoregressive")))


def test_markdown_marks_incomparable_samplers() -> None:
    run = RunRecord("transformers", 1.0, 0, makespan_s=2.0, tokens=10).summary()
    base = RunRecord("autoregressive", 1.0, 0, makespan_s=4.0, tokens=10, differing=0).summary()
    table = markdown({"date": "d", "machine": "m", "command": "c", "wall_s": 1.0, "runs": [base, run],
                      "workload": {"prompts": 1, "n": 1, "max_tokens": 8, "epochs": 1, "temperatures": [1.0]}})
    assert "| transformers | 1 | 2.00 s (2.00x) |" in table and table.rstrip().endswith("| - |")


def test_stock_vllm_is_offered_where_its_cpu_build_runs() -> None:
    """The bench's `vllm` mode (stock vLLM beside the others) runs on vLLM's CPU build too: it was
    once skipped as "needs a GPU" on every machine without one."""
    pytest.importorskip("vllm", reason="backend vllm: install it with `bash scripts/setup.sh --vllm`")
    from specactor.bench.runners import vllm_available

    assert vllm_available() is None


def test_the_ceilings_are_simulated_on_the_profile_the_policy_used(tiny_checkpoint, tmp_path, monkeypatch) -> None:
    """This machine's cached profile for the engine's backend and setting (another backend's or
    another dtype's never stands in for it), a named file as named, else the packaged one."""
    from specactor.bench.suite import ceiling_cost, profile_label
    from specactor.engine.profiling import Grid, ensure_profile, measure
    from specactor.engine.weights import load_causal_lm

    monkeypatch.setenv("SPECACTOR_CACHE", str(tmp_path / "cache"))
    engine = EngineConfig(model=str(tiny_checkpoint), verifier_threads=1, profile="auto")  # the tests' default: packaged
    assert ceiling_cost(engine).source == "packaged"  # nothing measured yet
    model = load_causal_lm(tiny_checkpoint)
    grid = Grid(batch_sizes=(1, 2), chunk_lens=(1, 2), context=8, repeats=1)
    theirs = ensure_profile("another backend", tiny_checkpoint, dtype="float32", device="cpu", threads=1, grid=grid,
                            announce=lambda _: None, backend="vllm",
                            measurer=lambda _engine, *a, **k: measure(model, *a, **k))
    assert ceiling_cost(engine).source == "packaged"  # vLLM's steps are not our engine's
    ours = ensure_profile(model, tiny_checkpoint, dtype="float32", device="cpu", threads=1, grid=grid,
                          announce=lambda _: None)
    assert ours is not None and theirs is not None and ours != theirs
    assert ceiling_cost(engine).source == str(ours)
    assert profile_label(str(ours)) == ours.name and "/" not in profile_label(str(ours))
    assert ceiling_cost(EngineConfig(model=str(tiny_checkpoint), verifier_threads=2, profile="auto")).source == "packaged"
    assert ceiling_cost(EngineConfig(model=str(tiny_checkpoint), profile=str(theirs))).source == str(theirs)
    assert ceiling_cost(EngineConfig(model=str(tiny_checkpoint), profile="packaged")).source == "packaged"


def test_each_repeat_keeps_its_own_event_log() -> None:
    """Two repeats of a T=0 run took different paths through the policy (one drafted from step 7,
    one turned everything off); with one file per mode the second overwrote the first."""
    names = [events_name("coupled suffix", 0.0, repeat) for repeat in range(3)]
    assert names == ["events-coupled-suffix-T0.jsonl", "events-coupled-suffix-T0-r2.jsonl",
                     "events-coupled-suffix-T0-r3.jsonl"]
    assert events_name("specactor", 1.0) == "events-specactor-T1.jsonl"
