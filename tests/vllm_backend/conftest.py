"""One vLLM engine for the backend's engine-level tests (it takes ~15 s to start)."""

from __future__ import annotations

import pytest

TEXTS = ["def add(a, b):\n", 'def fib(n):\n    """Return the n-th Fibonacci number."""\n', "import numpy as np\n"]


@pytest.fixture(scope="session")
def setup(default_model):
    """(VllmEngine, our Engine on its own copy of the model, the prompts' token ids)."""
    pytest.importorskip("vllm", reason="backend vllm: install it with `bash scripts/setup.sh --vllm`")
    from specactor.engine.llm_engine import Engine
    from specactor.engine.weights import load_causal_lm
    from specactor.vllm_backend.engine import VllmEngine

    folder, _, tok = default_model
    model = load_causal_lm(folder)  # its own copy: a test loads other weights into it
    eos = sorted(set(model.cfg.eos_token_ids) | {tok.eos_token_id})
    vllm = VllmEngine(folder, max_batch=48, max_len=512, eos_token_ids=eos, max_draft=4, kv_cache_gb=1)
    ours = Engine(model, max_batch=8, max_len=512, eos_token_ids=eos, pack=False)
    yield vllm, ours, [tok.encode(t) for t in TEXTS]
