"""HumanEval rewards come from running the problem's tests; GRPO advantages are group-relative."""

from __future__ import annotations

import pytest

from specactor.prompts import humaneval_problems
from specactor.rl.grpo import group_advantages
from specactor.rl.reward import counting_check, extract_code, score

PROBLEM = humaneval_problems(3)[2]  # truncate_number: three asserts


async def test_reward_counts_passing_asserts() -> None:
    right = "Here:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
    one_of_three = "```python\ndef truncate_number(number):\n    return 0.5\n```"
    body_only = "    return number - int(number)\n"  # continues the prompt's signature
    rewards = await score([right, one_of_three, body_only, "no code here", "```python\nimport os\nos._exit(3)\n```",
                           "```python\ndef truncate_number(x):\n    while True:\n        pass\n```"],
                          [PROBLEM] * 6, timeout_s=3)
    assert rewards[0] == pytest.approx(1.0)
    assert rewards[1] == pytest.approx(0.1 + 0.9 / 3)
    assert rewards[2] == pytest.approx(1.0)
    assert rewards[3:] == [0.0, 0.0, 0.0]  # does not compile; exits before the tests; times out


def test_counting_check_keeps_setup_statements_and_counts_asserts() -> None:
    src = counting_check("def check(candidate):\n    x = 2\n    assert candidate(x) == 4\n    assert False\n")
    namespace: dict = {}
    exec(src, namespace)
    assert namespace["check"](lambda v: v * 2) == (1, 2)
    assert extract_code("```py\ndef f():\n    pass\n```", {"entry_point": "f", "prompt": "unused"}).startswith("def f")


def test_group_advantages_are_relative_to_the_group() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv[0] == pytest.approx(-adv[1]) and adv[0] > 0 and sum(adv) == pytest.approx(0)
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
