"""The autoregressive engine: parity with transformers, invariances, stops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specactor.prompts import humaneval_prompts
from specactor.protocol import FinishReason, SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from tests.conftest import ours_from_hf, tiny_hf_model


def _seq(rid: str, prompt: list[int], temperature: float = 0.0, max_tokens: int = 16, seed: int = 0,
         **params) -> Sequence:
    return Sequence(rid, prompt, SamplingParams(temperature=temperature, max_tokens=max_tokens, **params), seed=seed)


def _humaneval_ids(tok, count: int) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(count)]


def test_greedy_matches_transformers_generate_on_humaneval(default_model) -> None:
    import transformers

    folder, model, tok = default_model
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = _humaneval_ids(tok, 3)
    engine = Engine(model, max_batch=3, max_len=1024)
    seqs = engine.run(_seq(f"h{i}", p, max_tokens=48) for i, p in enumerate(prompts))
    for seq, prompt in zip(seqs, prompts):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False, eos_token_id=None,
                          pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        assert seq.output_ids == ref[0, len(prompt):].tolist(), seq.request_id


def test_batch_invariance_tiny_model_is_exact() -> None:
    model = ours_from_hf(tiny_hf_model("llama", seed=3))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(2, 60, (32,), generator=g)]
    together = Engine(model, max_batch=32, max_len=128).run(
        _seq(f"r{i}", p, temperature=1.0, max_tokens=24, seed=i) for i, p in enumerate(prompts))
    for i in range(0, 32, 3):
        alone = Engine(model, max_batch=1, max_len=128).run([_seq("x", prompts[i], 1.0, 24, seed=i)])[0]
        assert alone.output_ids == together[i].output_ids
        assert alone.logprobs == pytest.approx(together[i].logprobs, abs=1e-5)


def test_stop_conditions_and_finish_reasons() -> None:
    model = ours_from_hf(tiny_hf_model("qwen2", seed=1))
    prompt = [5, 6, 7, 8]
    free = Engine(model, max_batch=1, max_len=64).run([_seq("a", prompt, max_tokens=12)])[0]
    assert free.finish_reason == FinishReason.LENGTH and len(free.output_ids) == 12
    stop_at = free.output_ids[4]
    first = free.output_ids.index(stop_at)
    by_stop_id = Engine(model, max_batch=1, max_len=64).run(
        [_seq("b", prompt, max_tokens=12, stop_token_ids=[stop_at])])[0]
    assert by_stop_id.finish_reason == FinishReason.STOP
    assert by_stop_id.output_ids == free.output_ids[: first + 1]  # stop token included
    by_eos = Engine(model, max_batch=1, max_len=64, eos_token_ids=[stop_at]).run([_seq("c", prompt, max_tokens=12)])[0]
    assert by_eos.output_ids == by_stop_id.output_ids and by_eos.finish_reason == FinishReason.STOP
    assert len(by_eos.logprobs) == len(by_eos.output_ids)


def test_abort_and_bad_requests() -> None:
    model = ours_from_hf(tiny_hf_model("llama"))
    engine = Engine(model, max_batch=2, max_len=32)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add(_seq("v", [1, 999]))
    with pytest.raises(ValueError, match="exceeds the context"):
        engine.add(_seq("l", [1] * 20, max_tokens=20))
    with pytest.raises(ValueError, match="empty"):
        engine.add(_seq("e", []))
    with pytest.raises(ValueError, match="temperature"):
        engine.add(_seq("t", [1], temperature=-1))
    a, b, c = _seq("a", [1, 2], max_tokens=10), _seq("b", [3], max_tokens=10), _seq("c", [4], max_tokens=10)
    for s in (a, b, c):
        engine.add(s)
    engine.step()
    assert engine.abort("a") is a and a.finish_reason == FinishReason.ABORT
    assert engine.abort("c") is c  # still waiting
    while engine.has_work:
        engine.step()
    assert b.finish_reason == FinishReason.LENGTH and len(b.output_ids) == 10
    # the survivor's tokens are unaffected by the abort (slot compaction)
    alone = Engine(model, max_batch=1, max_len=32).run([_seq("b", [3], max_tokens=10)])[0]
    assert alone.output_ids == b.output_ids


def test_continuous_batching_admits_more_requests_than_slots() -> None:
    model = ours_from_hf(tiny_hf_model("llama"))
    prompts = [[i + 1, i + 2] for i in range(7)]
    lens = [3, 9, 1, 5, 12, 2, 7]
    batched = Engine(model, max_batch=3, max_len=32).run(
        _seq(f"r{i}", p, temperature=0.7, max_tokens=n, seed=i) for i, (p, n) in enumerate(zip(prompts, lens)))
    for i, (p, n) in enumerate(zip(prompts, lens)):
        alone = Engine(model, max_batch=1, max_len=32).run([_seq("x", p, 0.7, n, seed=i)])[0]
        assert alone.output_ids == batched[i].output_ids
        assert len(batched[i].output_ids) == n


_RESUME_MODEL: list = []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(1, 23), temperature=st.sampled_from([0.0, 0.7, 1.0]), seed=st.integers(0, 2**32),
       others=st.integers(0, 2))
def test_a_request_resumed_from_its_committed_tokens_goes_on_exactly_as_before(cut: int, temperature: float,
                                                                               seed: int, others: int) -> None:
    """What a restarted verifier does: prefill prompt + the first ``cut`` committed tokens (and their
    log-probs), then go on; the rest is token- and log-prob-identical to the undisturbed run, whatever
    else runs beside it."""
    if not _RESUME_MODEL:
        _RESUME_MODEL.append(ours_from_hf(tiny_hf_model("llama", seed=4)))
    model = _RESUME_MODEL[0]
    params = SamplingParams(temperature=temperature, max_tokens=24)
    prompt = [3, 1, 4, 1, 5]
    (ref,) = Engine(model, max_batch=1, max_len=64).run([Sequence("r", prompt, params, seed=seed)])
    if ref.finished and len(ref.output_ids) <= cut:
        cut = len(ref.output_ids) - 1
    if cut < 1:
        return
    resumed = Sequence("r", prompt, params, seed=seed, output_ids=ref.output_ids[:cut], logprobs=ref.logprobs[:cut])
    company = [Sequence(f"o{i}", [7, 8, 9 + i], params, seed=i) for i in range(others)]
    Engine(model, max_batch=3, max_len=64).run(company + [resumed])
    assert resumed.output_ids == ref.output_ids and resumed.finish_reason == ref.finish_reason
    assert resumed.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_a_resumed_request_that_had_finished_already_is_refused_by_name() -> None:
    model = ours_from_hf(tiny_hf_model("llama"))
    engine = Engine(model, max_batch=1, max_len=64, eos_token_ids=[2])
    params = SamplingParams(temperature=1.0, max_tokens=4)
    with pytest.raises(ValueError, match="finished already"):
        engine.add(Sequence("done", [5, 6], params, seed=1, output_ids=[7, 2], logprobs=[-1.0, -1.0]))
    with pytest.raises(ValueError, match="finished already"):
        engine.add(Sequence("full", [5, 6], params, seed=1, output_ids=[7, 8, 9, 10], logprobs=[-1.0] * 4))
    with pytest.raises(ValueError, match="log-probs"):
        engine.add(Sequence("odd", [5, 6], params, seed=1, output_ids=[7, 8], logprobs=[-1.0]))


_SHARE_MODEL: list = []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.lists(st.tuples(st.integers(2, 30), st.integers(1, 4)), min_size=1, max_size=5),
       temperature=st.sampled_from([0.0, 1.0]), max_batch=st.integers(2, 12), budget=st.sampled_from([16, 4096]),
       seed=st.integers(0, 2**31))
def test_a_group_s_samples_share_one_prefill_and_give_the_tokens_each_would_alone(
        groups: list[tuple[int, int]], temperature: float, max_batch: int, budget: int, seed: int) -> None:
    """GRPO's n samples of a prompt: one is prefilled, the others copy its cached prompt and feed its
    last token. Their tokens are the ones a prefill of their own gives, whatever the slots and the
    prefill budget; no sample waits forever for a slot; and with room for every sample at once, a
    group's prompt is fed once."""
    if not _SHARE_MODEL:
        _SHARE_MODEL.append(ours_from_hf(tiny_hf_model("llama", seed=5)))
    model = _SHARE_MODEL[0]
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (length,), generator=g).tolist() for length, _ in groups]

    def run(share: bool) -> tuple[list[Sequence], int]:
        engine = Engine(model, max_batch=max_batch, max_len=64, max_prefill_tokens=budget, share_prompts=share)
        seqs = [_seq(f"p{i}#{s}", prompt, temperature, max_tokens=12, seed=seed + 7 * i + s)
                for i, (prompt, (_, n)) in enumerate(zip(prompts, groups)) for s in range(n)]
        fed = 0
        for seq in seqs:
            engine.add(seq)
        while engine.has_work:
            fed += engine.step().prefill_tokens
        return seqs, fed

    (shared, fed_shared), (plain, fed_plain) = run(True), run(False)
    for a, b in zip(shared, plain):
        assert a.output_ids == b.output_ids, a.request_id
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.finish_reason == FinishReason.LENGTH
    assert fed_plain == sum(len(p) * n for p, (_, n) in zip(prompts, groups))
    assert fed_shared <= fed_plain
    if max_batch >= len(shared) and budget >= fed_plain:
        assert fed_shared == sum(len(p) for p in {tuple(p): p for p in prompts}.values())  # once per prompt


def test_only_fresh_samples_share_a_prompt_and_a_shared_one_feeds_its_last_token() -> None:
    """A resumed request (committed tokens to prefill again) never copies a sibling's prompt; a fresh
    sample of a running request's prompt feeds one token, its first step computing its first output."""
    model = ours_from_hf(tiny_hf_model("llama", seed=6))
    prompt = [9, 8, 7, 6, 5]
    engine = Engine(model, max_batch=4, max_len=64)
    leader = _seq("a", prompt, 1.0, 8, seed=1)
    engine.add(leader)
    first = engine.step()
    assert first.prefill_tokens == len(prompt)
    follower = _seq("b", prompt, 1.0, 8, seed=2)
    resumed = Sequence("c", prompt, SamplingParams(temperature=1.0, max_tokens=8), seed=3,
                       output_ids=[4], logprobs=[-1.0])
    engine.add(follower)
    engine.add(resumed)
    second = engine.step()
    assert second.prefill_tokens == len(prompt) + 1  # the resumed one's prompt and output; the follower none
    assert len(follower.output_ids) == 1 and engine.cache.lengths[1] == len(prompt)
    while engine.has_work:
        engine.step()
    alone = Engine(model, max_batch=1, max_len=64).run([_seq("b", prompt, 1.0, 8, seed=2)])[0]
    assert follower.output_ids == alone.output_ids
    with pytest.raises(ValueError, match="cannot share"):
        engine.cache.copy_prefix(0, 1, 3)  # an empty slot has nothing to share


def test_a_warm_up_leaves_the_engine_as_it_was() -> None:
    """Engine.warm_up (run before serving on a GPU) serves its throwaway requests to the end: the
    engine is idle afterwards, and what it serves next is what a fresh engine serves."""
    model = ours_from_hf(tiny_hf_model("llama", seed=5))
    params = SamplingParams(temperature=1.0, max_tokens=12)

    def serve(engine: Engine) -> list[list[int]]:
        seqs = [Sequence(f"r{i}", [3 + i, 5, 7, 9], params, seed=i) for i in range(3)]
        return [s.output_ids for s in engine.run(seqs)]

    fresh = serve(Engine(model, max_batch=4, max_len=96))
    warmed = Engine(model, max_batch=4, max_len=96)
    assert warmed.warm_up(prompt_len=200) > 0  # longer than the cache: cut to fit
    assert warmed.steps >= 2 and not warmed.has_work and not warmed.running  # a prefill, then a decode step
    assert Engine(model, max_batch=2, max_len=2).warm_up() == 0.0  # no room for a prompt and its tokens
    tiny = Engine(model, max_batch=2, max_len=3)
    assert tiny.warm_up() > 0 and not tiny.has_work
    assert serve(warmed) == fresh
    warmed.add(Sequence("busy", [1, 2], params, seed=0))
    with pytest.raises(RuntimeError, match="idle engine"):
        warmed.warm_up()


def test_a_step_tells_the_policy_each_request_s_limit_whether_it_is_greedy_and_how_many_wait() -> None:
    """What the closed-batch check needs (specactor/policy/makespan.py): max_tokens, temperature 0, and
    the requests waiting for a slot (while any do, the batch is not closed)."""
    engine = Engine(ours_from_hf(tiny_hf_model("qwen2", seed=1)), max_batch=2, max_len=64)
    engine.add(_seq("greedy", [5, 6, 7], max_tokens=9))
    engine.add(_seq("sampled", [5, 6, 8], temperature=1.0, max_tokens=30, seed=3))
    engine.add(_seq("queued", [5, 6, 9], max_tokens=4))  # no slot for it yet
    report = engine.step()
    verdicts = {v.request_id: v for v in report.verdicts}
    assert (verdicts["greedy"].max_tokens, verdicts["greedy"].greedy) == (9, True)
    assert (verdicts["sampled"].max_tokens, verdicts["sampled"].greedy) == (30, False)
    assert report.waiting == 1 and "queued" not in verdicts
