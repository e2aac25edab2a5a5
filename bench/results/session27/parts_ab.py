"""A verify step's time with r rows drafting w tokens at batch 32 (B=...), in the two attention layouts of
StepLayout.build: drafting rows in a part of their own, or every row padded to the longest chunk.

Needs a one-line switch in specactor/verifier/model.py (not committed), in StepLayout.build:
    if max_q > 1 and not os.environ.get("NO_PARTS") and 2 * len(multi) <= b:
then: PYTHONPATH=TREE python bench/results/session27/parts_ab.py
"""
import time, torch, os, statistics
from specactor.models import resolve_model
from specactor.verifier.weights import load_causal_lm
from specactor.verifier.engine import Engine, Sequence
from specactor.protocol import SamplingParams
torch.set_num_threads(2)
model = load_causal_lm(resolve_model(None))
B = int(os.environ.get("B", "32"))
eng = Engine(model, max_batch=B, max_len=1024)
g = torch.Generator().manual_seed(0)
for i in range(B):
    prompt = torch.randint(0, model.cfg.vocab_size, (120 + 3 * i,), generator=g).tolist()
    eng.add(Sequence(f"r{i}", prompt, SamplingParams(temperature=1.0, max_tokens=600), seed=i))
for _ in range(4):
    eng.step()
def timed(drafts):
    t = time.perf_counter(); eng.step(drafts); return (time.perf_counter() - t) * 1e3
res = {}
for rows, w in [(0, 0), (1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (1, 4), (4, 4), (8, 4), (16, 4)]:
    drafts = {f"r{i}": ("ngram", [5] * w) for i in range(rows)}
    for mode in ("parts", "uniform"):
        if mode == "uniform": os.environ["NO_PARTS"] = "1"
        else: os.environ.pop("NO_PARTS", None)
        ts = [timed(drafts) for _ in range(5)]
        res[(rows, w, mode)] = statistics.median(ts[1:])
    print(f"B={B} rows {rows:2d} w {w}: parts {res[(rows,w,'parts')]:6.1f} ms  uniform {res[(rows,w,'uniform')]:6.1f} ms", flush=True)
