"""specactor: lossless speculative rollout for LLM RL post-training.

    from specactor import RolloutEngine, EngineConfig, SamplingParams, RolloutClient, RolloutPool
"""

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RolloutEngine": "specactor.rollout_engine",
    "EngineConfig": "specactor.config",
    "SamplingParams": "specactor.protocol",
    "RequestResult": "specactor.protocol",
    "RolloutClient": "specactor.server.client",
    "RolloutPool": "specactor.pool",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Import on first use: ``import specactor`` stays light (no torch) for the CLI."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specactor' has no attribute {name!r}")
