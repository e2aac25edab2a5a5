"""Prompt files: every bad line is an error naming the file, line and problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from specactor.prompts import PromptFileError, load_prompts, read_prompts

GOOD = '{"prompt": "hi", "id": "a", "n": 2, "max_tokens": 5, "seed": 3, "temperature": 0.5, "meta": {"x": 1}}'


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("not json", "not a JSON object"),
        ('["a list"]', "Expected `object`"),
        ('{"prompt": "x", "max_token": 5}', "unknown field `max_token`"),
        ('{"prompt": 5}', "Expected `str | null`"),
        ('{"prompt_ids": [1, "a"]}', "Expected `int`"),
        ('{"prompt_ids": [1, -2]}', "token ids >= 0"),
        ('{"prompt_ids": []}', "non-empty"),
        ('{"id": "x"}', "exactly one of"),
        ('{"prompt": "x", "prompt_ids": [1]}', "exactly one of"),
        ('{"prompt": "   "}', "empty"),
        ('{"prompt": "x", "n": 0}', '"n" must be >= 1'),
        ('{"prompt": "x", "max_tokens": -4}', '"max_tokens" must be >= 1'),
        ('{"prompt": "x", "temperature": -1}', '"temperature" must be >= 0'),
        ('{"prompt": "x", "seed": -1}', '"seed" must be'),
        ('{"prompt": "x", "id": "a"}', "duplicate id 'a' (first on line 1)"),
        ('{"prompt": "x", "id": ""}', '"id" must be non-empty'),
        ('{"prompt": "x", "id": "a#0"}', "without '#'"),
    ],
)
def test_bad_lines_name_file_line_and_problem(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(GOOD + "\n\n" + bad_line + "\n")
    with pytest.raises(PromptFileError) as err:
        read_prompts(path)
    assert str(err.value).startswith(f"{path}:3: ")
    assert message in str(err.value)


def test_good_file_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(GOOD + '\n{"prompt_ids": [1, 2, 3]}\n')
    first, second = read_prompts(path)
    assert (first.id, first.n, first.max_tokens, first.seed, first.temperature, first.meta) == ("a", 2, 5, 3, 0.5, {"x": 1})
    assert second.id == "1" and second.prompt_ids == [1, 2, 3] and second.n is None


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match="no such prompt file"):
        read_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PromptFileError, match="no prompts"):
        read_prompts(tmp_path / "empty.jsonl")


def test_humaneval_source() -> None:
    prompts = load_prompts("humaneval:3")
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in prompts[0].text
    assert len(load_prompts("humaneval")) == 164
    with pytest.raises(PromptFileError, match="humaneval:N"):
        load_prompts("humaneval:x")
