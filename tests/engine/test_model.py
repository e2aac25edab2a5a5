"""Model parity with transformers and chunk invariance of the ragged forward."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.engine.kv_cache import KVCache
from specactor.engine.model import CausalLM
from tests.conftest import ours_from_hf, tiny_hf_model

#: Measured max |logit difference| vs transformers (fp32, CPU): tiny models
#: ~2e-7; the default model 5.6e-5 on logits up to ~47 (bench/RESULTS.md, "Engine baselines").
TINY_TOL = 1e-5
DEFAULT_TOL = 2e-3


def _run_chunked(model: CausalLM, seqs: list[list[int]], chunk_plan: list[list[int]]) -> list[torch.Tensor]:
    """Feed each sequence in the given chunk sizes (all rows in one batch per step)."""
    cache = KVCache(model.cfg, len(seqs), 256)
    pos = [0] * len(seqs)
    outs: list[list[torch.Tensor]] = [[] for _ in seqs]
    for sizes in chunk_plan:
        tokens = torch.tensor([t for i, n in enumerate(sizes) for t in seqs[i][pos[i]:pos[i] + n]])
        logits = model(tokens, sizes, cache)
        offset = 0
        for i, n in enumerate(sizes):
            outs[i].append(logits[offset:offset + n])
            offset += n
            pos[i] += n
    return [torch.cat(o) for o in outs]


@st.composite
def ragged_batches(draw):
    """Random batch of sequences and a random chunking of each into steps (mostly decode-like
    single tokens with a few longer chunks, as in verification, or any sizes)."""
    b = draw(st.integers(1, 6))
    steps = draw(st.integers(1, 4))
    size = st.sampled_from([1, 1, 1, 2, 5]) if draw(st.booleans()) else st.integers(1, 6)
    plan = [[draw(size) for _ in range(b)] for _ in range(steps)]
    lengths = [sum(step[i] for step in plan) for i in range(b)]
    seqs = [draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)) for n in lengths]
    return seqs, plan


@settings(max_examples=25, deadline=None)
@given(batch=ragged_batches())
def test_logits_match_transformers_for_any_chunking(tiny_pair, batch) -> None:
    hf, ours = tiny_pair
    seqs, plan = batch
    mine = _run_chunked(ours, seqs, plan)
    with torch.no_grad():
        for seq, got in zip(seqs, mine):
            ref = hf(torch.tensor([seq])).logits[0]
            assert (got - ref).abs().max().item() < TINY_TOL


def test_few_drafting_rows_attend_apart_and_match_transformers(tiny_pair) -> None:
    """When at most half the rows verify drafts, those rows get an attention part of their own
    (the decode rows do not pad to the longest draft); the logits stay those of transformers."""
    from specactor.engine.model import StepLayout

    hf, ours = tiny_pair
    layout = StepLayout.build([1, 6, 1, 1], [10, 12, 8, 9], 2, torch.device("cpu"))
    assert [p.max_q for p in layout.parts] == [1, 6]
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (11, 18, 9, 10)]
    mine = _run_chunked(ours, seqs, [[10, 12, 8, 9], [1, 6, 1, 1]])
    with torch.no_grad():
        for seq, got in zip(seqs, mine):
            assert (got - hf(torch.tensor([seq])).logits[0]).abs().max().item() < TINY_TOL


def test_many_rows_drafting_a_little_pad_with_the_rest_instead() -> None:
    """A part of their own saves the decode rows the padding to the longest draft, but costs its
    rows more than padding does when many rows draft a short way (the cold start's explorations:
    window 1): then every row is padded in one part."""
    from specactor.engine.model import StepLayout

    starts = [100 + i for i in range(32)]

    def parts(q_lens: list[int]) -> list[int]:
        return [p.max_q for p in StepLayout.build(q_lens, starts, 2, torch.device("cpu")).parts]

    assert parts([2] * 16 + [1] * 16) == [2]  # 16 rows, one token each: padded
    assert parts([2] * 2 + [1] * 30) == [1, 2]  # two of them: apart
    assert parts([5] * 8 + [1] * 24) == [1, 5]  # eight rows of four: apart
    assert parts([5] * 16 + [1] * 16) == [5]  # sixteen of them: padded
    assert parts([1] * 32) == [1]


def test_default_model_matches_transformers(default_model) -> None:
    import transformers

    folder, ours, tok = default_model
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a list, with a docstring and two examples of its use."}])
    seqs = [prompt, prompt[:17], prompt[:40]]
    mine = _run_chunked(ours, seqs, [[len(prompt) - 5, 10, 20], [5, 7, 20]])
    with torch.no_grad():
        for seq, got in zip(seqs, mine):
            ref = hf(torch.tensor([seq])).logits[0]
            diff = (got - ref).abs().max().item()
            assert diff < DEFAULT_TOL, diff


def test_chunk_invariance_k_at_once_equals_k_single_steps(tiny_pair) -> None:
    """What verification relies on: k tokens in one forward = k decode steps."""
    _, ours = tiny_pair
    seq = list(range(3, 40))
    at_once = _run_chunked(ours, [seq], [[30], [7]])[0]
    single = _run_chunked(ours, [seq], [[30]] + [[1]] * 7)[0]
    assert (at_once - single).abs().max().item() < TINY_TOL
    assert torch.equal(at_once.argmax(-1), single.argmax(-1))


def test_rollback_is_setting_the_length(tiny_pair) -> None:
    """Rejected draft positions are overwritten after the length is lowered."""
    _, ours = tiny_pair
    cache = KVCache(ours.cfg, 1, 64)
    ours(torch.tensor([5, 6, 7, 8]), [4], cache)
    ours(torch.tensor([100, 101, 102]), [3], cache)  # a "draft" that gets rejected
    cache.lengths[0] -= 3
    after_rollback = ours(torch.tensor([9]), [1], cache)
    fresh = KVCache(ours.cfg, 1, 64)
    ours(torch.tensor([5, 6, 7, 8]), [4], fresh)
    clean = ours(torch.tensor([9]), [1], fresh)
    assert (after_rollback - clean).abs().max().item() < TINY_TOL


def test_kv_cache_memory_is_fixed_and_reported(tiny_pair) -> None:
    _, ours = tiny_pair
    cache = KVCache(ours.cfg, 4, 128)
    assert cache.nbytes == KVCache.bytes_needed(ours.cfg, 4, 128)
    before = cache.k.data_ptr()
    ours(torch.arange(10), [4, 3, 2, 1], cache)
    assert cache.k.data_ptr() == before  # never reallocated
    try:
        ours(torch.arange(200), [200], cache)
    except ValueError as exc:
        assert "exceeds the KV cache length" in str(exc) or "exceed the KV cache" in str(exc)
    else:
        raise AssertionError("overflow was not refused")


def test_attention_never_runs_on_cudnn(monkeypatch) -> None:
    """cuDNN's attention builds a graph for every new shape, and a decode step's key length grows each
    step: on a GPU in bfloat16 that made a step 3.7x slower. The forward keeps it out (on any device;
    the CPU's own kernels are all still allowed)."""
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                     torch.backends.cuda.math_sdp_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    model = ours_from_hf(tiny_hf_model("llama", seed=1))
    cache = KVCache(model.cfg, 2, 32)
    previous = torch.backends.cuda.cudnn_sdp_enabled()  # another library may have turned it off already
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        model(torch.tensor([1, 2, 3, 4, 5]), [3, 2], cache)
        model(torch.tensor([6, 7]), [1, 1], cache)
        assert torch.backends.cuda.cudnn_sdp_enabled()  # the caller's setting is back after the forward
    finally:
        torch.backends.cuda.enable_cudnn_sdp(previous)
    assert seen and all(entry == (False, True, True) for entry in seen)
