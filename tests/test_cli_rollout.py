"""``specactor rollout`` end to end, as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _cli(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECACTOR_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "specactor.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_rollout_writes_the_contract_format(tmp_path: Path, session_cache: Path) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "Say hi.", "id": "greet", "n": 2}\n{"prompt_ids": [1, 9690, 198], "max_tokens": 3}\n')
    out, events = tmp_path / "out.jsonl", tmp_path / "events.jsonl"
    run = _cli(["rollout", "--prompts", str(prompts), "--out", str(out), "--max-tokens", "6",
                "--temperature", "1.0", "--seed", "11", "--events", str(events)], session_cache)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["id"], x["sample"]) for x in lines] == [("greet", 0), ("greet", 1), ("1", 0)]
    for line in lines:
        assert set(line) >= {"id", "sample", "prompt_ids", "token_ids", "logprobs", "finish_reason", "text", "stats"}
        assert len(line["token_ids"]) == len(line["logprobs"]) <= 6
        assert all(lp <= 0 for lp in line["logprobs"])
        assert line["finish_reason"] in ("stop", "length")
        assert {"drafted", "accepted", "verify_steps", "per_method"} <= set(line["stats"])
    assert len(lines[2]["token_ids"]) <= 3
    assert "tokens/s" in run.stderr  # the summary table
    names = {json.loads(x)["event"] for x in events.read_text().splitlines()}
    assert {"engine.step", "request.finished", "rollout.summary"} <= names
    # same input, same seed: same tokens (seeds derive from --seed, id, sample)
    again = tmp_path / "again.jsonl"
    assert _cli(["rollout", "--prompts", str(prompts), "--out", str(again), "--max-tokens", "6",
                 "--seed", "11", "--max-batch", "1"], session_cache).returncode == 0
    assert [json.loads(x)["token_ids"] for x in again.read_text().splitlines()] == [x["token_ids"] for x in lines]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompts", "{bad}", "--out", "o.jsonl"], ":1: not a JSON object"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--top-p", "1.5"], "must be in (0, 1]"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--max-tokens", "0"], "must be >= 1"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--model", "/no/such/model"], "does not exist"),
        (["--prompts", "{ok}", "--out", "o.jsonl", "--mode", "fast"], "invalid choice"),
        (["--prompts", "{huge}", "--out", "o.jsonl"], "outside the vocabulary"),
    ],
)
def test_rollout_errors_are_clear(tmp_path: Path, session_cache: Path, args: list[str], message: str) -> None:
    files = {"{bad}": "this is not json\n", "{ok}": '{"prompt": "hi"}\n', "{huge}": '{"prompt_ids": [10000000]}\n'}
    for i, a in enumerate(args):
        if a in files:
            path = tmp_path / "in.jsonl"
            path.write_text(files[a])
            args[i] = str(path)
    run = _cli(["rollout", *args], session_cache)
    assert run.returncode == 2
    assert message in run.stderr, run.stderr


def test_help_explains_the_command() -> None:
    run = subprocess.run([sys.executable, "-m", "specactor.cli", "rollout", "--help"], capture_output=True, text=True)
    assert run.returncode == 0
    for flag in ("--prompts", "--out", "--model", "--mode", "--drafters", "--temperature", "--top-p", "--top-k",
                 "--max-tokens", "--n", "--seed", "--events"):
        assert flag in run.stdout


def test_kv_cache_that_cannot_fit_is_refused_up_front(default_model) -> None:
    from specactor.rollout import check_kv_memory

    _, model, _ = default_model
    check_kv_memory(model.cfg, 4, 512)
    with pytest.raises(ValueError, match="lower --max-batch or --max-tokens"):
        check_kv_memory(model.cfg, 10_000, 100_000)
