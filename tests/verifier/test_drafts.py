"""DraftBook: which draft of a request and method is verified, as chunks arrive out of step with
the verdicts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specactor.verifier.drafts import DraftBook


def test_pieces_of_one_lookahead_are_verified_as_one_draft() -> None:
    book = DraftBook()
    book.add("r", "suffix", 0, [5, 6])
    book.add("r", "suffix", 2, [7, 8], committed=[])
    assert book.candidates("r", [], 8) == [("suffix", [5, 6, 7, 8])]
    assert book.candidates("r", [5], 2) == [("suffix", [6, 7])]  # trimmed to what follows, and the window


def test_a_redraft_after_a_rollback_replaces_a_stale_piece_that_starts_further_on() -> None:
    """The drafter sent [5, 6] at 0, then [7, 8] at 2 before the verdict on its first draft came:
    the step committed 5 then 9, so it drafts again from 2. Its new draft (starting before the
    stale piece, and arriving after it) is the one to verify, not ignored as late."""
    book = DraftBook()
    book.add("r", "suffix", 0, [5, 6])
    committed = [5, 9]
    assert book.candidates("r", committed, 8) == []  # contradicted at 1: dropped
    book.add("r", "suffix", 2, [7, 8], committed)  # the stale piece, arriving after the verdict
    book.add("r", "suffix", 2, [3, 4], committed)  # the redraft from the committed tokens
    assert book.candidates("r", committed, 8) == [("suffix", [3, 4])]
    # a piece past the output (position 5), then the drafter rolls back and drafts from 3: the
    # piece would not be usable before 3 more tokens, the redraft is usable once 4 is committed
    book.add("r", "suffix", 5, [1], committed)
    book.add("r", "suffix", 3, [2, 6], committed)
    assert book.candidates("r", committed + [4], 8) == [("suffix", [2, 6])]


def test_a_chunk_is_not_appended_to_a_contradicted_draft() -> None:
    book = DraftBook()
    book.add("r", "ngram", 0, [5, 6, 7])
    book.add("r", "ngram", 3, [8, 9], committed=[5, 1])  # continues [5, 6, 7], which 1 contradicts
    assert book.candidates("r", [5, 1], 8) == []  # a dead continuation is no draft either
    book.add("r", "ngram", 2, [2, 3], committed=[5, 1])
    assert book.candidates("r", [5, 1], 8) == [("ngram", [2, 3])]


def test_an_empty_draft_keeps_the_stored_one() -> None:
    book = DraftBook()
    book.add("r", "ngram", 0, [5, 6])
    book.add("r", "ngram", 4, [], committed=[])
    assert book.candidates("r", [], 8) == [("ngram", [5, 6])]


@given(st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 3), max_size=4)), max_size=12),
       st.lists(st.integers(0, 3), max_size=8))
def test_the_freshest_draft_that_agrees_with_the_output_is_what_is_offered(chunks, committed) -> None:
    """Whatever arrives, a candidate agrees with the committed output and continues it, and it
    is the last chunk's draft wherever that one is usable."""
    book = DraftBook()
    for start, tokens in chunks:
        book.add("r", "m", start, tokens, committed)
    offered = book.candidates("r", committed, 16)
    for _, tokens in offered:
        assert tokens  # a usable draft proposes something past the output
    stored = book._drafts.get("r", {}).get("m")
    if offered:
        assert stored is not None
        assert stored.tokens[:len(committed) - stored.start] == committed[stored.start:]
        assert offered == [("m", stored.tokens[len(committed) - stored.start:][:16])]
    last = next(((s, t) for s, t in reversed(chunks) if t), None)
    if last is not None and last[0] == len(committed) and stored is not None and stored.start == last[0]:
        assert offered and offered[0][1][:len(last[1])] == last[1]


def test_settling_a_late_draft_scores_the_tokens_the_output_passed_before_it_arrived() -> None:
    """A shadow draft that arrives after the output passed its start: a wrong one is a rejection
    where it first disagreed (it used to be dropped unscored), a right one is scored on the
    passed tokens and trimmed, so the next settle does not score them again."""
    book = DraftBook()
    book.add("r", "wrong", 0, [5, 7, 8])
    book.add("r", "right", 0, [5, 6, 9, 4])
    assert book.settle("r", [5, 6], ["wrong", "right"]) == {"wrong": [2, 1], "right": [2, 2]}
    assert book.methods("r") == ["right"]
    assert book.settle("r", [5, 6], ["right"]) == {}  # nothing new committed: nothing to score
    assert book.settle("r", [5, 6, 9], ["right"]) == {"right": [1, 1]}
    assert book.settle("r", [5, 6, 9, 3, 1], ["right"]) == {"right": [1, 0]}
    assert book.methods("r") == []


@given(st.lists(st.integers(0, 3), min_size=1, max_size=8), st.lists(st.integers(0, 3), max_size=12),
       st.integers(0, 6), st.lists(st.integers(1, 3), min_size=1, max_size=12))
def test_settling_step_by_step_scores_a_draft_as_once_against_the_whole_output(
        draft, output, start, strides) -> None:
    """However the output grows between settles (one token a step, or several while a late draft
    was on its way), a draft's scores add up to one geometric observation: the tokens right up to
    its first disagreement, then one rejection, and nothing scored twice."""
    book = DraftBook()
    book.add("r", "m", start, draft)
    drafted = accepted = 0
    shown = 0
    for stride in strides + [len(output)]:
        shown = min(len(output), shown + stride)
        got = book.settle("r", output[:shown], ["m"]).get("m")
        if got:
            drafted, accepted = drafted + got[0], accepted + got[1]
    checked = output[start:start + len(draft)]
    right = 0
    while right < len(checked) and checked[right] == draft[right]:
        right += 1
    assert accepted == right
    assert drafted == (right + 1 if right < len(checked) else right)
