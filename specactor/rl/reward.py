"""HumanEval reward: run the problem's own tests against a completion, in a subprocess.

The reward is verifiable and dense enough for a small model to learn from:
``0.1`` for code that defines the entry point and runs, plus ``0.9`` times the
share of the test's ``assert`` statements that pass (each one is checked on its
own). Code that does not compile, raises at import, or exceeds the timeout
scores 0. The program runs in a fresh ``python -I`` in a temporary directory;
like HumanEval's own harness, this is no sandbox: run it on a machine where
executing model-written code is acceptable.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULT_TAG = "SPECACTOR_RESULT"
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


def extract_code(completion: str, problem: dict[str, Any]) -> str:
    """The code of a completion: its first fenced block (or all of it), with the problem's
    prompt (signature, imports) in front when the completion does not define the function."""
    match = _FENCE.search(completion)
    code = match.group(1) if match else completion
    if f"def {problem['entry_point']}" not in code:
        code = problem["prompt"] + code
    return code


def counting_check(test: str) -> str:
    """The test's ``check(candidate)`` rewritten to count passing asserts and return
    ``(passed, total)``; other statements run as they are."""
    tree = ast.parse(test)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            body: list[ast.stmt] = ast.parse("_passed = 0\n_total = 0").body
            for stmt in node.body:
                if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
                    guarded = ast.parse("try:\n    pass\nexcept Exception:\n    pass\nelse:\n    _passed += 1\n"
                                        "_total += 1").body
                    guarded[0].body = [stmt]  # type: ignore[attr-defined]
                    body.extend(guarded)
                else:
                    body.append(stmt)
            body.extend(ast.parse("return _passed, _total").body)
            node.body = body
    return ast.unparse(ast.fix_missing_locations(tree))


def program(code: str, problem: dict[str, Any]) -> str:
    return (f"{code}\n\n{counting_check(problem['test'])}\n\n"
            f"print({RESULT_TAG!r}, *check({problem['entry_point']}))\n")


async def humaneval_reward(completion: str, problem: dict[str, Any], timeout_s: float = 5.0) -> float:
    """Reward of one completion (see the module docstring)."""
    code = extract_code(completion, problem)
    try:
        compile(code, "<completion>", "exec")
    except (SyntaxError, ValueError):
        return 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program(code, problem))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(path), cwd=tmp, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return 0.0
    for line in out.decode(errors="replace").splitlines():
        if line.startswith(RESULT_TAG):
            _, passed, total = line.split()
            return 0.1 + 0.9 * int(passed) / max(int(total), 1)
    return 0.0


async def score(completions: list[str], problems: list[dict[str, Any]], timeout_s: float = 5.0,
                concurrency: int | None = None) -> list[float]:
    """Rewards of many completions, a few subprocesses at a time."""
    gate = asyncio.Semaphore(concurrency or os.cpu_count() or 1)

    async def one(completion: str, problem: dict[str, Any]) -> float:
        async with gate:
            return await humaneval_reward(completion, problem, timeout_s)

    return list(await asyncio.gather(*(one(c, p) for c, p in zip(completions, problems))))
