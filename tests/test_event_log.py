"""`specactor events summarize` and `plot` on the log of a real speculative run."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from specactor.config import EngineConfig
from specactor.rollout_engine import RolloutEngine
from specactor.event_log import at_version, format_summary, read_events, summarize
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def run_log(default_model, session_cache, tmp_path_factory):
    """Events of a speculative rollout: 3 prompts x 2 samples x 128 tokens, ngram + suffix."""
    import asyncio
    import os

    from specactor.events import configure_events

    folder, _, _ = default_model
    tok = Tokenizer(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(3)]
    path = tmp_path_factory.mktemp("events") / "events.jsonl"
    os.environ["SPECACTOR_CACHE"] = str(session_cache)
    configure_events(path, console_level=None)

    async def go():
        # the static variant (every drafter on every request): the log surely holds drafts and verdicts to
        # count, whatever this machine's speed makes of the policy's choices
        config = EngineConfig(mode="specactor", drafters=["ngram", "suffix"], transport="inproc", processes=False,
                              max_batch=6, max_len=1024, policy=False)
        async with RolloutEngine(config) as engine:
            return await engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=128, seed=3, n=2))

    try:
        results = asyncio.run(go())
    finally:
        configure_events(None, console_level="warning")
    return path, results


def test_summary_counts_match_the_results(run_log) -> None:
    path, results = run_log
    summary = summarize(read_events(path))
    assert summary.requests == len(results) == 6
    assert summary.tokens == sum(len(r.token_ids) for r in results)
    drafted = sum(m.drafted for m in summary.methods.values())
    accepted = sum(m.accepted for m in summary.methods.values())
    assert accepted == sum(r.stats.accepted for r in results)
    assert drafted >= accepted > 0
    assert "verifier" in summary.busy_s and 0 < summary.busy_s["verifier"] <= summary.span_s
    steps = [e for e in read_events(path) if e["event"] == "verify.step"]
    assert sum(at.steps for at in summary.by_batch.values()) == len(steps)
    assert sum(at.committed for at in summary.by_batch.values()) == summary.tokens
    assert sum(at.drafted for at in summary.by_batch.values()) == drafted
    assert max(summary.by_batch) <= 6  # the engine's max_batch


def test_steps_by_batch_size_give_the_median_forward_and_per_step_tokens() -> None:
    """Two runs of the same work compare at equal batch size: the table must put each step under
    its own batch, with the median (not the mean: one slow step must not move it)."""
    def step(ts: float, batch: int, forward_ms: float, drafted: int, new: int) -> dict:
        return {"event": "verify.step", "ts": ts, "batch_size": batch, "forward_ms": forward_ms,
                "step_ms": forward_ms + 1, "drafted": drafted, "new_tokens": new, "methods": {}}

    events = [step(1, 4, 40.0, 0, 4), step(2, 4, 44.0, 8, 10), step(3, 4, 400.0, 0, 4),
              step(4, 2, 30.0, 6, 8), step(5, 2, 34.0, 0, 2)]
    summary = summarize(events)
    assert list(summary.by_batch) == [2, 4]
    four, two = summary.by_batch[4], summary.by_batch[2]
    assert (four.steps, four.median_forward_ms, four.median_step_ms, four.drafted, four.committed) == (3, 44.0, 45.0, 8, 18)
    assert (two.steps, two.median_forward_ms, two.median_step_ms, two.drafted, two.committed) == (2, 32.0, 33.0, 6, 10)
    text = format_summary(summary)
    assert "| 4 | 3 | 44.0 ms | 45.0 ms | 2.67 | 6.00 |" in text and "| 2 | 2 | 32.0 ms | 33.0 ms | 3.00 | 5.00 |" in text


def test_steps_replayed_as_cuda_graphs_are_counted_by_their_step_time() -> None:
    """A graphed step's forward_ms leaves out the sampler and bookkeeping around the replay: the
    summary counts replayed steps, their median step time and the captures, and says nothing of
    graphs where none ran (a CPU)."""
    def step(ts: float, graph: str, step_ms: float) -> dict:
        return {"event": "verify.step", "ts": ts, "batch_size": 4, "forward_ms": step_ms / 2 if graph else step_ms,
                "step_ms": step_ms, "drafted": 0, "new_tokens": 4, "methods": {}, "graph": graph}

    events = [{"event": "verify.graphs_captured", "ts": 0.0, "shapes": 42, "seconds": 1.5},
              step(1, "4x1", 6.0), step(2, "", 20.0), step(3, "4x1", 7.0), step(4, "4x5", 9.0),
              {"event": "verify.graph_captured", "ts": 4.5, "batch": 4, "chunk": 5, "capture_ms": 40.0}]
    summary = summarize(events)
    assert summary.graphs is not None and summary.graphs.step_ms == [6.0, 7.0, 9.0]
    text = format_summary(summary)
    assert "CUDA graphs: 3 of 4 verify steps replayed, median step 7.0 ms" in text
    assert "42 shapes captured before serving in 1.50 s, 1 during the run in 0.04 s" in text
    eager = summarize([step(1, "", 20.0), step(2, "", 21.0)])
    assert eager.graphs is None and "CUDA graphs" not in format_summary(eager)


def test_cli_summarize_and_plot(run_log, tmp_path) -> None:
    path, _ = run_log
    out = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| method |" in out and ("ngram" in out or "suffix" in out)
    assert "tail (after 90% of requests finished)" in out
    assert "| batch | verify steps | forward, median | step, median |" in out
    png = tmp_path / "fig.png"
    subprocess.run([sys.executable, "-m", "specactor", "events", "plot", str(path), "--out", str(png)],
                   capture_output=True, text=True, check=True)
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 800 and image.shape[1] >= 800  # three legible panels
    assert image.std() > 0.05  # not blank


def test_bad_log_is_an_error_naming_the_line(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"event": "verify.step", "ts": 1.0}) + "\nnot json\n")
    proc = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "bad.jsonl:2" in proc.stderr


def test_one_rl_step_is_the_events_between_two_weight_updates(tmp_path) -> None:
    """An RL loop's log holds every step's rollout: ``--version K`` keeps the one on version K, so
    two steps (or two engines' logs of the same step) compare; a failed update switches nothing."""
    def step(ts: float, batch: int) -> dict:
        return {"event": "verify.step", "ts": ts, "batch_size": batch, "forward_ms": 10.0 * batch,
                "drafted": 0, "new_tokens": batch}

    def weights(ts: float, version: int, ok: bool = True) -> dict:
        return {"event": "verify.weights", "ts": ts, "version": version, "ok": ok}

    events = [step(1, 4), step(2, 4), weights(3, 1), step(4, 2), weights(5, 2, ok=False), step(6, 3),
              weights(7, 2), step(8, 1)]
    assert [e["ts"] for e in at_version(events, 0)] == [1, 2]
    assert [e["ts"] for e in at_version(events, 1)] == [3, 4, 5, 6]  # the failed update left version 1 on
    assert [e["ts"] for e in at_version(events, 2)] == [7, 8]
    assert list(summarize(at_version(events, 1)).by_batch) == [2, 3]
    with pytest.raises(ValueError, match="no events at policy version 5; the log has versions 0, 1, 2"):
        at_version(events, 5)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(path), "--version", "2"],
                         capture_output=True, text=True, check=True).stdout
    assert "| 1 | 1 | 10.0 ms |" in out and "| 4 |" not in out
    bad = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(path), "--version", "9"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no events at policy version 9" in bad.stderr


def test_a_policy_whose_plans_were_spaced_out_is_reported() -> None:
    """At a large batch on a GPU a plan can outlast the steps between plans: the policy spaces them
    (policy.plan_gap), and the summary says how far and why; a run without it says nothing."""
    step = {"event": "verify.step", "ts": 1.0, "batch_size": 256, "forward_ms": 9.0, "step_ms": 12.0,
            "drafted": 0, "new_tokens": 256, "methods": {}}
    gaps = [{"event": "policy.plan_gap", "ts": 2.0, "steps": 6, "plan_ms": 14.2, "step_ms": 9.1, "batch": 256},
            {"event": "policy.plan_gap", "ts": 3.0, "steps": 9, "plan_ms": 20.5, "step_ms": 9.0, "batch": 256}]
    text = format_summary(summarize([step, *gaps]))
    assert "policy plans spaced out 2 times, at most to every 9 steps (a plan 20.5 ms against steps of 9.0 ms " \
           "at batch 256)" in text
    assert "spaced out" not in format_summary(summarize([step]))


def test_a_gzip_compressed_log_reads_as_the_plain_one(run_log, tmp_path) -> None:
    """Long event logs are kept compressed: ``summarize`` and ``plot`` read them as they are."""
    path, _ = run_log
    packed = tmp_path / "events.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert read_events(packed) == read_events(path)
    out = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(packed)],
                         capture_output=True, text=True, check=True).stdout
    plain = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(path)],
                           capture_output=True, text=True, check=True).stdout
    assert out == plain


def test_a_cut_off_compressed_log_is_an_error_naming_the_file(run_log, tmp_path) -> None:
    path, _ = run_log
    cut = tmp_path / "cut.jsonl.gz"
    data = gzip.compress(path.read_bytes())
    cut.write_bytes(data[: len(data) // 2])
    proc = subprocess.run([sys.executable, "-m", "specactor", "events", "summarize", str(cut)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "cut.jsonl.gz" in proc.stderr and "damaged" in proc.stderr
