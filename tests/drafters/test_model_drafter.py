"""ModelDrafter: shared noise, rollback, batching/slot compaction, errors, the default int8 drafter."""

from __future__ import annotations

import pytest
import torch

from specactor.drafters.base import DraftState
from specactor.drafters.model import (DEFAULT_CPU_QUANT, Int8WeightLinear, ModelDrafter, as_draft_model,
                                      default_model_drafter, default_quant)
from specactor.prompts import humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from tests.conftest import ours_from_hf, tiny_hf_model


@pytest.fixture(scope="module")
def tiny():
    return ours_from_hf(tiny_hf_model("llama", seed=2))


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


def _target(model, prompts, temperature, seeds, max_tokens=24) -> list[list[int]]:
    engine = Engine(model, max_batch=len(prompts), max_len=256)
    seqs = engine.run(Sequence(f"r{i}", p, SamplingParams(temperature=temperature, max_tokens=max_tokens), seed=s)
                      for i, (p, s) in enumerate(zip(prompts, seeds)))
    return [s.output_ids for s in seqs]


def _states(prompts, temperature, seeds) -> list[DraftState]:
    return [DraftState(f"r{i}", list(p), seed=s, temperature=temperature)
            for i, (p, s) in enumerate(zip(prompts, seeds))]


def _draft_ahead(drafter, states, k, rounds) -> None:
    """Propose ``rounds`` times, each continuing the lookahead (no verdicts)."""
    for _ in range(rounds):
        for s, d in zip(states, drafter.propose(states, k)):
            assert len(d) == k
            s.lookahead.extend(d)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_perfect_drafter_with_shared_noise_matches_the_target(tiny, temperature) -> None:
    prompts, seeds = _prompts([3, 17, 40]), [11, 2**62 + 5, 0]
    expected = _target(tiny, prompts, temperature, seeds)
    drafter = ModelDrafter(tiny, max_slots=4, max_len=256)
    states = _states(prompts, temperature, seeds)
    for s in states:
        drafter.start(s)
    _draft_ahead(drafter, states, k=4, rounds=6)
    assert [s.lookahead for s in states] == expected
    for s in states:
        drafter.finish(s)
    assert drafter.active == 0
    # and when every proposal is verified and committed (coupled mode)
    states = [DraftState(f"c{i}", list(p), seed=s, temperature=temperature)
              for i, (p, s) in enumerate(zip(prompts, seeds))]
    for s in states:
        drafter.start(s)
    for _ in range(8):
        for s, d, ref in zip(states, drafter.propose(states, 3), expected):
            s.lookahead.extend(d)
            verdict = ref[len(s.committed):len(s.committed) + 3]
            assert s.observe(len(s.committed), verdict)
            drafter.observe(s, len(s.committed) - len(verdict), verdict)
    assert [s.committed for s in states] == expected


def test_argmax_drafts_the_mode_and_misses_samples(tiny) -> None:
    prompts, seeds = _prompts([5, 9, 30, 12]), [1, 2, 3, 4]
    expected = _target(tiny, prompts, 1.0, seeds)
    drafter = ModelDrafter(tiny, max_slots=4, max_len=256, noise="argmax")
    states = _states(prompts, 1.0, seeds)
    for s in states:
        drafter.start(s)
    _draft_ahead(drafter, states, k=4, rounds=6)
    drafted = [s.lookahead for s in states]
    assert drafted != expected
    hits = sum(a == b for d, e in zip(drafted, expected) for a, b in zip(d, e))
    assert hits < len(prompts) * 24 // 2
    # what it drafts is the greedy continuation, whatever the temperature
    assert drafted == _target(tiny, prompts, 0.0, seeds)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollback_equals_a_fresh_drafter(tiny, temperature) -> None:
    prompt = _prompts([20])[0]
    drafter = ModelDrafter(tiny, max_slots=2, max_len=256)
    state = DraftState("a", list(prompt), seed=9, temperature=temperature)
    drafter.start(state)
    first = drafter.propose([state], 4)[0]
    state.lookahead.extend(first)
    # accept two, then a token contradicting the third: the lookahead is discarded
    wrong = (first[2] + 1) % 256
    assert not state.observe(0, first[:2] + [wrong])
    drafter.observe(state, 0, first[:2] + [wrong])
    assert state.lookahead == []
    again = drafter.propose([state], 4)[0]
    fresh = ModelDrafter(tiny, max_slots=1, max_len=256)
    ref = DraftState("a", list(prompt), committed=first[:2] + [wrong], seed=9, temperature=temperature)
    fresh.start(ref)
    assert again == fresh.propose([ref], 4)[0]
    # a verdict contradicting the very first token, after drafting far ahead
    state.lookahead.extend(again)
    state.lookahead.extend(drafter.propose([state], 4)[0])
    wrong = (state.lookahead[0] + 7) % 256
    state.observe(3, [wrong])
    ref.committed.append(wrong)
    assert drafter.propose([state], 5)[0] == fresh.propose([ref], 5)[0]


def test_batched_subsets_and_slot_compaction_match_single_requests(tiny) -> None:
    prompts = _prompts([2, 31, 7, 18, 50], seed=4)
    temps = [1.0, 0.0, 0.7, 1.0, 1.0]
    batched = ModelDrafter(tiny, max_slots=5, max_len=256)
    states = [DraftState(f"r{i}", list(p), seed=100 + i, temperature=t)
              for i, (p, t) in enumerate(zip(prompts, temps))]
    alone_drafters = [ModelDrafter(tiny, max_slots=1, max_len=256) for _ in prompts]
    alone_states = [DraftState(s.request_id, list(s.prompt_ids), seed=s.seed, temperature=s.temperature)
                    for s in states]
    for d, s, a in zip(alone_drafters, states, alone_states):
        batched.start(s)
        d.start(a)

    def check(indices: list[int], k: int) -> None:
        together = batched.propose([states[i] for i in indices], k)
        for i, got in zip(indices, together):
            assert got == alone_drafters[i].propose([alone_states[i]], k)[0], (i, indices)
            states[i].lookahead.extend(got)
            alone_states[i].lookahead.extend(got)

    def verdict(i: int, tokens: list[int]) -> None:
        for s, d in ((states[i], batched), (alone_states[i], alone_drafters[i])):
            start = len(s.committed)
            s.observe(start, tokens)
            d.observe(s, start, tokens)

    check([0, 1, 2, 3, 4], 4)
    verdict(0, states[0].lookahead[:2] + [3])  # partial accept, rollback
    verdict(1, states[1].lookahead[:4])  # all accepted
    verdict(3, [(states[3].lookahead[0] + 1) % 256])  # nothing accepted
    check([0, 1, 2, 3, 4], 3)
    check([3, 0], 2)  # a subset, out of order
    check([4, 2, 1], 3)
    batched.finish(states[1])  # frees a slot in the middle: the last one moves into it
    alone_drafters[1].finish(alone_states[1])
    assert batched.active == 4
    verdict(4, states[4].lookahead[:1])
    check([0, 2, 3, 4], 4)
    batched.finish(states[0])
    check([4, 3, 2], 2)
    with pytest.raises(KeyError, match="r1"):
        batched.propose([states[1]], 2)


def test_proposals_shrink_near_max_len(tiny) -> None:
    drafter = ModelDrafter(tiny, max_slots=2, max_len=32)
    near = DraftState("near", _prompts([30])[0], seed=1)
    far = DraftState("far", _prompts([10])[0], seed=2)
    for s in (near, far):
        drafter.start(s)
    got = drafter.propose([near, far], 5)
    assert [len(g) for g in got] == [3, 5]  # the last forward feeds token k-2 at position len + k - 2
    alone = ModelDrafter(tiny, max_slots=1, max_len=64)
    ref = DraftState("far", list(far.prompt_ids), seed=2)
    alone.start(ref)
    assert alone.propose([ref], 5)[0] == got[1]


def test_clear_errors(tiny) -> None:
    drafter = ModelDrafter(tiny, max_slots=2, max_len=16)
    with pytest.raises(ValueError, match="outside the draft model's vocabulary .size 256"):
        drafter.start(DraftState("v", [1, 2, 300]))
    ok = DraftState("ok", [1, 2, 3])
    drafter.start(ok)
    ok.committed.extend([5, 999])  # a target with a bigger vocabulary committed a token
    with pytest.raises(ValueError, match="token id 999 is outside"):
        drafter.propose([ok], 2)
    with pytest.raises(ValueError, match="longer than the drafter's max_len 16"):
        drafter.start(DraftState("long", list(range(17))))
    drafter.start(DraftState("b", [4]))
    with pytest.raises(RuntimeError, match="max_slots 2"):
        drafter.start(DraftState("c", [4]))
    with pytest.raises(ValueError, match="already started"):
        drafter.start(DraftState("b", [4]))
    ok.committed[:] = list(range(14))
    with pytest.raises(ValueError, match="context of 17 tokens is longer"):
        drafter.propose([ok], 2)
    with pytest.raises(ValueError, match="noise"):
        ModelDrafter(tiny, noise="gumbel")


def test_the_int8_drafter_drafts_humaneval(default_model) -> None:
    folder, target, tok = default_model
    prompt = tok.apply_chat_template([{"role": "user", "content": humaneval_prompts(1)[0].text}])
    drafter = default_model_drafter(folder, quant="int8w", max_slots=2, max_len=1024)
    assert drafter.name == "model"
    assert isinstance(drafter.model.layers[0].qkv, Int8WeightLinear)
    assert isinstance(drafter.model.lm_head, Int8WeightLinear)
    expected = Engine(target, max_batch=1, max_len=1024).run(
        [Sequence("h", prompt, SamplingParams(temperature=0.0, max_tokens=8), seed=3)])[0].output_ids
    state = DraftState("h", prompt, seed=3, temperature=0.0)
    drafter.start(state)
    draft = drafter.propose([state], 8)[0]
    assert len(draft) == 8 and all(0 <= t < target.cfg.vocab_size for t in draft)
    assert draft[:4] == expected[:4]  # greedy int8 agrees with fp32 at the start of a reply


def test_the_default_copy_is_llama_cpps_8_bit_one_where_it_is_installed_else_int8w_said_once(
        default_model, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import specactor.drafters.llama_cpp_copy as llama_copy
    import specactor.drafters.model as model_module

    folder = default_model[0]
    assert default_quant(folder, "cuda") == "bf16"
    if llama_copy.llama_cpp_available():
        assert default_quant(folder) == DEFAULT_CPU_QUANT == "llama-q8_0"
    monkeypatch.setattr(llama_copy, "llama_cpp_available", lambda: False)
    monkeypatch.setattr(model_module, "_warned_fallback", False)
    with pytest.warns(UserWarning, match="llama.cpp's binding is not installed"):
        assert default_quant(folder) == "int8w"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second time is silent
        assert default_quant(folder) == "int8w"


def test_a_model_without_a_gguf_layout_drafts_with_int8w_saying_why(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import specactor.drafters.llama_cpp_copy as llama_copy
    import specactor.drafters.model as model_module

    hf = tiny_hf_model("llama", seed=2)
    hf.config.attention_bias = True  # llama with attention biases: no GGUF layout here
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    monkeypatch.setattr(llama_copy, "llama_cpp_available", lambda: True)
    monkeypatch.setattr(model_module, "_warned_fallback", False)
    with pytest.warns(UserWarning, match="attention biases"):
        assert default_quant(tmp_path) == "int8w"


def test_a_copy_replaying_its_steps_as_graphs_drafts_what_it_drafts_eagerly() -> None:
    """On a GPU the copy's steps replay CUDA graphs (its steps are bound by kernel launches, as the
    verifier's are); on a CPU the same padded step runs uncaptured: the drafts are the eager ones,
    through a rollback and a weight update (which makes the graphs again)."""
    hf = tiny_hf_model("llama", seed=4)
    eager = ModelDrafter(ours_from_hf(hf), max_slots=3, max_len=64)
    graphed = ModelDrafter(ours_from_hf(hf), max_slots=3, max_len=64, cuda_graphs=True)
    assert graphed.graphs is not None and not graphed.graphs.capture and eager.graphs is None

    def states() -> list[DraftState]:
        return [DraftState("a", [1, 5, 9, 30], seed=3, temperature=1.0),
                DraftState("b", [2, 200, 17, 45, 61, 99, 3], committed=[40, 41], seed=4, temperature=1.0),
                DraftState("c", [7], seed=5, temperature=0.0)]

    a, b = states(), states()
    for drafter, ss in ((eager, a), (graphed, b)):
        for s in ss:
            drafter.start(s)
    assert graphed.propose(b, 6) == eager.propose(a, 6)
    for ss in (a, b):
        ss[1].committed += [9, 9]  # a verdict the drafts did not foresee: rolled back
    assert graphed.propose(b, 5) == eager.propose(a, 5)
    assert graphed.graphs.eager_steps > 0  # the graphed path ran
    update = tiny_hf_model("llama", seed=8).state_dict()
    eager.load_weights(update)
    graphed.load_weights(update)
    assert graphed.propose(b, 4) == eager.propose(a, 4)


def test_a_4_bit_copy_computes_its_dequantised_weights_and_follows_an_update() -> None:
    """``int4w``: weights in groups of 32, 4 bits, on torch's int4 kernel; the layer is the
    dequantised matrix (up to bf16 rounding), quantising loses less than a group's step, and the
    copy drafts and takes a weight update like the others."""
    from specactor.drafters.int4_weights import Int4WeightLinear, _quantize

    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 64, bias=True)
    layer = Int4WeightLinear(linear)
    q, sz = _quantize(linear.weight.detach().float(), 32)
    scale, zero = sz[..., 0].T.repeat_interleave(32, dim=1), sz[..., 1].T.repeat_interleave(32, dim=1)
    dequantised = (q.float() - 8) * scale + zero
    assert (dequantised - linear.weight).abs().max() <= scale.max() / 2 + 1e-6
    x = torch.randn(3, 128)
    expected = x @ dequantised.T + linear.bias
    assert torch.allclose(layer(x).float(), expected, atol=0.05, rtol=0.02)
    with pytest.raises(ValueError, match="divisible"):
        Int4WeightLinear(torch.nn.Linear(48, 64))

    hf = tiny_hf_model("llama", seed=6)
    drafter = ModelDrafter(as_draft_model(ours_from_hf(hf), "int4w"), max_slots=2, max_len=64, quant="int4w")
    assert isinstance(drafter.model.layers[0].qkv, Int4WeightLinear)
    state = DraftState("a", [1, 5, 9, 30], seed=3, temperature=1.0)
    drafter.start(state)
    assert len(drafter.propose([state], 4)[0]) == 4
    drafter.load_weights(tiny_hf_model("llama", seed=9).state_dict())
    assert isinstance(drafter.model.layers[0].qkv, Int4WeightLinear)
    assert len(drafter.propose([state], 4)[0]) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("quant", ["int8w", "int4w"])
def test_a_cuda_copy_replays_graphs_and_drafts_what_the_cpu_copy_drafts(quant: str) -> None:
    """On a GPU the torch copy's weights run on the GPU kernels (int8: _weight_int8pack_mm; int4:
    tinygemm) and its steps replay CUDA graphs; its greedy drafts are the CPU copy's (a bf16 near
    tie may flip one)."""
    hf = tiny_hf_model("llama", seed=7)
    cpu = ModelDrafter(as_draft_model(ours_from_hf(hf), quant), max_slots=2, max_len=64, quant=quant)
    gpu = ModelDrafter(as_draft_model(ours_from_hf(hf), quant).to("cuda"), max_slots=2, max_len=64, quant=quant)
    assert gpu.graphs is not None and gpu.graphs.capture
    states = {d: [DraftState("a", [1, 5, 9, 30], seed=3, temperature=0.0),
                  DraftState("b", [2, 200, 17, 45, 61], seed=4, temperature=0.0)] for d in ("cpu", "gpu")}
    for drafter, key in ((cpu, "cpu"), (gpu, "gpu")):
        for s in states[key]:
            drafter.start(s)
    got, expected = gpu.propose(states["gpu"], 6), cpu.propose(states["cpu"], 6)
    same = sum(a == b for x, y in zip(got, expected) for a, b in zip(x, y))
    assert same >= 11, (got, expected)
    assert gpu.graphs.replays > 0
