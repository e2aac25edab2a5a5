"""``specactor replay``: a finished rollout's speedups, replayed, with clear errors for bad input."""

from __future__ import annotations

import json
import re

from specactor.cli.main import main


def _rollout(path, outputs: list[list[int]]) -> str:
    with open(path, "w") as f:
        for i, output in enumerate(outputs):
            f.write(json.dumps({"id": "p0", "sample": i, "prompt_ids": [1, 2, 3], "token_ids": output}) + "\n")
    return str(path)


def test_it_prints_and_writes_the_policy_beside_its_ceilings(tmp_path, capsys) -> None:
    """Samples that repeat themselves: speculation pays, and no figure beats its ceiling's order
    (plain <= policy <= perfect drafter; clairvoyant at least the policy here, where every
    right token pays)."""
    path = _rollout(tmp_path / "rollout.jsonl", [([5, 6, 7, 8] * 100)[:200 + 50 * i] for i in range(4)])
    out = tmp_path / "replay.json"
    assert main(["replay", path, "--profile", "packaged", "--seeds", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 samples, 1100 tokens; step times from the packaged profile" in printed
    assert "max_tokens not known, sampled" in printed  # no sample stopped at a limit; siblings differ
    for name in ("plain", "specactor policy"):
        assert f"| rollout.jsonl | {name} |" in printed
    for name in ("clairvoyant", "perfect"):  # the ceilings at their best fixed window
        assert re.search(rf"\| rollout\.jsonl \| {name} \(window (1|2|4|8|16)\) \|", printed)
    runs = json.loads(out.read_text())["runs"]
    assert runs["plain"]["speedup"] == 1.0 and runs["plain"]["steps"] == 350
    assert 1.5 < runs["specactor policy"]["speedup"] <= runs["clairvoyant"]["speedup"] <= runs["perfect"]["speedup"]


def test_bad_input_is_named(tmp_path, capsys) -> None:
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "no rollout file at" in capsys.readouterr().err
    path = _rollout(tmp_path / "rollout.jsonl", [[1, 2, 3]])
    assert main(["replay", path, "--profile", "packaged", "--drafters", "model"]) == 2
    assert "cannot replay model" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    assert main(["replay", str(tmp_path / "bad.jsonl"), "--profile", "packaged"]) == 2
    assert "bad.jsonl line 1 is not a rollout sample" in capsys.readouterr().err


def test_it_tells_the_policy_the_rollout_s_limit_and_temperature(tmp_path, capsys) -> None:
    path = _rollout(tmp_path / "rollout.jsonl", [[5, 6, 7, 8] * 10, [5, 6, 7, 8] * 10])
    assert main(["replay", path, "--profile", "packaged", "--seeds", "1"]) == 0
    assert "max_tokens not known, greedy" in capsys.readouterr().out  # the two samples are the same
    assert main(["replay", path, "--profile", "packaged", "--seeds", "1", "--max-tokens", "64",
                 "--temperature", "1"]) == 0
    assert "max_tokens 64, sampled" in capsys.readouterr().out
    assert main(["replay", path, "--profile", "packaged", "--temperature", "-1"]) == 2
    assert "--temperature must be at least 0 (got -1.0)" in capsys.readouterr().err
    assert main(["replay", path, "--profile", "packaged", "--temperature", "nan"]) == 2
    assert "--temperature must be at least 0 (got nan)" in capsys.readouterr().err
