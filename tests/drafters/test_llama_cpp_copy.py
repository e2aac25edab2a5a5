"""The quantised copy of the target drafting on llama.cpp: it samples what the target samples
(the same noise), batched over requests of different lengths, rolls back to any context,
follows a weight update, and on the default model at 8 bits is right on >= 90% of T=1 positions.
Skipped where llama.cpp's binding is not installed (``bash scripts/setup.sh --llama-cpp``)."""

from __future__ import annotations

import pytest
import torch

from specactor.drafters.base import DraftState
from specactor.drafters.model import ModelDrafter
from specactor.engine.config import ModelConfig
from tests.conftest import ours_from_hf, tiny_hf_model

pytest.importorskip("llama_cpp", reason="llama.cpp's binding is not installed")

from specactor.drafters.llama_cpp_copy import LlamaCppDrafter  # noqa: E402


def _state(rid: str, prompt: list[int], committed: list[int] = (), *, temperature: float = 1.0,
           seed: int = 7) -> DraftState:
    state = DraftState(request_id=rid, prompt_ids=list(prompt), temperature=temperature, seed=seed)
    state.committed = list(committed)
    return state


@pytest.fixture(scope="module")
def tiny():
    hf = tiny_hf_model("llama", seed=11)
    return ModelConfig.from_hf(hf.config.to_dict()), hf.state_dict(), ours_from_hf(hf)


def _states() -> list[DraftState]:
    return [_state("a", [1, 5, 9, 30], temperature=1.0, seed=3),
            _state("b", [2, 200, 17, 45, 61, 99, 3, 8, 12], [40, 41], temperature=1.0, seed=4),
            _state("c", [7], temperature=0.0, seed=5)]


def test_a_float32_copy_drafts_what_the_target_itself_samples(tiny) -> None:
    """Same weights, same noise: the torch target drafting for itself and llama.cpp's copy agree."""
    cfg, state, ours = tiny
    copy = LlamaCppDrafter(cfg, state, max_slots=4, max_len=64, quant="f32", threads=1)
    target = ModelDrafter(ours, max_slots=4, max_len=64)
    states = _states()
    for s in states:
        copy.start(s)
        target.start(s)
    drafted, expected = copy.propose(states, 8), target.propose(states, 8)
    same = sum(a == b for x, y in zip(drafted, expected) for a, b in zip(x, y))
    assert [len(d) for d in drafted] == [8, 8, 8]
    assert same >= 23, (drafted, expected)  # a float near-tie may flip one token in 24


def test_batched_drafting_is_each_request_drafted_alone(tiny) -> None:
    cfg, state, _ = tiny
    together = LlamaCppDrafter(cfg, state, max_slots=4, max_len=64, threads=1)
    states = _states()
    for s in states:
        together.start(s)
    batched = together.propose(states, 6)
    for i, s in enumerate(_states()):
        alone = LlamaCppDrafter(cfg, state, max_slots=1, max_len=64, threads=1)
        alone.start(s)
        assert alone.propose([s], 6) == [batched[i]], s.request_id
        alone.close()


def test_a_rolled_back_request_drafts_as_if_it_had_never_gone_ahead(tiny) -> None:
    cfg, state, _ = tiny
    drafter = LlamaCppDrafter(cfg, state, max_slots=2, max_len=64, threads=1)
    s = _state("r", [3, 4, 5, 6, 7])
    drafter.start(s)
    first = drafter.propose([s], 5)[0]
    s.lookahead = first[:3]  # drafted ahead on its own drafts ...
    drafter.propose([s], 4)
    s.lookahead = []  # ... then a verdict contradicted them: back to the committed tokens
    s.committed = [first[0], (first[1] + 1) % cfg.vocab_size]
    fresh = LlamaCppDrafter(cfg, state, max_slots=1, max_len=64, threads=1)
    fresh.start(s)
    assert drafter.propose([s], 5) == fresh.propose([s], 5)
    drafter.finish(s)
    assert drafter.active == 0
    drafter.start(s)  # its sequence is free again, and empty
    assert drafter.propose([s], 5) == fresh.propose([s], 5)


def test_after_a_weight_update_it_drafts_with_the_new_weights(tiny) -> None:
    cfg, state, _ = tiny
    drafter = LlamaCppDrafter(cfg, state, max_slots=4, max_len=64, threads=1)
    states = _states()
    for s in states:
        drafter.start(s)
    before = drafter.propose(states, 8)
    gen = torch.Generator().manual_seed(0)
    updated = {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in state.items()}
    drafter.load_weights(updated)
    after = drafter.propose(states, 8)
    fresh = LlamaCppDrafter(cfg, updated, max_slots=4, max_len=64, threads=1)
    for s in states:
        fresh.start(s)
    assert after == fresh.propose(states, 8) and drafter.version == 1
    assert after != before  # the old copy would have drafted otherwise
    misshapen = dict(updated, **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(3,\)"):
        drafter.load_weights(misshapen)
    assert drafter.version == 1 and drafter.propose(states, 8) == after  # the copy it had, unchanged


def test_bad_requests_are_refused_by_name_and_change_nothing(tiny) -> None:
    cfg, state, _ = tiny
    with pytest.raises(ValueError, match="'q3'"):
        LlamaCppDrafter(cfg, state, quant="q3")
    drafter = LlamaCppDrafter(cfg, state, max_slots=1, max_len=16, threads=1)
    with pytest.raises(KeyError, match="'x'"):
        drafter.propose([_state("x", [1, 2])], 2)
    with pytest.raises(ValueError, match="longer than the drafter's max_len 16"):
        drafter.start(_state("long", list(range(1, 20))))
    with pytest.raises(ValueError, match="token id 999"):
        drafter.start(_state("oov", [1, 999]))
    ok = _state("ok", [1, 2, 3])
    drafter.start(ok)
    with pytest.raises(RuntimeError, match="full"):
        drafter.start(_state("more", [1]))
    assert len(drafter.propose([ok], 20)[0]) == 14  # up to max_len, no further
    with pytest.raises(ValueError, match="same request twice"):
        drafter.propose([ok, ok], 2)


@pytest.mark.slow
def test_the_default_models_8_bit_copy_is_right_on_nine_positions_in_ten_at_t1(default_model) -> None:
    """Teacher-forced on a T=1 rollout of the real model: at each output position the copy,
    drawing with the target's noise, samples the token the target sampled."""
    from specactor.engine.llm_engine import Engine
    from specactor.engine.sequence import sample_sequences
    from specactor.protocol import SamplingParams

    folder, model, tok = default_model
    prompts = [tok.encode(p) for p in ("def fibonacci(n):", "Write a haiku about the sea.")]
    seqs = sample_sequences(prompts, SamplingParams(temperature=1.0, max_tokens=48, seed=1), ["p0", "p1"])
    Engine(model, max_batch=4, max_len=256).run(seqs)
    drafter = LlamaCppDrafter.from_folder(folder, max_slots=2, max_len=256, quant="q8_0")
    right = total = 0
    for seq in seqs:
        state = _state(seq.request_id, seq.prompt_ids, temperature=1.0, seed=seq.seed)
        drafter.start(state)
        for t, token in enumerate(seq.output_ids):
            state.committed = seq.output_ids[:t]
            right += drafter.propose([state], 1)[0] == [token]
            total += 1
        drafter.finish(state)
    assert total >= 60 and right / total >= 0.9, (right, total)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_a_rollout_drafted_by_the_llama_cpp_copy_is_the_autoregressive_one(
        tiny_checkpoint, session_cache, monkeypatch, temperature) -> None:
    """``draft_quant="llama-q8_0"``: the model drafter's process drafts on llama.cpp; its drafts are
    accepted, and every sample is what plain decoding gives."""
    from specactor.config import EngineConfig
    from specactor.protocol import SamplingParams
    from specactor.rollout_engine import RolloutEngine

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts, ids = [[1, 30, 31, 32, 33], [1, 40, 41]], ["a", "b"]
    params = SamplingParams(temperature=temperature, max_tokens=40, seed=9, n=2)
    common = dict(model=str(tiny_checkpoint), max_batch=8, max_len=256, transport="ipc", processes=True)
    async with RolloutEngine(EngineConfig(mode="autoregressive", **common)) as engine:
        plain = {r.request_id: r.token_ids for r in await engine.generate(prompts, params, request_ids=ids)}
    config = EngineConfig(mode="coupled", drafters=["model"], draft_quant="llama-q8_0", **common)
    async with RolloutEngine(config) as engine:
        results = await engine.generate(prompts, params, request_ids=ids)
    assert {r.request_id: r.token_ids for r in results} == plain
    accepted = sum(r.stats.accepted for r in results)
    drafted = sum(r.stats.drafted for r in results)
    assert drafted > 0 and accepted / drafted > 0.8, (accepted, drafted)  # the copy is the target, at 8 bits


def test_the_model_method_builds_the_copy_asked_for_or_says_why_not(tiny_checkpoint, monkeypatch) -> None:
    import specactor.drafters.llama_cpp_copy as copy_module
    from specactor.config import EngineConfig
    from specactor.drafters.model import default_model_drafter

    assert isinstance(default_model_drafter(tiny_checkpoint, quant="llama-q4_0", max_slots=2, max_len=64),
                      LlamaCppDrafter)
    monkeypatch.setattr(copy_module, "llama_cpp_available", lambda: False)
    with pytest.warns(UserWarning, match="llama-q8_0 needs llama.cpp's binding.*int8w"):
        fallback = default_model_drafter(tiny_checkpoint, quant="llama-q8_0", max_slots=2, max_len=64)
    assert isinstance(fallback, ModelDrafter) and fallback.quant == "int8w"
    with pytest.raises(ValueError, match="draft_quant 'q5'"):
        EngineConfig(draft_quant="q5").check()
    with pytest.raises(ValueError, match="llama-q8_0 runs on llama.cpp's CPU kernels"):
        EngineConfig(draft_quant="llama-q8_0", device="cuda").check()


def test_one_token_decodes_give_the_logits_one_batched_decode_gives(tiny) -> None:
    """Below ``split_below`` tokens a decode runs a token at a time (llama.cpp's one-row kernels
    beat its batched 8-bit one there): the same logits either way."""
    cfg, state, _ = tiny
    drafter = LlamaCppDrafter(cfg, state, max_slots=4, max_len=64, quant="f32", threads=1)
    assert drafter.split_below >= 0
    feeds = [(0, 0, 0, [1, 5, 9, 30]), (1, 1, 0, [2, 200]), (2, 2, 0, [7])]
    batched = drafter._decode(feeds, 3, split=False)
    for seq in range(3):
        drafter.lib.llama_memory_seq_rm(drafter.lib.llama_get_memory(drafter._ctx), seq, -1, -1)
    drafter.split_below = 100
    split = drafter._decode(feeds, 3)
    assert torch.allclose(batched, split, atol=1e-3), (batched - split).abs().max()


def test_a_prefilled_request_drafts_what_one_fed_with_its_proposal_drafts(tiny) -> None:
    """A decoupled drafter feeds a new request's context apart (then catches up with the verdicts
    that came meanwhile): what it then drafts is what a single proposal would have drafted."""
    cfg, state, _ = tiny
    fed, direct = (LlamaCppDrafter(cfg, state, max_slots=2, max_len=64, threads=1) for _ in range(2))
    s = _state("r", list(range(3, 40)), [41, 42])
    fed.start(s)
    direct.start(s)
    assert fed.cold(s) == len(s.context())
    fed.prefill([s])
    assert fed.cold(s) == 1  # the last token is fed by the proposal, which needs its logits
    s.committed += [43, 44, 45]  # verdicts that came while it fed
    assert fed.cold(s) == 4
    assert fed.propose([s], 6) == direct.propose([s], 6)
