"""The learned drafter: silent until trained, learns what the rollouts say, follows weight
updates, keeps its data bounded, and never changes the output."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from specactor.drafters.base import DraftState
from specactor.drafters.learned import LearnedDrafter, RolloutBuffer, build_student, frequent_vocab
from specactor.protocol import SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.verifier.verify_loop import Verifier
from tests.conftest import ours_from_hf, tiny_hf_model


@pytest.fixture(scope="module")
def target():
    return ours_from_hf(tiny_hf_model("llama", seed=5, vocab=256))


def _pattern(length: int, offset: int = 0) -> list[int]:
    """A deterministic sequence the student can learn: a repeating 7-token cycle."""
    return [10 + (offset + i) % 7 for i in range(length)]


def test_an_untrained_drafter_proposes_nothing(target) -> None:
    drafter = LearnedDrafter(target, layers=1, vocab=64, max_slots=4, max_len=128)
    state = DraftState("r", [1, 2, 3], seed=1, temperature=1.0)
    drafter.start(state)
    assert drafter.propose([state], 4) == [[]]


def test_training_on_rollouts_makes_it_predict_them(target) -> None:
    drafter = LearnedDrafter(target, layers=1, vocab=64, max_slots=4, max_len=256, epochs=30, lr=3e-3,
                             max_train_s=None)
    for i in range(6):
        drafter.add_rollout([1, 2, 3 + i], _pattern(60, offset=i))
    report = drafter.train()
    assert report is not None and report.loss_last < report.loss_first / 2
    assert drafter.train() is None  # nothing new to learn from
    state = DraftState("r", [1, 2, 9], committed=_pattern(20, offset=3), seed=4, temperature=0.0)
    drafter.start(state)
    draft = drafter.propose([state], 4)[0]
    assert draft == _pattern(24, offset=3)[20:]
    assert set(draft) <= set(drafter.model.vocab.tolist())


def test_a_weight_update_takes_the_new_embedding_and_trains_only_on_rollouts_it_has_not_seen(target) -> None:
    """It trained while the verifier was idle (the RL step that made the update): the update
    then only swaps the embedding in, instead of holding the next rollout up with a second round
    on the same data. Rollouts that came after its last round are trained on at the update."""
    drafter = LearnedDrafter(target, layers=1, vocab=64, max_slots=4, max_len=256, epochs=1, max_train_s=None)
    drafter.add_rollout([1, 2], _pattern(30))
    drafter.train()
    state = {"model.embed_tokens.weight": target.embed.weight.detach() + 1.0}
    drafter.load_weights(state)
    assert len(drafter.reports) == 1
    assert torch.equal(drafter.student.embed.weight, state["model.embed_tokens.weight"])
    assert torch.equal(drafter.model.embed.weight, state["model.embed_tokens.weight"])  # the drafting copy too
    drafter.add_rollout([1, 3], _pattern(30, offset=2))
    drafter.load_weights({"model.embed_tokens.weight": target.embed.weight.detach()})
    assert len(drafter.reports) == 2 and not drafter.has_new_rollouts
    with pytest.raises(ValueError, match="embedding of shape"):
        drafter.load_weights({"model.embed_tokens.weight": torch.zeros(3, 3)})
    with pytest.raises(KeyError):
        drafter.load_weights({})


def test_the_rollout_buffer_keeps_the_newest_within_its_bound() -> None:
    buffer = RolloutBuffer(max_tokens=100)
    for i in range(10):
        buffer.add([1] * 5, [i] * 15)
    assert buffer.tokens <= 100 and len(buffer) == 5
    assert [o[0] for _, o in buffer.samples] == [5, 6, 7, 8, 9]
    assert frequent_vocab(buffer, 3, always=[2]) == sorted({2, *frequent_vocab(buffer, 3, always=[2])})
    assert len(frequent_vocab(buffer, 3, always=[2])) == 3


def test_the_student_starts_as_the_targets_first_layers(target) -> None:
    student = build_student(target, layers=1, vocab=list(range(256)))
    tokens = torch.tensor([1, 5, 9, 30])
    from specactor.engine.kv_cache import KVCache

    first = copy.deepcopy(target)
    first.layers = first.layers[:1]
    expected = first(tokens, [4], KVCache(first.cfg, 1, 16))
    torch.testing.assert_close(student(tokens, [4], KVCache(student.cfg, 1, 16)), expected)
    with pytest.raises(ValueError, match="layers"):
        build_student(target, layers=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_its_drafts_never_change_the_output(target, temperature: float) -> None:
    """Verified drafts of a (trained, imperfect) learned drafter leave every token as autoregressive's."""
    drafter = LearnedDrafter(target, layers=1, vocab=128, max_slots=8, max_len=256, epochs=3, max_train_s=None)
    reference = Engine(copy.deepcopy(target), max_batch=4, max_len=200)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    params = SamplingParams(temperature=temperature, max_tokens=40)
    plain = reference.run([Sequence(f"r{i}", p, params, seed=i) for i, p in enumerate(prompts)])
    for seq in plain:
        drafter.add_rollout(seq.prompt_ids, seq.output_ids)
    drafter.train()
    verifier = Verifier(Engine(copy.deepcopy(target), max_batch=4, max_len=200), default_window=4)
    seqs = [Sequence(f"r{i}", p, params, seed=i) for i, p in enumerate(prompts)]
    states = {}
    for seq in seqs:
        verifier.add(seq)
        states[seq.request_id] = DraftState(seq.request_id, seq.prompt_ids, seed=seq.seed, temperature=temperature)
        drafter.start(states[seq.request_id])
    drafted = 0
    while verifier.has_work:
        live = [states[s.request_id] for s in verifier.engine.running]
        for state in live:
            state.committed = list(verifier.sequences[state.request_id].output_ids)
            state.lookahead = []
        for state, tokens in zip(live, drafter.propose(live, 4) if live else []):
            verifier.add_draft(state.request_id, "learned", len(state.committed), tokens)
            drafted += len(tokens)
        verifier.step()
    assert drafted > 0
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**62), position=st.integers(0, 5000), temperature=st.sampled_from([0.0, 0.7, 1.0]),
       kept=st.integers(2, 200))
def test_sampling_over_its_vocabulary_is_the_targets_rule_restricted_to_it(target, seed, position, temperature,
                                                                          kept) -> None:
    """The drafter's token is what the target's sampler picks when every other token is ruled out."""
    from specactor.engine.sampler import SamplingBatch, sample

    drafter = LearnedDrafter(target, layers=1, vocab=256, max_slots=2, max_len=64)
    generator = torch.Generator().manual_seed(seed % 1000)
    vocab = torch.randperm(256, generator=generator)[:kept].sort().values
    drafter.model.vocab = vocab
    logits = torch.randn(2, kept, generator=generator)
    states = [DraftState("a", [1], seed=seed, temperature=temperature),
              DraftState("b", [1], seed=seed + 1, temperature=temperature)]
    full = torch.full((2, 256), float("-inf"))
    full[:, vocab] = logits
    expected, _ = sample(full, SamplingBatch.build([(temperature, 0, 1.0, s.seed, position) for s in states]))
    assert drafter._sample(logits, states, [position, position]) == expected.tolist()


def test_a_training_round_cut_short_is_not_swapped_in_and_the_next_one_takes_its_samples(target) -> None:
    """Idle training stops when a rollout begins: drafting keeps the last complete student."""
    drafter = LearnedDrafter(target, layers=1, vocab=64, max_slots=4, max_len=256, epochs=30, lr=3e-3,
                             max_train_s=None)
    for i in range(6):
        drafter.add_rollout([1, 2, 3 + i], _pattern(60, offset=i))
    asked = []
    before = {k: v.clone() for k, v in drafter.student.state_dict().items()}
    report = drafter.train(should_stop=lambda: asked.append(1) or len(asked) >= 2)
    assert report is not None and report.interrupted and report.epochs == 0
    after = drafter.student.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert len(asked) == 2  # asked after every sample, stopped at the second
    assert not drafter.trained and drafter.has_new_rollouts
    state = DraftState("r", [1, 2, 9], committed=_pattern(20, offset=3), seed=4, temperature=0.0)
    drafter.start(state)
    assert drafter.propose([state], 4) == [[]]  # still the untrained student: proposes nothing
    report = drafter.train()
    assert report is not None and not report.interrupted and report.epochs == 30
    assert drafter.trained and not drafter.has_new_rollouts
    assert drafter.propose([state], 4) == [_pattern(24, offset=3)[20:]]
