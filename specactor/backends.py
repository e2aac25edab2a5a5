"""Which engine verifies: specactor's own (``torch``) or vLLM's (``vllm``).

The VerifyActor asks this module for a loaded engine and never imports a
backend itself: both engines implement the protocol of
:mod:`specactor.engine.sequence` (``add``, ``step``, ``abort``, ``has_work``), so
everything above the engine drives either one the same way. vLLM is imported
only when it is asked for.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any

from specactor.config import GRAPHED_PROFILE, EngineConfig, torch_dtype


def check_backend(config: EngineConfig) -> None:
    """``config.check()``, and the backend it names installed: ValueError naming what is wrong."""
    config.check()
    if config.backend == "vllm":
        from specactor.vllm_backend import require_vllm

        try:
            require_vllm()
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None


@dataclass
class EngineSettings:
    """What the verifier's engine is built with (the VerifyActor's settings)."""

    backend: str
    max_batch: int
    max_len: int
    window: int
    device: str
    dtype: str
    threads: int | None
    share_prompts: bool
    cuda_graphs: bool
    profile: bool  # measure this machine's cost profile before serving, if none is cached


@dataclass
class LoadedEngine:
    engine: Any  # specactor.engine.llm_engine.Engine or specactor.vllm_backend.engine.VllmEngine
    threads: int  # the threads its forward really uses (reported in stats)
    bfloat16: bool  # whether it computes in bfloat16 (reported in stats)


def load_engine(folder: Any, settings: EngineSettings, log: Any) -> LoadedEngine:
    """The engine for the model in ``folder``, its cost profile measured first where ``settings``
    asks for one and none is cached (the timings must not share the cores with rollouts); on a GPU
    our engine's CUDA graphs are captured before it serves, none mid-rollout. ``settings.backend``
    is one of :data:`specactor.config.BACKENDS` (the VerifyActor refuses any other when built)."""
    import torch

    if settings.threads:
        torch.set_num_threads(settings.threads)
    if settings.backend == "vllm":
        return _load_vllm(folder, settings, log)
    return _load_torch(folder, settings, log)


def _load_torch(folder: Any, settings: EngineSettings, log: Any) -> LoadedEngine:
    import torch

    from specactor.engine.llm_engine import Engine
    from specactor.engine.weights import load_causal_lm

    model = load_causal_lm(folder, dtype=torch_dtype(settings.dtype), device=settings.device)
    engine = Engine(model, max_batch=settings.max_batch, max_len=settings.max_len,
                    eos_token_ids=eos_token_ids(folder, model.cfg.eos_token_ids),
                    device=settings.device, share_prompts=settings.share_prompts,
                    cuda_graphs=None if settings.cuda_graphs else False)
    graphed = engine.replays_graphs
    if settings.profile:
        from specactor.engine.profiling import ensure_profile, grid_for, measure

        ensure_profile(engine.model, folder, dtype=settings.dtype, device=settings.device, log=log,
                       grid=grid_for(settings.window), backend=GRAPHED_PROFILE if graphed else "torch",
                       measurer=functools.partial(measure, cuda_graphs=True) if graphed else None)
    if graphed:  # every shape now, none mid-rollout; and the eager prefill's first-use costs
        assert engine.graphs is not None
        started = time.perf_counter()
        shapes = engine.graphs.capture_all()
        captured = time.perf_counter() - started
        warm_up_s = engine.warm_up()
        log.info("verify.graphs_captured", shapes=shapes, seconds=round(captured, 3), warm_up_s=round(warm_up_s, 3))
    return LoadedEngine(engine, torch.get_num_threads(), model.embed.weight.dtype == torch.bfloat16)


def _load_vllm(folder: Any, settings: EngineSettings, log: Any) -> LoadedEngine:
    """vLLM verifies (in this process). The policy's cost profile is vLLM's own steps on this
    machine (measured once before serving, then cached), when ``settings.profile`` asks for it."""
    from specactor.engine.config import ModelConfig
    from specactor.vllm_backend.engine import VllmEngine

    eos = eos_token_ids(folder, ModelConfig.from_dir(folder).eos_token_ids)
    engine = VllmEngine(folder, max_batch=settings.max_batch, max_len=settings.max_len, eos_token_ids=eos,
                        max_draft=max(settings.window, 1), dtype=settings.dtype, device=settings.device,
                        threads=settings.threads, prefix_caching=settings.share_prompts)
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or (os.cpu_count() or 1)
    if settings.profile:
        from specactor.engine.profiling import ensure_profile, grid_for
        from specactor.vllm_backend.profiling import BUDGET_S, EngineTooShort, measure_vllm

        try:
            ensure_profile(engine, folder, dtype=settings.dtype, device=settings.device, threads=threads,
                           log=log, backend="vllm", measurer=measure_vllm, budget_s=BUDGET_S,
                           grid=grid_for(engine.max_draft))
        except EngineTooShort as exc:  # serve all the same: the policy starts from the packaged profile
            log.warning("policy.profile_skipped", error=str(exc))
    return LoadedEngine(engine, threads, False)


def eos_token_ids(folder: Any, config_eos: Any) -> set[int]:
    """The tokens that end a sample: the model config's EOS ids and the tokenizer's (either backend)."""
    from specactor.tokenizer import Tokenizer

    eos = set(config_eos)
    tok_eos = Tokenizer(folder).eos_token_id
    if tok_eos is not None:
        eos.add(tok_eos)
    return eos
