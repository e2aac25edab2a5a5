"""The engine on a GPU: the noise, the sampler, the engine, the model drafter and the whole
rollout give on CUDA what they give on the CPU. Skipped where torch sees no CUDA device (CI);
run on a GPU with ``pytest tests/verifier/test_cuda.py``, and the losslessness properties with
``SPECACTOR_TEST_DEVICE=cuda pytest tests/verifier/test_lossless.py``."""

from __future__ import annotations

import pytest
import torch

from specactor.drafters.base import DraftState
from specactor.drafters.model import ModelDrafter
from specactor.protocol import SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.engine.sampler import SamplingBatch, gumbel_noise, sample
from specactor.verifier.verify_loop import Verifier
from tests.conftest import ours_from_hf, tiny_hf_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

VOCAB = 256


@pytest.fixture(scope="module")
def models():
    """The same tiny random Llama on the CPU and on the GPU, float32."""
    cpu = ours_from_hf(tiny_hf_model("llama", seed=7, vocab=VOCAB))
    gpu = ours_from_hf(tiny_hf_model("llama", seed=7, vocab=VOCAB)).to("cuda")
    return cpu, gpu


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _run(model, prompts, params, seeds, max_batch=None) -> list[Sequence]:
    seqs = [Sequence(f"r{i}", p, params, seed=s) for i, (p, s) in enumerate(zip(prompts, seeds))]
    return Engine(model, max_batch=max_batch or len(prompts), max_len=256).run(seqs)


def test_the_position_keyed_noise_is_the_same_on_cpu_and_gpu() -> None:
    """The noise is integer hashing then two logs: a GPU sample must see the CPU's noise."""
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(0, 2**62, (64,), generator=g)
    positions = torch.randint(0, 4096, (64,), generator=g)
    on_cpu = gumbel_noise(seeds, positions, 49152)
    on_gpu = gumbel_noise(seeds.cuda(), positions.cuda(), 49152).cpu()
    assert torch.isfinite(on_gpu).all()
    torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 50, 0.9)])
def test_the_sampler_picks_the_same_tokens_on_cpu_and_gpu(temperature, top_k, top_p) -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(96, 49152, generator=g) * 3
    rows = [(temperature, top_k, top_p, 1000 + i, i) for i in range(96)]
    cpu_tokens, cpu_logprobs = sample(logits, SamplingBatch.build(rows))
    gpu_tokens, gpu_logprobs = sample(logits.cuda(), SamplingBatch.build(rows, "cuda"))
    assert gpu_tokens.device.type == "cuda"
    assert gpu_tokens.cpu().tolist() == cpu_tokens.tolist()
    torch.testing.assert_close(gpu_logprobs.cpu(), cpu_logprobs, rtol=1e-4, atol=1e-4)


def test_the_engine_on_the_gpu_keeps_its_cache_there_and_matches_the_cpu_logprobs(models) -> None:
    cpu, gpu = models
    engine = Engine(gpu, max_batch=2, max_len=64)
    assert engine.cache.k.device.type == "cuda"  # the device defaults to the weights'
    prompts, seeds = _prompts([5, 11, 3]), [1, 2, 3]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    on_cpu, on_gpu = _run(cpu, prompts, params, seeds), _run(gpu, prompts, params, seeds)
    for a, b in zip(on_cpu, on_gpu):
        n = next((i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y), len(a.output_ids))
        assert n >= 8, f"greedy output left the CPU's after {n} tokens"
        assert b.logprobs[:n] == pytest.approx(a.logprobs[:n], abs=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verified_perfect_drafts_give_the_autoregressive_tokens_on_the_gpu(dtype, temperature) -> None:
    """Drafts the verifier checks several at a time against one token at a time, per dtype: the
    tokens are the same wherever the step's other rows do not change a logit's pick."""
    model = ours_from_hf(tiny_hf_model("llama", seed=7, vocab=VOCAB)).to("cuda", dtype)
    prompts, seeds = _prompts([4, 9, 2, 13], seed=3), [5, 6, 7, 8]
    params = SamplingParams(temperature=temperature, max_tokens=40)
    reference = _run(model, prompts, params, seeds)
    verifier = Verifier(Engine(model, max_batch=4, max_len=256), default_window=4)
    seqs = [Sequence(f"r{i}", p, params, seed=s) for i, (p, s) in enumerate(zip(prompts, seeds))]
    for seq in seqs:
        verifier.add(seq)
    steps = 0
    while verifier.has_work:
        for seq in verifier.engine.running:
            ref = reference[int(seq.request_id[1:])].output_ids
            done = len(seq.output_ids)
            verifier.add_draft(seq.request_id, "perfect", done, ref[done:done + 4])
        verifier.step()
        steps += 1
    assert steps <= 1 + 40 // 5 + 2  # the drafts were accepted, not bypassed
    assert [s.output_ids for s in seqs] == [r.output_ids for r in reference]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_model_drafter_with_shared_noise_drafts_the_targets_tokens_on_the_gpu(models, temperature) -> None:
    _, gpu = models
    prompts, seeds = _prompts([3, 17, 40], seed=4), [11, 2**62 + 5, 0]
    expected = [s.output_ids for s in _run(gpu, prompts, SamplingParams(temperature=temperature, max_tokens=24),
                                           seeds)]
    drafter = ModelDrafter(gpu, max_slots=4, max_len=256)
    assert drafter.cache.k.device.type == "cuda"
    states = [DraftState(f"r{i}", list(p), seed=s, temperature=temperature)
              for i, (p, s) in enumerate(zip(prompts, seeds))]
    for s in states:
        drafter.start(s)
    for _ in range(6):
        for s, d in zip(states, drafter.propose(states, 4)):
            s.lookahead.extend(d)
    assert [s.lookahead for s in states] == expected


async def test_a_specactor_rollout_on_the_gpu_gives_the_autoregressive_tokens(tiny_checkpoint, session_cache,
                                                                             monkeypatch) -> None:
    """The whole path (RolloutEngine, verifier and drafter actors, policy) with device="cuda"."""
    from specactor.config import EngineConfig
    from specactor.rollout_engine import RolloutEngine

    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    prompts = _prompts([6, 10, 3, 8], seed=5)
    params = SamplingParams(temperature=1.0, max_tokens=48, seed=9, n=2)
    outputs = {}
    for mode in ("autoregressive", "specactor"):
        config = EngineConfig(model=str(tiny_checkpoint), mode=mode, drafters=["ngram", "suffix"], device="cuda",
                              max_batch=8, max_len=128, policy=False)
        async with RolloutEngine(config) as engine:
            results = await engine.generate(prompts, params, request_ids=[f"p{i}" for i in range(len(prompts))])
            outputs[mode] = {r.request_id: r.token_ids for r in results}
    assert outputs["specactor"] == outputs["autoregressive"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_learned_drafter_drafts_on_the_gpu_what_it_drafts_on_the_cpu(temperature) -> None:
    """It trains on the CPU and drafts on its device: the drafting copy, its truncated vocabulary
    and a weight update coming from GPU tensors must all land there."""
    from specactor.drafters.learned import LearnedDrafter

    target = ours_from_hf(tiny_hf_model("llama", seed=5, vocab=VOCAB))
    cycle = [10 + i % 7 for i in range(80)]
    drafts = {}
    for device in ("cpu", "cuda"):
        drafter = LearnedDrafter(target, layers=1, vocab=64, max_slots=4, max_len=256, epochs=30, lr=3e-3,
                                 max_train_s=None, device=device)
        for i in range(6):
            drafter.add_rollout([1, 2, 3 + i], cycle[i:i + 60])
        drafter.train()
        if device == "cuda":
            drafter.load_weights({"model.embed_tokens.weight": target.embed.weight.detach().cuda()})
            assert drafter.model.embed.weight.device.type == "cuda"
            assert drafter.model.vocab.device.type == "cuda"
        else:
            drafter.load_weights({"model.embed_tokens.weight": target.embed.weight.detach()})
        states = [DraftState(f"r{i}", [1, 2, 9], committed=cycle[i:i + 20], seed=4 + i, temperature=temperature)
                  for i in range(3)]
        for s in states:
            drafter.start(s)
        drafts[device] = drafter.propose(states, 4)
    assert drafts["cuda"] == drafts["cpu"]
    assert all(len(d) == 4 for d in drafts["cuda"])
    if temperature == 0.0:
        assert drafts["cuda"] == [cycle[i + 20:i + 24] for i in range(3)]


def _serve(engine: Engine, prompts, params, seeds, drafts: dict[str, list[int]] | None = None) -> list[Sequence]:
    """Serve on ``engine``; with ``drafts``, every step proposes the next 4 tokens of a reference."""
    seqs = [Sequence(f"r{i}", p, params, seed=s) for i, (p, s) in enumerate(zip(prompts, seeds))]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work:
        given = {} if drafts is None else {
            s.request_id: ("perfect", drafts[s.request_id][len(s.output_ids):len(s.output_ids) + 4])
            for s in engine.running if s.output_ids}
        engine.step(given)
    return seqs


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cuda_graphs_give_the_eager_steps_tokens_on_the_gpu(models, temperature) -> None:
    """Graphs are on by default on a GPU; decode and verify steps replay them, float32 tokens are
    the eager engine's, and a second run replays the graphs the first captured."""
    _, gpu = models
    prompts, seeds = _prompts([5, 11, 3, 8, 2], seed=4), [1, 2, 3, 4, 5]
    params = SamplingParams(temperature=temperature, max_tokens=40)
    eager = _serve(Engine(gpu, max_batch=5, max_len=128, cuda_graphs=False), prompts, params, seeds)
    engine = Engine(gpu, max_batch=5, max_len=128)
    assert engine.graphs is not None and engine.graphs.capture
    graphed = _serve(engine, prompts, params, seeds)
    ready = Engine(gpu, max_batch=5, max_len=128)  # every shape captured before serving, as the verifier does
    assert ready.graphs is not None and ready.graphs.capture_all() == 4 * 6
    assert [s.output_ids for s in _serve(ready, prompts, params, seeds)] == [s.output_ids for s in eager]
    assert [s.output_ids for s in graphed] == [s.output_ids for s in eager]
    for a, b in zip(eager, graphed):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    captured, replays = len(engine.graphs.graphs), engine.graphs.replays
    assert replays > 30
    drafted = _serve(engine, prompts, params, seeds, {s.request_id: s.output_ids for s in eager})
    assert [s.output_ids for s in drafted] == [s.output_ids for s in eager]
    assert sum(s.accepted for s in drafted) > 0 and len(engine.graphs.graphs) > captured  # verify chunks graphed


def test_cuda_graphs_follow_a_weight_update_on_the_gpu() -> None:
    """Weights load in place, so graphs captured before an update compute with the new weights."""
    model = ours_from_hf(tiny_hf_model("llama", seed=7, vocab=VOCAB)).to("cuda")
    prompts, seeds = _prompts([6, 9], seed=5), [1, 2]
    params = SamplingParams(temperature=1.0, max_tokens=24)
    engine = Engine(model, max_batch=2, max_len=64)
    before = _serve(engine, prompts, params, seeds)
    new = tiny_hf_model("llama", seed=8, vocab=VOCAB).state_dict()
    model.load_hf_state_dict({k: v.to("cuda") for k, v in new.items()})
    after = _serve(engine, prompts, params, seeds)
    fresh = ours_from_hf(tiny_hf_model("llama", seed=8, vocab=VOCAB)).to("cuda")
    reference = _serve(Engine(fresh, max_batch=2, max_len=64, cuda_graphs=False), prompts, params, seeds)
    assert [s.output_ids for s in after] == [s.output_ids for s in reference]
    assert [s.output_ids for s in after] != [s.output_ids for s in before]


def test_a_graphs_first_step_captures_it_and_later_ones_replay_on_the_gpu(models) -> None:
    _, gpu = models
    engine = Engine(gpu, max_batch=2, max_len=64)
    for i, prompt in enumerate(_prompts([4, 6], seed=9)):
        engine.add(Sequence(f"r{i}", prompt, SamplingParams(temperature=1.0, max_tokens=6), seed=i))
    reports = [engine.step() for _ in range(4)]
    assert [r.graph for r in reports] == [(2, 9), (2, 1), (2, 1), (2, 1)]  # the prefill of 4 and 6 tokens: chunk 9
    assert reports[0].capture_s > 0 and reports[1].capture_s > 0
    assert reports[2].capture_s == reports[3].capture_s == 0.0
