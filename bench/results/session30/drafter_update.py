"""How much of the model drafter's acceptance after a weight update depends on the drafter taking it."""
import asyncio, sys, torch
from specactor.coordinator import EngineConfig, RolloutEngine
from specactor.protocol import SamplingParams
from specactor.weight_update import read_checkpoint
from specactor.models import resolve_model
from specactor.tokenizer import Tokenizer

TEXTS = ["def add(a, b):\n", 'def fib(n):\n    """Return the n-th Fibonacci number."""\n']

async def run(scale, drafter_updates):
    folder = resolve_model(None)
    tok = Tokenizer(folder)
    prompts = [tok.encode(t) for t in TEXTS]
    if not drafter_updates:
        RolloutEngine._weight_holders = property(lambda self: ["verifier"])
    cfg = EngineConfig(mode="coupled", drafters=["model"], backend="vllm", max_len=512, max_batch=8,
                       profile="packaged", policy=False)
    params = SamplingParams(temperature=1.0, max_tokens=96, seed=5, n=2)
    async with RolloutEngine(cfg) as engine:
        before = await engine.generate(prompts, params, request_ids=["p0", "p1"])
        gen = torch.Generator().manual_seed(1)
        state = read_checkpoint(folder)
        await engine.update_weights({k: v + scale * torch.randn(v.shape, generator=gen) for k, v in state.items()})
        after = await engine.generate(prompts, params, request_ids=["p0", "p1"])
    for name, res in (("before", before), ("after", after)):
        d = sum(r.stats.per_method.get("model", {}).get("drafted", 0) for r in res)
        a = sum(r.stats.per_method.get("model", {}).get("accepted", 0) for r in res)
        print(f"scale {scale} drafter_updates {drafter_updates} {name}: {a}/{d} = {a/max(d,1):.3f}", flush=True)

scale, upd = float(sys.argv[1]), sys.argv[2] == "1"
asyncio.run(run(scale, upd))
