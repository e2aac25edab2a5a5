"""The padded step that CUDA graphs capture, run without capture on the CPU: it must give the eager
step's logits and cache, and an engine that takes it must give the same tokens (the GPU's capture
itself is tested in test_cuda.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specactor.protocol import SamplingParams
from specactor.engine.cuda_graphs import CHUNK_BUCKETS, GraphedSteps, bucket, padded_forward
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.engine.kv_cache import KVCache
from tests.conftest import ours_from_hf, tiny_hf_model

VOCAB = 256


@pytest.fixture(scope="module")
def model():
    return ours_from_hf(tiny_hf_model("llama", seed=3, vocab=VOCAB))


def _prompts(count: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (int(n),), generator=g).tolist()
            for n in torch.randint(2, 40, (count,), generator=g)]


def test_buckets_take_the_smallest_that_holds() -> None:
    assert [bucket(v, CHUNK_BUCKETS) for v in (1, 2, 3, 4, 5, 6, 17, 18)] == [1, 2, 3, 5, 5, 9, 17, None]


def test_the_padded_step_gives_the_eager_steps_logits_and_cache(model) -> None:
    """Rows at different lengths feeding 1 or 3 tokens, padded to 3 and to 5 rows."""
    prompts = _prompts(3, seed=1)
    eager = KVCache(model.cfg, 5, 96)
    padded = KVCache(model.cfg, 5, 96)
    for cache in (eager, padded):  # both prefilled the same (eager) way
        model(torch.tensor([t for p in prompts for t in p]), [len(p) for p in prompts], cache)
    chunks = [[7], [8, 9, 10], [11, 12]]
    starts = list(eager.lengths[:3])
    want = model(torch.tensor([t for c in chunks for t in c]), [len(c) for c in chunks], eager)
    tokens = torch.zeros(5 * 3, dtype=torch.long)
    for r, c in enumerate(chunks):
        tokens[r * 3: r * 3 + len(c)] = torch.tensor(c)
    got = padded_forward(model, tokens, torch.tensor(starts + [0, 0]), padded, 3)
    flat = [r * 3 + j for r, c in enumerate(chunks) for j in range(len(c))]
    torch.testing.assert_close(got[flat], want, rtol=1e-5, atol=1e-5)
    for r, c in enumerate(chunks):  # the valid positions of every real row are the eager ones
        n = starts[r] + len(c)
        torch.testing.assert_close(padded.k[:, r, :, :n], eager.k[:, r, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(padded.v[:, r, :, :n], eager.v[:, r, :, :n], rtol=1e-5, atol=1e-5)


def test_steps_that_cannot_be_padded_run_eagerly(model) -> None:
    graphs = GraphedSteps(model, KVCache(model.cfg, 6, 64), capture=False)
    assert graphs.batches == (1, 2, 4, 6)
    assert graphs.shape([1, 1, 1], [10, 20, 30]) == (4, 1)
    assert graphs.shape([1, 5, 2], [10, 20, 30]) == (4, 5)
    assert graphs.shape([18], [0]) is None  # a prompt longer than the longest chunk: eager
    assert graphs.shape([1, 3], [10, 62]) is None  # row 2's padded chunk would pass the cache's end
    assert graphs.shape([1, 1], [10, 63]) == (2, 1)
    small = GraphedSteps(model, KVCache(model.cfg, 6, 64), capture=False, max_tokens=8)
    assert small.shape([1] * 6, [5] * 6) == (6, 1)
    assert small.shape([2] * 6, [5] * 6) is None  # 6 rows x 2 positions: more than 8, eager
    assert small.shape([2, 1, 1, 1], [5] * 4) == (4, 2)


def test_every_shape_writes_its_logits_into_one_shared_buffer(model) -> None:
    """A buffer per captured shape would hold rows x vocab floats dozens of times over."""
    graphs = GraphedSteps(model, KVCache(model.cfg, 4, 64), capture=False, max_tokens=12)
    cache = graphs.cache
    for rows in ([[1, 2, 3]], [[4], [5]], [[6, 7], [8], [9, 10, 11]]):
        starts = list(cache.lengths[: len(rows)])
        shape = graphs.shape([len(r) for r in rows], starts)
        assert shape is not None
        graphs.run(rows, list(range(sum(map(len, rows)))), shape)
    assert len(graphs.graphs) == 3
    assert graphs._logits is not None and graphs._logits.shape == (12, VOCAB)  # 4 rows x 3, or 2 x 5


def _generate(model, prompts, graphs: bool, temperature: float, drafts: dict[str, list[int]] | None = None,
              racing: bool = False) -> tuple[list[Sequence], Engine]:
    """Serve ``prompts``; with ``drafts``, each step proposes the next tokens of a reference output
    with its last draft token wrong (and with ``racing``, a second candidate too: a token tree)."""
    engine = Engine(model, max_batch=len(prompts), max_len=128, cuda_graphs=graphs)
    seqs = [Sequence(f"r{i}", p, SamplingParams(temperature=temperature, max_tokens=30), seed=i)
            for i, p in enumerate(prompts)]
    for seq in seqs:
        engine.add(seq)
    step = 0
    while engine.has_work:
        given: dict = {}
        for seq in engine.running if drafts else []:
            ref, done = drafts[seq.request_id], len(seq.output_ids)
            k = 1 + (step + done) % 6
            draft = ref[done:done + k] + [(ref[done + k] + 1) % VOCAB if done + k < len(ref) else 0]
            given[seq.request_id] = [("a", draft), ("b", [3, 4])] if racing else ("a", draft)
        engine.step(given)
        step += 1
    return seqs, engine


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_engine_on_padded_steps_gives_the_same_tokens(model, temperature) -> None:
    prompts = _prompts(6, seed=2)
    plain, _ = _generate(model, prompts, False, temperature)
    padded, engine = _generate(model, prompts, True, temperature)
    assert engine.graphs is not None and engine.graphs.eager_steps > 0
    assert [s.output_ids for s in padded] == [s.output_ids for s in plain]
    drafted, engine = _generate(model, prompts, True, temperature, {s.request_id: s.output_ids for s in plain})
    assert sum(s.accepted for s in drafted) > 0 and len(engine.graphs.graphs) > 2  # verify chunks padded too
    assert [s.output_ids for s in drafted] == [s.output_ids for s in plain]
    raced, _ = _generate(model, prompts, True, temperature, {s.request_id: s.output_ids for s in plain}, racing=True)
    assert [s.output_ids for s in raced] == [s.output_ids for s in plain]  # token trees: the eager step


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), count=st.integers(1, 7), temperature=st.sampled_from([0.0, 0.7, 1.0]))
def test_padded_steps_are_lossless_for_any_batch(model, seed, count, temperature) -> None:
    """Whatever the batch (and so the bucket padding), the padded engine's tokens are the eager one's."""
    prompts = _prompts(count, seed)
    plain, _ = _generate(model, prompts, False, temperature)
    drafted, _ = _generate(model, prompts, True, temperature, {s.request_id: s.output_ids for s in plain})
    assert [s.output_ids for s in drafted] == [s.output_ids for s in plain]


def test_capture_on_a_cpu_is_refused(model) -> None:
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        GraphedSteps(model, KVCache(model.cfg, 2, 32), capture=True)


def test_a_step_reports_the_graph_it_replayed(model) -> None:
    """verify.step names the padded shape (batch x chunk), and nothing for an eager step."""
    engine = Engine(model, max_batch=3, max_len=64, cuda_graphs=True)
    engine.add(Sequence("long", list(range(1, 21)), SamplingParams(temperature=0.0, max_tokens=10), seed=0))
    engine.add(Sequence("short", [5, 6], SamplingParams(temperature=0.0, max_tokens=3), seed=1))
    first = engine.step()  # a 20-token prefill: longer than any chunk, eager
    second = engine.step()  # two decode rows: a bucket of 2 rows x 1 token
    third = engine.step({"long": ("a", [7, 8, 9])})  # a verify step: chunk 4, padded to 5
    assert (first.graph, second.graph, third.graph) == (None, (2, 1), (2, 5))
    assert first.capture_s == second.capture_s == 0.0  # a CPU captures nothing


def test_graphs_are_dropped_when_the_rope_table_grows(model) -> None:
    """Another user of the model (a profile's longer cache) may grow its RoPE table; graphs captured
    on the old table would read freed memory, so they are made again."""
    graphs = GraphedSteps(model, KVCache(model.cfg, 2, 32), capture=False)
    graphs.run([[1, 2]], [1], (1, 2))
    assert len(graphs.graphs) == 1
    model._rope(torch.zeros(1, dtype=torch.long), model._rope_len + 1)  # grows it
    logits = graphs.run([[3]], [0], (1, 1))
    assert list(graphs.graphs) == [(1, 1)] and torch.isfinite(logits).all()


def test_capturing_every_shape_before_serving_leaves_the_tokens_alone(model) -> None:
    """capture_all takes each shape once, writing junk into the then-free slots; requests admitted
    afterwards prefill over it, so the tokens are the eager engine's."""
    prompts = _prompts(5, seed=11)
    plain, _ = _generate(model, prompts, False, 1.0)
    engine = Engine(model, max_batch=5, max_len=128, cuda_graphs=True)
    assert engine.graphs is not None
    shapes = engine.graphs.capture_all()
    assert shapes == len(engine.graphs.batches) * len(engine.graphs.chunks) == 4 * 6  # batches 1, 2, 4, 5
    assert engine.graphs.eager_steps == shapes  # a CPU runs each padded step once, uncaptured
    seqs = [Sequence(f"r{i}", p, SamplingParams(temperature=1.0, max_tokens=30), seed=i) for i, p in enumerate(prompts)]
    engine.run(seqs)
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]
    assert len(engine.graphs.graphs) == shapes  # no new shape met
