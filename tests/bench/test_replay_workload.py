"""A finished rollout as the simulator's workload: its verdicts are the drafters' real ones (the
same steps as replaying the sample alone), a plain run takes one step per token at the profile's
decode times, and the workload names what it cannot replay."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.bench.replay import replay
from specactor.bench.replay_workload import ReplayRequest, replay_requests, replay_workload
from specactor.drafters.ngram import NgramDrafter
from specactor.drafters.suffix import SuffixDrafter
from specactor.policy.bandit_state import Choice
from specactor.policy.cost_model import CostModel
from specactor.policy.simulation import FixedPolicy, PlainPolicy, Simulator

tokens = st.lists(st.integers(0, 20), max_size=60)


def _write(path, samples: list[tuple[list[int], list[int]]]) -> str:
    with open(path, "w") as f:
        for i, (prompt, output) in enumerate(samples):
            f.write(json.dumps({"id": f"p{i // 2}", "sample": i % 2, "prompt_ids": prompt, "token_ids": output}) + "\n")
    return str(path)


@settings(max_examples=40, deadline=None)
@given(prompt=tokens.filter(bool), output=tokens.filter(bool), window=st.integers(1, 16),
       method=st.sampled_from(["ngram", "suffix"]))
def test_one_request_drafting_every_step_takes_the_replay_s_steps(prompt, output, window, method) -> None:
    """Alone, with one method drafting ``window`` tokens on every step, a replayed request takes the
    steps and verifies the tokens that replaying its sample through that drafter gives."""
    drafter = NgramDrafter() if method == "ngram" else SuffixDrafter()
    request = ReplayRequest("r", prompt, output, {method: drafter})
    result = Simulator(CostModel.from_profile()).run([request], FixedPolicy(method, window))
    assert result.steps == replay(prompt, output, method, window)["steps"]
    assert result.tokens == len(output)


def test_a_plain_run_takes_a_step_per_token_at_the_profile_s_decode_times(tmp_path) -> None:
    lengths = [5, 9, 9, 3]
    path = _write(tmp_path / "rollout.jsonl", [([1, 2, 3], list(range(n))) for n in lengths])
    cost = CostModel.from_profile()
    result = Simulator(cost).run(replay_workload(path, ["ngram", "suffix"]), PlainPolicy())
    assert result.steps == max(lengths)
    expected = sum(cost.step_s(sum(n > t for n in lengths), sum(n > t for n in lengths), {}, True, 0)
                   for t in range(max(lengths)))
    assert result.makespan_s == pytest.approx(expected)


def test_a_sample_that_repeats_itself_is_drafted_through(tmp_path) -> None:
    """A looping sample's drafts are right: with window 4 it takes about a fifth of its steps."""
    loop = [7, 8, 9, 10, 11] * 40
    path = _write(tmp_path / "rollout.jsonl", [([1, 2], loop)])
    result = Simulator(CostModel.from_profile()).run(replay_workload(path, ["suffix"]), FixedPolicy("suffix", 4))
    assert result.steps < 0.3 * len(loop)
    assert result.steps >= math.ceil(len(loop) / 5)


def test_the_verifier_takes_the_longest_draft() -> None:
    """When the primary method has no draft for a step and a rider has one, the rider's is verified
    (fed, and its right tokens committed), as the verifier does."""

    class Request:
        request_id, length = "r", 10

        def draft(self, method: str, committed: int, window: int, rng: random.Random) -> tuple[int, int]:
            return (0, 0) if method == "ngram" else (3, 3)

        def commit(self, committed: int, tokens: int) -> None:
            pass

        def tokens(self, start: int, count: int) -> None:
            return None

    class Both(FixedPolicy):
        def plan(self, batch=None, step=None):
            return {r: Choice(["ngram", "suffix"], 3, True, "both") for r in self.requests}

    result = Simulator(CostModel.from_profile()).run([Request()], Both("ngram"))
    assert result.steps == math.ceil(10 / 4)


def test_the_workload_names_what_it_cannot_replay(tmp_path) -> None:
    path = _write(tmp_path / "rollout.jsonl", [([1], [2, 3]), ([1], [])])
    with pytest.raises(ValueError, match="cannot replay model"):
        replay_workload(path, ["suffix", "model"])
    assert [r.request_id for r in replay_workload(path, ["suffix"])] == ["p0#0"]  # the empty sample is left out
    with pytest.raises(ValueError, match="no output tokens"):
        ReplayRequest("r", [1], [], {})
    with pytest.raises(ValueError, match="no rollout file"):
        replay_workload(tmp_path / "missing.jsonl", ["suffix"])


def _random_tokens(n: int, seed: int) -> list[int]:
    """Tokens that never repeat an n-gram a drafter could follow (all distinct)."""
    return random.Random(seed).sample(range(1000, 50000), n)


def test_drafter_options_reach_the_replayed_drafters() -> None:
    """With its history and corpus turned off the suffix drafter cannot draft an earlier epoch's
    output: the same replay that drafts it through with the defaults takes a step per token."""
    samples = [("s0", [1, 2, 3], _random_tokens(120, 0))]
    history = [([1, 2, 3], samples[0][2])]
    cost = CostModel.from_profile()

    def steps(options: dict | None) -> int:
        requests = replay_requests(samples, ["suffix"], history, drafter_options=options)
        return Simulator(cost).run(requests, FixedPolicy("suffix", 8)).steps

    assert steps(None) < 30
    assert steps({"suffix": {"max_history_per_prompt": 0, "max_corpus_tokens": 0}}) == 120


def test_a_rollout_s_limit_and_greedy_decoding_are_read_from_its_rows() -> None:
    """What a replay tells the policy when the rollout file does not say: max_tokens is the length
    of the samples that stopped there, greedy means every prompt's samples are the same tokens."""
    from specactor.bench.replay_workload import looks_greedy, rollout_limit

    def row(pid: str, tokens: list[int], reason: str | None = None) -> dict:
        return {"id": pid, "sample": 0, "prompt_ids": [1], "token_ids": tokens, "finish_reason": reason}

    assert rollout_limit([row("a", [1] * 7, "stop"), row("a", [2] * 12, "length"), row("b", [3] * 12, "length")]) == 12
    assert rollout_limit([row("a", [1] * 7, "stop"), row("b", [2] * 9)]) is None
    assert looks_greedy([row("a", [1, 2]), row("a", [1, 2]), row("b", [3]), row("b", [3])])
    assert not looks_greedy([row("a", [1, 2]), row("a", [1, 3]), row("b", [3]), row("b", [3])])
    assert not looks_greedy([row("a", [1, 2]), row("b", [1, 2])])  # no prompt with two samples: not known


def test_a_replayed_request_tells_the_policy_its_limit_as_it_goes() -> None:
    """The simulator passes a request's limit less its output to the policy after every step."""
    told: list[tuple[str, int, bool]] = []

    class Listening(PlainPolicy):
        def observe_limit(self, request_id: str, left: int, greedy: bool) -> None:
            told.append((request_id, left, greedy))

    requests = replay_requests([("r", [1, 2, 3], [4, 5, 6, 7])], ["ngram"], limit=10, greedy=True)
    Simulator(CostModel.from_profile()).run(requests, Listening())
    assert told == [("r", 10, True), ("r", 9, True), ("r", 8, True), ("r", 7, True), ("r", 6, True)]
