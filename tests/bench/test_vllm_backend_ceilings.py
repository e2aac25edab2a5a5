"""bench/vllm_backend.py's ceilings (specactor.bench.vllm_compare.replayed) are computed at the
window vLLM + specactor runs at (8 on vLLM), not at our engine's 16: a profile measured to chunk 9
priced a window of 16 by extrapolation, and on the bf16 profile put a perfect drafter at 13x. No
vLLM needed: the ceilings are replays."""

from __future__ import annotations

from specactor.bench.vllm_compare import Workload, replayed
from specactor.config import VLLM_WINDOW


def test_the_ceilings_are_replayed_at_the_window_the_specactor_mode_runs_at(session_cache, monkeypatch) -> None:
    monkeypatch.setenv("SPECACTOR_CACHE", str(session_cache))
    # samples that repeat themselves: every drafter is right, and the longest window a ceiling may use pays
    keyed = {"p0#0": [11, 12, 13, 14] * 24, "p1#0": [21, 22, 23] * 32}
    got = {}
    for window in (None, 4):
        work = Workload(prompts=2, n=1, max_tokens=96, temperature=0.0, window=window, dtype="float32")
        got[window] = replayed(work, keyed, 10.0)
        longest = window or VLLM_WINDOW
        assert got[window]["clairvoyant"]["window"] == longest
        assert got[window]["perfect"]["speedup"] >= got[window]["clairvoyant"]["speedup"] > 1.0
    # a perfect drafter commits window + 1 tokens a step: a shorter window, a lower ceiling
    assert got[4]["perfect"]["speedup"] < got[None]["perfect"]["speedup"]
