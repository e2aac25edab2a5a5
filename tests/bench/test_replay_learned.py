"""The learned drafter in a replay: one teacher-forced forward gives the verdict of every draft the
live drafter would make from any committed prefix, at T=0 and T=1; the replay prices its drafting,
beside the step or added to it; and what it needs is asked for by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.bench.replay_learned import (LEARNED, TeacherForcedDrafter, hit_rate, learned_draft_cost,
                                            teacher_forced_predictions, train_on_rollouts)
from specactor.bench.replay_runs import ReplaySettings, compare
from specactor.bench.replay_workload import ReplayRequest, replay_requests
from specactor.drafters.base import DraftState
from specactor.drafters.learned import LearnedDrafter
from specactor.policy.cost_model import CostModel
from specactor.policy.simulation import FixedPolicy, Simulator
from specactor.seeds import sample_seed
from tests.conftest import ours_from_hf, tiny_hf_model

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "replay_policy.py"


def _cycle(length: int, offset: int = 0) -> list[int]:
    return [10 + (offset + i) % 7 for i in range(length)]


@pytest.fixture(scope="module")
def drafter() -> LearnedDrafter:
    """A student that has learnt a 7-token cycle: right on most positions of a cycle, not all."""
    target = ours_from_hf(tiny_hf_model("llama", seed=5, vocab=256))
    student = LearnedDrafter(target, layers=1, vocab=64, max_slots=8, max_len=256, epochs=6, lr=3e-3,
                             max_train_s=None)
    train_on_rollouts(student, [{"prompt_ids": [1, 2, 3 + i], "token_ids": _cycle(50, i)} for i in range(4)])
    return student


def _accepted(draft: list[int], truth: list[int]) -> int:
    ok = 0
    while ok < min(len(draft), len(truth)) and draft[ok] == truth[ok]:
        ok += 1
    return ok


@settings(max_examples=12, deadline=None)
@given(noise=st.lists(st.integers(0, 60), min_size=40, max_size=40), flips=st.sets(st.integers(0, 39), max_size=8),
       temperature=st.sampled_from([0.0, 1.0]), seed=st.integers(0, 1000), window=st.integers(1, 8))
def test_every_prefix_s_verdict_is_the_live_drafter_s(drafter, noise, flips, temperature, seed, window) -> None:
    """For a sample of any tokens, the replay's accepted length from every committed prefix equals
    that of the draft the live drafter proposes there (its KV cache, its chain of steps)."""
    output = [n if i in flips else t for i, (t, n) in enumerate(zip(_cycle(40, 2), noise))]
    row = {"id": "HumanEval/3", "sample": 1, "prompt_ids": [1, 2, 9], "token_ids": output}
    predictions = teacher_forced_predictions(drafter, [row], temperature, seed)
    request = ReplayRequest("HumanEval/3#1", row["prompt_ids"], output,
                            {LEARNED: TeacherForcedDrafter(predictions)})
    live_seed = sample_seed(seed, row["id"], row["sample"])
    for committed in range(0, len(output), 3):
        state = DraftState(f"live-{committed}", row["prompt_ids"], committed=output[:committed], seed=live_seed,
                           temperature=temperature)
        drafter.start(state)
        live = drafter.propose([state], window)[0]
        drafter.finish(state)
        assert request.draft(LEARNED, committed, window, None)[1] == _accepted(live, output[committed:])
        request.commit(committed, 3)


def test_a_student_that_learnt_the_text_is_right_where_the_text_follows_it(drafter) -> None:
    clean = {"id": "a", "sample": 0, "prompt_ids": [1, 2, 9], "token_ids": _cycle(40, 2)}
    scrambled = {"id": "b", "sample": 0, "prompt_ids": [1, 2, 9], "token_ids": [200 - i for i in range(40)]}
    rows = [clean, scrambled]
    predictions = teacher_forced_predictions(drafter, rows, 0.0, 7)
    assert hit_rate(predictions, [clean]) > 0.8
    assert hit_rate(predictions, [scrambled]) < 0.1
    untrained = LearnedDrafter(ours_from_hf(tiny_hf_model("llama", seed=5, vocab=256)), layers=1, vocab=64)
    assert teacher_forced_predictions(untrained, rows, 1.0, 7) == {"a#0": [], "b#0": []}  # proposes nothing, as live


def _replay(predictions: dict[str, list[int]], outputs: dict[str, list[int]], cost: CostModel,
            shared_hardware: bool) -> float:
    drafter = TeacherForcedDrafter(predictions)
    requests = [ReplayRequest(rid, [1], out, {LEARNED: drafter}) for rid, out in outputs.items()]
    cost.shared_methods = {LEARNED} if shared_hardware else set()
    return Simulator(cost).run(requests, FixedPolicy(LEARNED, 4)).makespan_s


def test_drafting_time_hides_beside_the_step_or_adds_to_it() -> None:
    cost = CostModel.from_profile()
    outputs = {f"s{i}": _cycle(60, i) for i in range(4)}
    right = {rid: list(out) for rid, out in outputs.items()}
    cost.draft[LEARNED] = learned_draft_cost(cost, 0.0)
    free = _replay(right, outputs, cost, shared_hardware=True)
    cost.draft[LEARNED] = learned_draft_cost(cost, 0.05)
    hidden = _replay(right, outputs, cost, shared_hardware=False)
    added = _replay(right, outputs, cost, shared_hardware=True)
    assert free == pytest.approx(hidden)  # a twentieth of a step a token, at most 9 ahead: within the step
    assert added > hidden * 1.1


def test_a_right_student_pays_in_the_replay_and_a_wrong_one_is_not_used() -> None:
    cost = CostModel.from_profile()
    cost.draft[LEARNED] = learned_draft_cost(cost, 1 / 16)
    samples = [(f"s{i}", [1, 2], _cycle(120, i)) for i in range(4)]
    for predictions, faster in (({rid: list(out) for rid, _, out in samples}, True),
                                ({rid: [3] * len(out) for rid, _, out in samples}, False)):
        settings_ = ReplaySettings(cost, [LEARNED], drafter_options={LEARNED: {"predictions": predictions}})
        runs = compare(samples, ["geometric"], settings_)["runs"]
        if faster:
            assert runs["geometric"]["speedup"] > 1.5
        else:
            assert runs["geometric"]["speedup"] >= 0.97


def test_draft_cost_is_a_share_of_the_target_s_step() -> None:
    cost = CostModel.from_profile()
    draft = learned_draft_cost(cost, 0.125)
    assert draft.seconds(1) == pytest.approx(0.125 * cost.verify_s(1, 1))
    top = max(cost.batch_sizes)
    assert draft.seconds(top) == pytest.approx(0.125 * cost.verify_s(top, 1))
    with pytest.raises(ValueError, match="must be >= 0"):
        learned_draft_cost(cost, -1)


def test_what_the_replay_lacks_is_named() -> None:
    with pytest.raises(ValueError, match="--learned"):
        replay_requests([("s", [1], [2, 3])], [LEARNED])
    request = ReplayRequest("s#0", [1], [2, 3], {LEARNED: TeacherForcedDrafter({"other#0": [1]})})
    with pytest.raises(KeyError, match="s#0"):
        request.draft(LEARNED, 0, 2, None)


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_the_script_asks_for_what_the_learned_drafter_needs(tmp_path) -> None:
    rollout = tmp_path / "r.jsonl"
    rollout.write_text(json.dumps({"id": "p", "sample": 0, "prompt_ids": [1], "token_ids": [2, 3]}) + "\n")
    done = _script(str(rollout), "--learned", str(rollout))
    assert done.returncode == 2 and "--sampling needs one T:SEED per rollout (1), got 0" in done.stderr
    done = _script(str(rollout), "--learned", str(rollout), "--sampling", "hot:7")
    assert done.returncode == 2 and "expected T:SEED" in done.stderr
    done = _script(str(rollout), "--methods", "learned,ngram")
    assert done.returncode == 2 and "needs --learned" in done.stderr
    done = _script(str(rollout), "--learned", str(rollout), "--sampling", "1:7", "--learned-option", "depth=3")
    assert done.returncode == 2 and "--learned-option 'depth=3'" in done.stderr and "layers" in done.stderr


def test_the_script_replays_a_trained_student(tmp_path, tiny_checkpoint) -> None:
    """End to end on a tiny model: trained on one rollout, replayed on another, with its hit rate."""
    train, replayed = tmp_path / "train.jsonl", tmp_path / "replayed.jsonl"
    for path, offset in ((train, 0), (replayed, 3)):
        path.write_text("".join(json.dumps({"id": f"p{i}", "sample": 0, "prompt_ids": [1, 2],
                                            "token_ids": _cycle(40, offset + i)}) + "\n" for i in range(3)))
    out = tmp_path / "out.json"
    done = _script(str(replayed), "--learned", str(train), "--sampling", "0:7", "--model", str(tiny_checkpoint),
                   "--policies", "plain,geometric", "--learned-option", "epochs=1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["learned"]["report"]["sequences"] == 3
    assert report["learned"]["report"]["epochs"] == 1  # the product's 3 passes, set to 1
    assert 0.0 <= report["learned"]["hit_rate"][str(replayed)] <= 1.0
    assert report["rollouts"][str(replayed)]["methods"] == ["ngram", "suffix", LEARNED]
