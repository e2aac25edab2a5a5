"""SuffixDrafter: drafting from the request, its siblings, earlier rollouts and the corpus; rollback,
adaptive length, bounded memory and argument checks. Synthetic token ids only (no model)."""

from __future__ import annotations

import math
import random
import sys
import threading

import pytest

from specactor.drafters.base import DraftState
from specactor.drafters.suffix import SuffixDrafter, _Store


def commit(drafter: SuffixDrafter, state: DraftState, tokens: list[int]) -> bool:
    """What the DraftActor does with a verdict: update the state, then tell the drafter."""
    start = len(state.committed)
    kept = state.observe(start, tokens)
    drafter.observe(state, start, tokens)
    return kept


def started(drafter: SuffixDrafter, rid: str, prompt: list[int], output: list[int] = ()) -> DraftState:
    state = DraftState(rid, list(prompt))
    drafter.start(state)
    if output:
        commit(drafter, state, list(output))
    return state


def propose(drafter: SuffixDrafter, state: DraftState, k: int) -> list[int]:
    (draft,) = drafter.propose([state], k)
    return draft


# ---------------------------------------------------------------- sources


def test_drafts_from_the_request_itself() -> None:
    d = SuffixDrafter()
    s = started(d, "r", [5, 6, 7, 8, 9, 1, 5, 6, 7])
    assert propose(d, s, 8) == [8, 9, 1]  # match "5 6 7" (3 tokens) -> at most 3 tokens


def test_a_loop_is_drafted_past_its_end() -> None:
    d = SuffixDrafter()
    s = started(d, "r", [1, 2, 3, 1, 2, 3, 1, 2, 3])
    # the match continues into the context's end and then into its own draft
    assert propose(d, s, 8) == [1, 2, 3, 1, 2, 3]


def test_drafts_from_a_sibling_in_flight() -> None:
    d = SuffixDrafter(max_corpus_tokens=0)
    prompt = list(range(10, 20))
    output = list(range(100, 120))
    a = started(d, "first", prompt)  # ids need not look like "<prompt>#<sample>"
    b = started(d, "other", prompt)
    assert propose(d, b, 8) == []  # nothing known yet
    commit(d, a, output[:12])  # A's verdicts arrive
    assert propose(d, b, 8) == output[:8]  # B at output 0: A's start follows the same prompt
    commit(d, b, output[:5])
    assert propose(d, b, 8) == output[5:12]  # ... and A's continuation (as far as A has committed)
    commit(d, a, output[12:])
    assert propose(d, b, 8) == output[5:13]


def test_history_across_calls_serves_the_same_prompt_only() -> None:
    d = SuffixDrafter(max_corpus_tokens=0)  # history only: the corpus is tested separately
    prompt, other = list(range(10, 20)), list(range(30, 40))
    output = list(range(100, 130))
    first = started(d, "epoch1", prompt, output)
    d.finish(first)
    assert d.history_outputs(prompt) == 1 and d.history_outputs(other) == 0
    again = started(d, "epoch2", prompt)  # a new request (new seed), same prompt, no output yet
    assert propose(d, again, 8) == output[:8]
    commit(d, again, output[:20])
    assert propose(d, again, 8) == output[20:28]
    assert propose(d, started(d, "x", other), 8) == []  # another prompt gets nothing from that history


def test_the_corpus_serves_any_prompt() -> None:
    prompt, other = list(range(10, 20)), list(range(30, 40))
    output = list(range(100, 130))
    with_corpus, without = SuffixDrafter(), SuffixDrafter(max_corpus_tokens=0)
    for d in (with_corpus, without):
        d.finish(started(d, "a", prompt, output))
    drafts = [propose(d, started(d, "b", other, output[:10]), 8) for d in (with_corpus, without)]
    assert drafts == [output[10:18], []]


def test_without_history_the_corpus_still_serves_the_same_prompt() -> None:
    d = SuffixDrafter(max_history_per_prompt=0)
    prompt, output = list(range(10, 20)), list(range(100, 130))
    d.finish(started(d, "a", prompt, output))
    assert d.history_outputs(prompt) == 0
    assert propose(d, started(d, "b", prompt, output[:10]), 8) == output[10:18]


def test_frequency_then_recency_break_ties() -> None:
    d = SuffixDrafter()
    # "1 2" is followed by 7 twice and by 8 once (the most recent): frequency wins
    s = started(d, "r", [1, 2, 7, 1, 2, 7, 1, 2, 8, 5, 1, 2])
    assert propose(d, s, 8)[0] == 7
    # one each: the most recent wins
    s = started(d, "q", [1, 2, 7, 1, 2, 8, 5, 1, 2])
    assert propose(d, s, 8)[0] == 8


def test_an_ambiguous_continuation_is_not_drafted() -> None:
    prompt = list(range(10, 20))
    d = SuffixDrafter(max_corpus_tokens=0, min_confidence=0.5)
    for i in range(4):  # four earlier outputs that agree on 2 tokens, then split four ways
        d.finish(started(d, f"h{i}", prompt, [100, 101, 200 + i, 300 + i]))
    assert propose(d, started(d, "new", prompt), 8) == [100, 101]


# ---------------------------------------------------------------- drafting mechanics


def test_rollback_then_propose_continues_from_the_committed_tokens() -> None:
    d = SuffixDrafter()
    s = started(d, "r", [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 1, 2, 3, 4])
    draft = propose(d, s, 4)
    assert draft == [9, 9, 9, 1]  # two 4-token matches, one vote each: the most recent
    s.lookahead.extend(draft)
    assert propose(d, s, 3) == [2, 3, 4]  # decoupled: drafting ahead continues after the lookahead
    assert not commit(d, s, [5])  # the target chose 5: the lookahead is discarded
    assert s.lookahead == [] and s.rollbacks == 1
    assert propose(d, s, 4) == [6, 7, 8, 1]  # "1 2 3 4 5" matches the prompt's start


def test_draft_length_adapts_to_the_match_length() -> None:
    d = SuffixDrafter(alpha=1.0, min_confidence=0.0)
    short = started(d, "short", [10, 11, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 10, 11])
    long = started(d, "long", [1, 2, 3, 4, 5, 6, 7, 8, 50, 51, 52, 53, 54, 55, 56, 57, 1, 2, 3, 4, 5, 6, 7, 8])
    assert propose(d, short, 8) == [50, 51]  # a 2-token match drafts 2
    assert propose(d, long, 8) == [50, 51, 52, 53, 54, 55, 56, 57]  # an 8-token match drafts k
    doubled = SuffixDrafter(alpha=2.0, min_confidence=0.0)
    assert propose(doubled, started(doubled, "s", short.prompt_ids), 8) == [50, 51, 52, 53]


def test_propose_batches_and_edge_cases() -> None:
    d = SuffixDrafter()
    states = [started(d, "a", [1, 2, 1]), started(d, "b", []), started(d, "c", [7, 8, 9])]
    assert d.propose(states, 4) == [[2], [], []]  # a 1-token match drafts 1 token
    assert d.propose(states, 0) == [[], [], []]
    with pytest.raises(ValueError, match="k"):
        d.propose(states, -1)
    d.finish(states[0])
    assert d.propose(states[:1], 4) == [[]]  # finished (e.g. while the caller's batch was in flight)
    d.observe(states[0], 0, [5])  # a late verdict does not bring it back
    assert d.stats()["active_requests"] == 2


# ---------------------------------------------------------------- epochs


def _outputs(rng: random.Random, phrases: list[list[int]], length: int) -> list[int]:
    out: list[int] = []
    while len(out) < length:
        out.extend(rng.choice(phrases))
    return out[:length]


def _epoch(d: SuffixDrafter, prompts: list[list[int]], targets: list[list[list[int]]], k: int, tag: str) -> float:
    """Roll out every prompt's samples concurrently (round robin), verifying drafts against the
    targets: accept the matching prefix plus the target's next token. Returns accepted tokens per step."""
    accepted = steps = 0
    for p, (prompt, samples) in enumerate(zip(prompts, targets)):
        states = [started(d, f"{tag}:{p}#{i}", prompt) for i in range(len(samples))]
        active = list(range(len(samples)))
        while active:
            drafts = d.propose([states[i] for i in active], k)
            for i, draft in zip(list(active), drafts):
                state, target = states[i], samples[i]
                pos = len(state.committed)
                a = 0
                while a < len(draft) and pos + a < len(target) and draft[a] == target[pos + a]:
                    a += 1
                accepted += a
                steps += 1
                commit(d, state, target[pos:pos + a + 1])
                if len(state.committed) == len(target):
                    d.finish(state)
                    active.remove(i)
    return accepted / steps


def test_acceptance_rises_in_a_second_epoch() -> None:
    rng = random.Random(1234)
    prompts, epoch1 = [], []
    for p in range(5):
        prompts.append([rng.randrange(1000, 2000) for _ in range(24)])
        phrases = [[rng.randrange(100, 1000) for _ in range(rng.randint(3, 6))] for _ in range(6)]
        epoch1.append([_outputs(rng, phrases, 80) for _ in range(4)])  # random but repetitive
    # epoch 2: new seeds, mostly the same outputs (5% of the tokens changed)
    epoch2 = [[[t if rng.random() > 0.05 else rng.randrange(100, 1000) for t in out] for out in samples]
              for samples in epoch1]
    d = SuffixDrafter()
    first = _epoch(d, prompts, epoch1, k=8, tag="e1")
    second = _epoch(d, prompts, epoch2, k=8, tag="e2")
    assert first > 0.5  # the request itself and its siblings already help
    assert second > first + 1.0, (first, second)


# ---------------------------------------------------------------- memory


def test_memory_stays_bounded_and_finish_frees_requests() -> None:
    limits = dict(max_history_per_prompt=3, max_prompts=4, max_history_tokens=500, max_corpus_tokens=300)
    d = SuffixDrafter(**limits)
    rng = random.Random(7)
    prompts = [[rng.randrange(1000, 2000) for _ in range(12)] for _ in range(10)]
    for epoch in range(2):
        for p, prompt in enumerate(prompts):
            states = [started(d, f"{epoch}:{p}#{i}", prompt) for i in range(5)]
            for s in states:
                commit(d, s, [rng.randrange(100, 130) for _ in range(rng.randint(10, 60))])
            in_flight = sum(len(s.committed) for s in states) + len(prompt)
            assert d.memory_tokens() <= limits["max_history_tokens"] + limits["max_corpus_tokens"] + in_flight
            for s in states:
                d.finish(s)
                stats = d.stats()
                assert stats["history_prompts"] <= limits["max_prompts"]
                assert stats["history_tokens"] <= limits["max_history_tokens"]
                assert stats["corpus_tokens"] <= limits["max_corpus_tokens"]
                assert all(d.history_outputs(q) <= limits["max_history_per_prompt"] for q in prompts)
    stats = d.stats()
    assert stats["active_requests"] == 0
    assert stats["prompts"] == stats["history_prompts"] <= limits["max_prompts"]  # no per-request leftovers
    assert d.memory_tokens() == stats["history_tokens"] + stats["corpus_tokens"] > 0
    assert stats["index_entries"] <= d.index_n * d.memory_tokens()


def test_history_and_corpus_can_be_turned_off() -> None:
    d = SuffixDrafter(max_history_per_prompt=0, max_corpus_tokens=0)
    prompt = list(range(10, 20))
    d.finish(started(d, "a", prompt, list(range(100, 130))))
    assert d.memory_tokens() == 0 and d.stats()["prompts"] == 0 and d.stats()["index_entries"] == 0
    assert propose(d, started(d, "b", prompt), 8) == []


def test_store_eviction_leaves_exactly_the_index_of_what_remains() -> None:
    rng = random.Random(3)
    docs = [[rng.randrange(0, 6) for _ in range(rng.randint(1, 30))] for _ in range(12)]
    live = _Store(index_n=3)
    kept: list[list[int]] = []
    for i, doc in enumerate(docs):
        live.add(doc, i % 3, i)
        kept.append((doc, i % 3))
        if i % 2:
            live.evict_oldest()
            kept.pop(0)
    # a store built from the survivors alone, shifted to the same global positions
    fresh = _Store(index_n=3)
    fresh.base = live.base
    for doc, first in kept:
        fresh.add(doc, first, 0)
    as_set = lambda s: {(k, g) for k, v in s.index.items() for g in ([v] if isinstance(v, int) else v)}
    assert fresh.buf == live.buf and fresh.starts == live.starts
    assert as_set(fresh) == as_set(live) and live.tokens == sum(len(doc) for doc, _ in kept)


def test_propose_on_a_worker_thread_while_verdicts_arrive() -> None:
    """The DraftActor proposes on a worker thread while its event loop applies verdicts."""
    d = SuffixDrafter(max_history_per_prompt=2, max_corpus_tokens=200)
    rng = random.Random(5)
    prompts = [[rng.randrange(1000, 1005) for _ in range(8)] for _ in range(3)]
    states = [started(d, f"r{i}", prompts[i % 3]) for i in range(6)]
    errors: list[BaseException] = []
    done = threading.Event()

    def drafting() -> None:
        try:
            while not done.is_set():
                for draft in d.propose(list(states), 6):
                    assert len(draft) <= 6
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=drafting)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so calls interleave
    worker.start()
    try:
        for step in range(1500):
            i = rng.randrange(len(states))
            state = states[i]
            commit(d, state, [rng.randrange(100, 110) for _ in range(rng.randint(1, 4))])
            if len(state.committed) > 40:  # finished: a new sample of the same prompt takes its place
                d.finish(state)
                states[i] = started(d, f"r{i}.{step}", state.prompt_ids)
    finally:
        done.set()
        worker.join()
        sys.setswitchinterval(interval)
    assert not errors, errors
    for state in states:
        d.finish(state)
    stats = d.stats()
    assert stats["active_requests"] == 0 and stats["corpus_tokens"] <= 200
    assert stats["index_entries"] <= d.index_n * d.memory_tokens()


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_match=0), "max_match"),
    (dict(max_match=2.5), "max_match"),
    (dict(max_match=True), "max_match"),
    (dict(index_n=0), "index_n"),
    (dict(index_n=8, max_match=4), "index_n"),
    (dict(min_match=0), "min_match"),
    (dict(min_match=5, max_match=4, index_n=2), "min_match"),
    (dict(alpha=0), "alpha"),
    (dict(alpha=math.nan), "alpha"),
    (dict(min_confidence=1.5), "min_confidence"),
    (dict(min_confidence="high"), "min_confidence"),
    (dict(max_candidates=0), "max_candidates"),
    (dict(max_history_per_prompt=-1), "max_history_per_prompt"),
    (dict(max_prompts=-1), "max_prompts"),
    (dict(max_history_tokens=-1), "max_history_tokens"),
    (dict(max_corpus_tokens=None), "max_corpus_tokens"),
])
def test_bad_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SuffixDrafter(**kwargs)
