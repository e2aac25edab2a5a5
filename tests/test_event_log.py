"""`specactor events summarize` and `plot` on the log of a real speculative run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specactor.coordinator import EngineConfig, RolloutEngine
from specactor.event_log import read_events, summarize
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


def test_cli_summarize_and_plot(run_log, tmp_path) -> None:
    path, _ = run_log
    out = subprocess.run([sys.executable, "-m", "specactor.cli", "events", "summarize", str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| method |" in out and ("ngram" in out or "suffix" in out)
    assert "tail (after 90% of requests finished)" in out
    png = tmp_path / "fig.png"
    subprocess.run([sys.executable, "-m", "specactor.cli", "events", "plot", str(path), "--out", str(png)],
                   capture_output=True, text=True, check=True)
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] >= 800 and image.shape[1] >= 800  # three legible panels
    assert image.std() > 0.05  # not blank


def test_bad_log_is_an_error_naming_the_line(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"event": "verify.step", "ts": 1.0}) + "\nnot json\n")
    proc = subprocess.run([sys.executable, "-m", "specactor.cli", "events", "summarize", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "bad.jsonl:2" in proc.stderr
