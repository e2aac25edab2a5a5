import time, torch, statistics
from specactor.models import resolve_model
from specactor.verifier.weights import load_causal_lm
from specactor.verifier.engine import Engine, Sequence
from specactor.protocol import SamplingParams
torch.set_num_threads(2)
model = load_causal_lm(resolve_model(None))
eng = Engine(model, max_batch=32, max_len=1024)
g = torch.Generator().manual_seed(0)
for i in range(32):
    prompt = torch.randint(0, model.cfg.vocab_size, (120 + 3 * i,), generator=g).tolist()
    eng.add(Sequence(f"r{i}", prompt, SamplingParams(temperature=1.0, max_tokens=600), seed=i))
for _ in range(4):
    eng.step()
def timed(drafts):
    t = time.perf_counter(); eng.step(drafts); return (time.perf_counter() - t) * 1e3
for rows, w in [(0, 0), (1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (1, 4), (4, 4), (8, 4), (16, 4)]:
    drafts = {f"r{i}": ("ngram", [5] * w) for i in range(rows)}
    ts = [timed(drafts) for _ in range(5)]
    print(f"rows {rows:2d} w {w}: {statistics.median(ts[1:]):6.1f} ms", flush=True)
