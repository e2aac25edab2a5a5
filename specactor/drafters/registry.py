"""Drafting methods by name."""

from __future__ import annotations

from typing import Any

from specactor.drafters.base import Drafter
from specactor.speculation import METHODS

def make_drafter(method: str, model: str | None = None, options: dict[str, Any] | None = None) -> Drafter:
    """Build the drafter called ``method``; ``model`` is the target model name or path."""
    options = options or {}
    if method == "ngram":
        from specactor.drafters.ngram import NgramDrafter

        return NgramDrafter(**options)
    if method == "suffix":
        from specactor.drafters.suffix import SuffixDrafter

        return SuffixDrafter(**options)
    if method == "model":
        from specactor.drafters.model import default_model_drafter
        from specactor.engine.model_registry import resolve_model

        return default_model_drafter(resolve_model(model), **options)
    if method == "learned":
        from specactor.drafters.learned import learned_drafter
        from specactor.engine.model_registry import resolve_model

        return learned_drafter(resolve_model(model), **options)
    raise ValueError(f"unknown drafting method {method!r}: choose from {', '.join(METHODS)}")


def parse_methods(text: str) -> list[str]:
    """``"ngram,suffix"`` -> ["ngram", "suffix"], with a clear error for unknown names."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise ValueError("--drafters needs at least one method")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown drafting method {unknown[0]!r}: choose from {', '.join(METHODS)}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--drafters lists a method twice: {text}")
    return methods
