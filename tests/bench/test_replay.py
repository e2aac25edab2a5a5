"""Replaying a sample through a drafter that drafts every step: the step count is consistent
with what was committed for any tokens, and a sample that repeats itself is drafted through."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.bench.replay import DRAFTERS, replay, replay_steps, tally
from specactor.vllm_backend import suffix_decoding_missing

tokens = st.lists(st.integers(0, 20), max_size=60)
drafters = [d for d in DRAFTERS if d != "arctic" or not suffix_decoding_missing()]


@settings(max_examples=60, deadline=None)
@given(prompt=tokens.filter(bool), output=tokens, window=st.integers(1, 16), drafter=st.sampled_from(drafters))
def test_every_step_commits_its_accepted_tokens_and_one_of_its_own(prompt, output, window, drafter) -> None:
    got = replay(prompt, output, drafter, window)
    assert got["accepted"] <= got["drafted"] <= got["steps"] * window
    assert got["steps"] <= len(output)
    # a step commits accepted + 1, except a last step whose draft ran to the sample's end
    assert got["steps"] + got["accepted"] in (len(output), len(output) + 1)


@settings(max_examples=40, deadline=None)
@given(prompt=tokens.filter(bool), output=tokens, window=st.integers(1, 16), drafter=st.sampled_from(drafters))
def test_each_step_starts_where_the_last_one_s_commits_ended(prompt, output, window, drafter) -> None:
    """A step's draft is scored against the sample's own tokens from its start, and the next
    step starts after the right ones and the verifier's own token; the totals are replay's."""
    t = steps = drafted = accepted = 0
    for start, draft, ok in replay_steps(prompt, output, drafter, window):
        assert start == t and len(draft) <= window
        assert draft[:ok] == output[start:start + ok]
        assert ok == len(draft) or start + ok == len(output) or draft[ok] != output[start + ok]
        t = min(start + ok + 1, len(output))
        steps, drafted, accepted = steps + 1, drafted + len(draft), accepted + ok
    assert t == len(output)
    got = replay(prompt, output, drafter, window)
    assert (got["steps"], got["drafted"], got["accepted"]) == (steps, drafted, accepted)
    # every accepted token is position k of a draft whose first k tokens were right
    assert sum(got["right"]) == accepted
    assert all(r <= n for r, n in zip(got["right"], got["reached"]))
    assert all(later <= right for later, right in zip(got["reached"][1:], got["right"]))
    # the drafts split by what came before them are all the drafts that had tokens
    drafts = sum(1 for _, draft, _ in replay_steps(prompt, output, drafter, window) if draft)
    assert sum(c[0] for c in got["after"].values()) == drafts
    assert sum(c[1] for c in got["after"].values()) == drafted
    assert sum(c[2] for c in got["after"].values()) == accepted


def test_the_tally_of_hand_made_steps() -> None:
    """Every count, on steps worked out by hand (a 12-token sample, window 3)."""
    steps = [(0, [], 0),           # no draft: commits 1
             (1, [7, 7, 7], 0),    # after none: a miss, commits 1
             (2, [5, 6, 7], 2),    # after a miss: partly right, commits 3
             (5, [1, 2, 3], 3),    # after a partial: right to its end, commits 4
             (9, [4, 5, 6], 3)]    # after a full: right to the sample's end (3 of 3 left)
    got = tally(steps, 12, 3)
    assert (got["steps"], got["drafted"], got["accepted"]) == (5, 12, 8)
    assert got["reached"] == [4, 3, 3] and got["right"] == [3, 3, 2]
    assert got["after"] == {"none": [1, 3, 0], "miss": [1, 3, 2], "partial": [1, 3, 3], "full": [1, 3, 3]}
    # a draft cut by the sample's end: positions past it are not reached, and it counts as full
    end = tally([(10, [4, 5, 6], 2), (11, [9], 0)], 12, 3)
    assert end["reached"] == [2, 1, 0] and end["right"] == [1, 1, 0]
    assert end["after"]["full"] == [1, 1, 0]


def test_a_draft_after_one_right_to_its_end_is_counted_there() -> None:
    """A sample that repeats itself: after the first draft that is right to its end, every
    draft follows a full one and is right again."""
    loop = [5, 6, 7, 8, 9, 10, 11, 12]
    got = replay([1, 2, 3] + loop, loop * 12, "suffix", window=4)
    drafts, drafted, accepted = got["after"]["full"]
    assert drafts >= 15 and accepted >= drafted - 4  # only the last, cut by the sample's end, falls short


@pytest.mark.parametrize("drafter", drafters)
def test_a_sample_that_repeats_itself_is_drafted_through(drafter) -> None:
    loop = [5, 6, 7, 8, 9, 10, 11, 12]
    output = loop * 12
    got = replay([1, 2, 3] + loop, output, drafter, window=8)
    assert got["steps"] <= len(output) // 4 and got["accepted"] >= 0.7 * len(output)
    assert replay([1, 2, 3], list(range(100, 196)), drafter, window=8)["steps"] == 96  # nothing to match


def test_an_unknown_drafter_or_window_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown drafter 'eagle'"):
        replay([1], [2], "eagle", 4)
    with pytest.raises(ValueError, match="window must be at least 1"):
        replay([1], [2], "ngram", 0)


def test_a_rollout_file_is_read_and_a_bad_one_named(tmp_path) -> None:
    """What the replay scripts read: a rollout's samples, or an error naming the file and line."""
    from specactor.bench.replay import load_rollout

    good = tmp_path / "rollout.jsonl"
    good.write_text('{"id": "a", "sample": 1, "prompt_ids": [1, 2], "token_ids": [3], "stats": {"verify_steps": 1}}\n'
                    '\n{"id": "b", "sample": 0, "prompt_ids": [4], "token_ids": []}\n')
    rows = load_rollout(good)
    assert [(r["id"], r["sample"], r["prompt_ids"], r["token_ids"]) for r in rows] == [("a", 1, [1, 2], [3]),
                                                                                       ("b", 0, [4], [])]
    assert rows[0]["stats"] == {"verify_steps": 1} and rows[1]["stats"] == {}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "sample": 0, "prompt_ids": [1], "token_ids": [2]}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl line 2 is not a rollout sample.*'sample'"):
        load_rollout(bad)
    with pytest.raises(ValueError, match="no rollout file at"):
        load_rollout(tmp_path / "missing.jsonl")
    packed = tmp_path / "rollout.jsonl.gz"  # kept compressed once the run is over
    packed.write_bytes(gzip.compress(good.read_bytes()))
    assert load_rollout(packed) == rows
