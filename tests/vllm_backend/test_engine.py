"""VllmEngine (vLLM verifying, specactor's sampling rule) on the real default model: without
drafts it gives our engine's tokens at T=0 and T=1; with any drafts it gives the same tokens
(a draft token is accepted iff it is the target's own position-keyed sample); aborts, resumes
and weight updates behave as in our engine. The engine is conftest's ``setup``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm", reason="backend vllm: install it with `bash scripts/setup.sh --vllm`")

from specactor.protocol import SamplingParams  # noqa: E402
from specactor.engine.sequence import Sequence
from tests.vllm_backend.engine_runs import run_to_end as _run  # noqa: E402
from tests.vllm_backend.engine_runs import sequences as _seqs  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_without_drafts_the_tokens_are_our_engines(setup, temperature: float) -> None:
    vllm, ours, prompts = setup
    reference = _run(ours, _seqs(prompts, temperature))
    got = _run(vllm, _seqs(prompts, temperature))
    assert [s.output_ids for s in got] == [s.output_ids for s in reference]
    assert [s.finish_reason for s in got] == [s.finish_reason for s in reference]
    for a, b in zip(got, reference):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-3


def test_greedy_tokens_with_drafts_are_stock_vllms_without_speculation(setup, session_cache, monkeypatch) -> None:
    """At T=0 specactor-on-vLLM, drafts and all, gives the tokens of stock vLLM 0.32 run without
    speculation (its own sampler, in its own unpatched process: bench/vllm_backend.py's ``vllm``
    mode, run as that script runs it, specactor.bench.vllm_compare.run_stock) on four HumanEval
    prompts x 128 tokens: the patch changes nothing greedy decoding picks, and verifying drafts
    does not move vLLM's numerics onto other tokens."""
    from specactor.bench.vllm_compare import Workload, prompt_ids, run_stock
    from tests.vllm_backend.engine_runs import ngram_drafts

    vllm, _, _ = setup
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))  # the stock process finds the converted model
    workload = Workload(prompts=4, n=1, max_tokens=128, temperature=0.0, unseeded=False, dtype="float32")
    stock = run_stock("vllm", workload)["token_ids"]
    prompts, _ = prompt_ids(workload.prompts)
    seqs = [Sequence(f"p{i}#0", prompt, SamplingParams(temperature=0.0, max_tokens=128), seed=i)
            for i, prompt in enumerate(prompts)]
    got = _run(vllm, seqs, ngram_drafts)
    assert sum(s.accepted for s in got) > 0  # drafts were verified, and some accepted
    assert {s.request_id: s.output_ids for s in got} == stock


def test_the_scheduler_is_found_only_where_the_patch_put_it() -> None:
    """VllmEngine reaches vLLM's scheduler through the patch module: an engine core in another
    process, or an engine built without specactor's scheduler, is an error saying what to change."""
    from types import SimpleNamespace

    from specactor.vllm_backend.patch import SpecActorScheduler

    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        SpecActorScheduler.of(SimpleNamespace(engine_core=SimpleNamespace()))
    stock = SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=object())))
    with pytest.raises(RuntimeError, match="scheduler is object, not SpecActorScheduler"):
        SpecActorScheduler.of(stock)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=st.sampled_from([0.0, 1.0]), seed=st.integers(0, 2**31),
       garbage=st.lists(st.integers(0, 49151), min_size=1, max_size=4), truth_share=st.floats(0, 1))
def test_any_drafts_give_the_tokens_without_drafts(setup, temperature, seed, garbage, truth_share) -> None:
    """Drafts mixing the true continuation (accepted) with anything else (rejected) never change
    a token: the rule holds for all inputs, not only for good drafters."""
    vllm, ours, prompts = setup
    plain = {s.request_id: s.output_ids for s in _run(vllm, _seqs(prompts, temperature, 24, seed))}

    def drafter(seq: Sequence) -> list[int]:
        n = len(seq.output_ids)
        truth = plain[seq.request_id][n:n + 4]
        keep = int(len(truth) * truth_share)
        return truth[:keep] + garbage[: 4 - keep]

    got = _run(vllm, _seqs(prompts, temperature, 24, seed), drafter)
    assert {s.request_id: s.output_ids for s in got} == plain


def test_the_true_continuation_is_accepted_whole(setup) -> None:
    vllm, ours, prompts = setup
    plain = {s.request_id: s.output_ids for s in _run(vllm, _seqs(prompts, 1.0, 40))}
    got = _run(vllm, _seqs(prompts, 1.0, 40),
               lambda s: plain[s.request_id][len(s.output_ids):len(s.output_ids) + 4])
    assert {s.request_id: s.output_ids for s in got} == plain
    assert all(s.drafted > 0 and s.accepted == s.drafted for s in got)
    assert all(s.steps <= len(s.output_ids) // 4 + 2 for s in got)  # five tokens a step


def test_a_resumed_request_goes_on_as_if_never_stopped(setup) -> None:
    vllm, ours, prompts = setup
    whole = _run(vllm, _seqs(prompts, 1.0, 40))
    resumed = _seqs(prompts, 1.0, 40)
    for seq, done in zip(resumed, whole):
        seq.output_ids, seq.logprobs = done.output_ids[:13], done.logprobs[:13]
    _run(vllm, resumed)
    assert [s.output_ids for s in resumed] == [s.output_ids for s in whole]


def test_an_aborted_request_is_gone_and_the_others_finish(setup) -> None:
    vllm, ours, prompts = setup
    seqs = _seqs(prompts, 1.0, 40)
    for seq in seqs:
        vllm.add(seq)
    for _ in range(3):
        vllm.step()
    aborted = vllm.abort("r1")
    assert aborted is seqs[1] and aborted.finish_reason == "abort" and vllm.abort("r1") is None
    while vllm.has_work:
        vllm.step()
    assert len(seqs[0].output_ids) == len(seqs[2].output_ids) == 40
    assert 0 < len(seqs[1].output_ids) < 40


def test_a_weight_update_changes_the_tokens_as_it_changes_ours(setup, default_model) -> None:
    import torch

    from specactor.weight_update import read_checkpoint

    vllm, ours, prompts = setup
    before = [s.output_ids for s in _run(vllm, _seqs(prompts, 0.0, 24))]
    original = read_checkpoint(default_model[0])
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    try:
        vllm.model.load_hf_state_dict(perturbed)
        ours.model.load_hf_state_dict(perturbed)
        after = [s.output_ids for s in _run(vllm, _seqs(prompts, 0.0, 24))]
        reference = [s.output_ids for s in _run(ours, _seqs(prompts, 0.0, 24))]
    finally:
        vllm.model.load_hf_state_dict(original)
        ours.model.load_hf_state_dict(original)
    assert after == reference and after != before
    assert [s.output_ids for s in _run(vllm, _seqs(prompts, 0.0, 24))] == before  # the old weights are back


def test_a_group_s_samples_share_their_prompt_through_vllm_s_prefix_cache(setup) -> None:
    """GRPO's n samples of a prompt: vLLM computes the prompt's full cache blocks once (its
    prefix cache, on by default as with specactor's own engine), every sample still samples
    from its own seed, and the tokens are our engine's."""
    vllm, ours, _ = setup
    prompt = list(range(1000, 1000 + 300))  # no other test's prompt: nothing of it is cached yet
    params = dict(temperature=1.0, max_tokens=12)
    group = [Sequence(f"g#{s}", list(prompt), SamplingParams(**params), seed=40 + s) for s in range(4)]
    fed = 0
    for seq in group:
        vllm.add(seq)
    while vllm.has_work:
        fed += vllm.step().prefill_tokens
    block = vllm.llm.engine_core.engine_core.vllm_config.cache_config.block_size
    cached = (len(prompt) - 1) // block * block  # full blocks, short of the last token
    assert cached > 0 and fed == len(prompt) + 3 * (len(prompt) - cached)
    reference = _run(ours, [Sequence(f"g#{s}", list(prompt), SamplingParams(**params), seed=40 + s) for s in range(4)])
    assert [s.output_ids for s in group] == [s.output_ids for s in reference]


def test_run_serves_to_the_end_and_reports_every_step_as_our_engine_does(setup) -> None:
    """``run(seqs, on_step=)``, the baseline loop benches use, works on vLLM as on our engine: the
    same tokens, a report per step, the prompts' prefill in the first."""
    vllm, ours, prompts = setup
    reports = {"vllm": [], "ours": []}
    got = vllm.run(_seqs(prompts, 1.0, 16, seed=70), on_step=reports["vllm"].append)
    reference = ours.run(_seqs(prompts, 1.0, 16, seed=70), on_step=reports["ours"].append)
    assert not vllm.has_work
    assert [s.output_ids for s in got] == [s.output_ids for s in reference]
    for name, steps in reports.items():
        assert steps[0].prefill_tokens > 0, name
        assert sum(r.new_tokens for r in steps) == sum(len(s.output_ids) for s in got), name
        # what the policy's closed-batch check is told: each request's limit, not greedy, none waiting
        assert all(v.max_tokens == 16 and not v.greedy for r in steps for v in r.verdicts), name
        assert all(r.waiting == 0 for r in steps), name
