"""Losslessness (README, "lossless"): whatever the drafts, the tokens are the
autoregressive ones. Hypothesis drives adversarial drafters against the verifier."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specactor.protocol import SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.verifier.verify_loop import Verifier
from tests.conftest import TEST_DEVICE, ours_from_hf, tiny_hf_model

VOCAB = 256
BEHAVIOURS = ["perfect", "wrong", "random", "empty", "too_long", "stale_ok", "stale_bad", "future", "silent",
              "perfect_prefix"]


@functools.lru_cache(maxsize=None)
def _model(kind: str):
    return ours_from_hf(tiny_hf_model(kind, seed=5, vocab=VOCAB)).to(TEST_DEVICE)


def _sequences(prompts, params, seeds):
    return [Sequence(f"r{i}", p, params, seed=s) for i, (p, s) in enumerate(zip(prompts, seeds))]


def _reference(model, prompts, params, seeds):
    engine = Engine(model, max_batch=len(prompts), max_len=128)
    return engine.run(_sequences(prompts, params, seeds))


@st.composite
def cases(draw):
    n = draw(st.integers(1, 3))
    prompts = [draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)) for _ in range(n)]
    seeds = [draw(st.integers(0, 2**63 - 1)) for _ in range(n)]
    params = SamplingParams(
        temperature=draw(st.sampled_from([0.0, 0.7, 1.0])),
        top_k=draw(st.sampled_from([0, 5])),
        top_p=draw(st.sampled_from([1.0, 0.9])),
        max_tokens=draw(st.integers(1, 24)),
    )
    window = draw(st.integers(1, 6))
    plan = draw(st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=40))
    kind = draw(st.sampled_from(["llama", "qwen2"]))
    max_batch = draw(st.integers(1, 3))
    return kind, prompts, seeds, params, window, plan, max_batch, draw(st.randoms(use_true_random=False))


def _draft(behaviour: str, ref: list[int], done: int, window: int, rnd) -> tuple[int, list[int]] | None:
    """A draft (start, tokens) for a request that has committed ``done`` output tokens."""
    k = rnd.randint(1, window)
    if behaviour == "perfect":
        return done, ref[done:done + k]
    if behaviour == "perfect_prefix":
        good = ref[done:done + k]
        cut = rnd.randint(0, len(good))
        return done, good[:cut] + [(t + 1) % VOCAB for t in good[cut:]]
    if behaviour == "wrong":
        return done, [(t + 1) % VOCAB for t in ref[done:done + k]] or [0]
    if behaviour == "random":
        return done, [rnd.randrange(VOCAB) for _ in range(k)]
    if behaviour == "empty":
        return done, []
    if behaviour == "too_long":
        return done, ref[done:done + window + 10] + [rnd.randrange(VOCAB) for _ in range(5)]
    if behaviour == "stale_ok":  # drafted before the last tokens were committed, consistent
        back = min(done, rnd.randint(1, 3))
        return done - back, ref[done - back:done + k]
    if behaviour == "stale_bad":  # drafted from a different past
        back = min(done, rnd.randint(1, 3))
        return done - back, [(t + 1) % VOCAB for t in ref[done - back:done]] + ref[done:done + k]
    if behaviour == "future":  # drafted past an unverified lookahead
        return done + rnd.randint(1, 3), ref[done + 1:done + 1 + k]
    return None  # silent: a slow drafter


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_any_drafts_give_the_autoregressive_tokens(case) -> None:
    plan = case[5]
    _run_case(case, lambda step: [plan[step % len(plan)]])


def _run_case(case, behaviours, race: list[str] | None = None) -> None:
    """Verify the case's requests with the drafts of ``behaviours(step)`` (all of
    ``race`` as one token tree, if given) and compare with autoregressive."""
    kind, prompts, seeds, params, window, _, max_batch, rnd = case
    model = _model(kind)
    reference = _reference(model, prompts, params, seeds)
    verifier = Verifier(Engine(model, max_batch=max_batch, max_len=128), default_window=window)
    seqs = _sequences(prompts, params, seeds)
    for seq in seqs:
        verifier.add(seq)
        if race:
            verifier.assign(seq.request_id, race, window, race=True)
    _drive(verifier, reference, window, rnd, behaviours)
    _assert_autoregressive(seqs, reference)


def _drive(verifier, reference, window, rnd, behaviours) -> None:
    """Step to the end; before each step every running request gets a draft from
    each drafter ``behaviours(step)`` names (a drafter is named by its behaviour)."""
    step = 0
    while verifier.has_work:
        for seq in verifier.engine.running:
            ref = reference[int(seq.request_id[1:])].output_ids
            for behaviour in behaviours(step):
                draft = _draft(behaviour, ref, len(seq.output_ids), window, rnd)
                if draft is not None:
                    verifier.add_draft(seq.request_id, behaviour, *draft)
        verifier.step()
        step += 1
        assert step < 500


def _assert_autoregressive(seqs, reference) -> None:
    for seq, ref in zip(seqs, reference):
        assert seq.output_ids == ref.output_ids
        assert seq.finish_reason == ref.finish_reason
        assert seq.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_perfect_drafts_cut_the_number_of_steps() -> None:
    """Not just lossless: accepted drafts must actually save verify steps."""
    model = _model("llama")
    params = SamplingParams(temperature=1.0, max_tokens=40)
    prompts, seeds = [[1, 2, 3], [4, 5]], [11, 12]
    reference = _reference(model, prompts, params, seeds)
    verifier = Verifier(Engine(model, max_batch=2, max_len=128), default_window=4)
    for seq in _sequences(prompts, params, seeds):
        verifier.add(seq)
    steps = 0
    while verifier.has_work:
        for seq in verifier.engine.running:
            ref = reference[int(seq.request_id[1:])].output_ids
            verifier.add_draft(seq.request_id, "perfect", len(seq.output_ids), ref[len(seq.output_ids):][:4])
        verifier.step()
        steps += 1
    assert steps <= 1 + 40 // 5 + 1  # prefill + 5 tokens per step


def test_awaiting_drafts_is_the_coupled_barrier() -> None:
    model = _model("llama")
    verifier = Verifier(Engine(model, max_batch=2, max_len=64), default_window=3)
    a = Sequence("a", [1, 2], SamplingParams(temperature=0, max_tokens=8), seed=0)
    verifier.add(a)
    assert verifier.awaiting_drafts() == []  # waiting for prefill, no draft needed
    verifier.step()
    assert verifier.awaiting_drafts() == ["a"]
    verifier.add_draft("a", "ngram", len(a.output_ids), [])  # "no draft" is an answer too
    assert verifier.awaiting_drafts() == []
    with pytest.raises(ValueError, match="duplicate"):
        verifier.add(Sequence("a", [1], SamplingParams(), seed=0))
    assert verifier.add_draft("nobody", "x", 0, [1]) is False


def test_a_partly_rejected_draft_leaves_the_request_awaiting_a_new_one() -> None:
    """A draft that reached past the output but was rejected part-way continues a future that did
    not happen: the coupled barrier must wait for the drafter's next draft, not step without one."""
    model = _model("llama")
    params = SamplingParams(temperature=1.0, max_tokens=30)
    reference = _reference(model, [[1, 2]], params, [7])[0].output_ids
    verifier = Verifier(Engine(model, max_batch=1, max_len=64), default_window=4)
    a = Sequence("r0", [1, 2], params, seed=7)
    verifier.add(a)
    verifier.step()  # prefill
    n = len(a.output_ids)
    wrong = (reference[n + 1] + 1) % VOCAB
    verifier.add_draft("r0", "model", n, [reference[n], wrong, 3, 4])  # right, then wrong
    assert verifier.awaiting_drafts() == []
    report = verifier.step()
    assert report.verdicts[0].accepted == 1 and len(a.output_ids) == n + 2
    assert verifier.awaiting_drafts() == ["r0"]  # the old draft reaches past n + 2 but is dead
    verifier.add_draft("r0", "model", n + 2, reference[n + 2:n + 4])
    assert verifier.awaiting_drafts() == []
    verifier.step()
    assert a.output_ids == reference[:n + 5]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), racers=st.lists(st.sampled_from(BEHAVIOURS), min_size=2, max_size=4, unique=True))
def test_racing_drafts_verified_as_a_tree_give_the_autoregressive_tokens(case, racers) -> None:
    """Fastest-of-N tail racing: several methods' drafts for one request go into
    one token tree; whichever survives, the tokens and log-probs are unchanged."""
    _run_case(case, lambda step: racers, race=racers)


def test_racing_keeps_the_longest_accepted_draft_even_when_it_is_not_first() -> None:
    """The right draft comes second, so its accepted path must be compacted in
    the KV cache; the scores say what each method would have had accepted."""
    model = _model("qwen2")
    params = SamplingParams(temperature=1.0, max_tokens=40)
    prompts, seeds = [[1, 2, 3], [7, 8, 9, 10]], [21, 22]
    reference = _reference(model, prompts, params, seeds)
    verifier = Verifier(Engine(model, max_batch=2, max_len=128), default_window=4)
    seqs = _sequences(prompts, params, seeds)
    for seq in seqs:
        verifier.add(seq)
        verifier.assign(seq.request_id, ["wrong", "perfect"], 4, race=True)
    steps = 0
    winners = []
    while verifier.has_work:
        for seq in verifier.engine.running:
            ref = reference[int(seq.request_id[1:])].output_ids
            good = ref[len(seq.output_ids):][:4]
            verifier.add_draft(seq.request_id, "wrong", len(seq.output_ids), [(t + 1) % VOCAB for t in good])
            verifier.add_draft(seq.request_id, "perfect", len(seq.output_ids), good)
        report = verifier.step()
        winners += [(v.method, v.scores) for v in report.verdicts if v.scores]
        steps += 1
    for seq, ref in zip(seqs, reference):
        assert seq.output_ids == ref.output_ids
        assert seq.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
    assert steps <= 1 + 40 // 5 + 1  # as fast as the perfect drafter alone
    assert winners and all(method == "perfect" and scores["wrong"][1] == 0 for method, scores in winners)
    assert seqs[0].per_method["perfect"]["accepted"] > 0 and seqs[0].per_method["wrong"]["accepted"] == 0


def _shadowed(max_tokens: int, seed: int) -> tuple[Verifier, Sequence, list[int]]:
    """One T=1 request shadow-scored (window 0) for methods "right" and "wrong", and its reference output."""
    model = _model("llama")
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    prompts, seeds = [[4, 5, 6]], [seed]
    reference = _reference(model, prompts, params, seeds)[0].output_ids
    verifier = Verifier(Engine(model, max_batch=1, max_len=64), default_window=4)
    (seq,) = _sequences(prompts, params, seeds)
    verifier.add(seq)
    verifier.assign(seq.request_id, ["right", "wrong"], 0)
    return verifier, seq, reference


def test_a_shadowed_request_is_scored_but_never_verified() -> None:
    """Window 0 with methods assigned (the policy's shadowing): every step advances one token,
    as plain decoding does, yet each method's draft is scored against the committed token:
    a right draft as accepted, a wrong one as rejected, and a right one the step could not
    check beyond its first token not as a rejection (censored)."""
    verifier, seq, reference = _shadowed(max_tokens=12, seed=9)
    scores = []
    while verifier.has_work:
        done = len(seq.output_ids)
        if done:  # past the prefill
            good = reference[done:done + 4]
            verifier.add_draft(seq.request_id, "right", done, good)
            verifier.add_draft(seq.request_id, "wrong", done, [(t + 1) % VOCAB for t in good])
        report = verifier.step()
        (verdict,) = report.verdicts
        assert len(verdict.tokens) == 1 and verdict.drafted == 0  # nothing verified
        if verdict.scores:
            scores.append(verdict.scores)
    assert seq.output_ids == reference
    assert len(scores) == len(reference) - 1
    assert all(s["right"] == [1, 1] for s in scores)  # checked one token, right: no rejection
    assert all(s["wrong"][0] >= 1 and s["wrong"][1] == 0 for s in scores)  # wrong at once: a rejection
    assert not seq.per_method  # scores are not verified drafts: the request's own stats stay empty


def test_a_shadowed_requests_late_draft_is_scored_on_the_tokens_committed_before_it_arrived() -> None:
    """A shadow draft reaches the verifier a step or more after the output passed its start. Its
    passed part counts: a wrong one is a rejection (dropping it unscored counted a lookup's runs
    and not its misses), a right one counts every token it got right, once."""
    verifier, seq, reference = _shadowed(max_tokens=16, seed=3)
    totals = {"right": [0, 0], "wrong": [0, 0]}
    late = 0
    while verifier.has_work:
        done = len(seq.output_ids)
        if done >= 3 and done % 4 == 0:  # drafted from two tokens ago, 6 tokens long
            good = reference[done - 2:done + 4]
            verifier.add_draft(seq.request_id, "right", done - 2, good)
            verifier.add_draft(seq.request_id, "wrong", done - 2, [(t + 1) % VOCAB for t in good])
            late += 1
        report = verifier.step()
        for method, (drafted, accepted) in report.verdicts[0].scores.items():
            totals[method][0] += drafted
            totals[method][1] += accepted
    assert seq.output_ids == reference
    assert late >= 3
    assert totals["wrong"] == [late, 0]  # each a rejection at its first token, which was already committed
    assert totals["right"][0] == totals["right"][1] >= 3 * (late - 1)  # its passed tokens and this step's
