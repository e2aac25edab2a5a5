"""Drafting methods by name."""

from __future__ import annotations

from typing import Any

from specactor.drafters.base import Drafter

METHODS = ("ngram", "suffix", "model", "learned")

#: Methods that run a model: each gets a process of its own, is sized like the verifier (it drafts
#: for every running request) and holds a copy of the policy's weights, updated between RL steps.
MODEL_METHODS = ("model", "learned")

#: Methods that learn from the rollouts (the verifier streams every finished sample to them) and
#: draft nothing until they have: the policy leaves them out until their actor reports them ready.
LEARNING_METHODS = ("learned",)


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
        from specactor.models import resolve_model

        return default_model_drafter(resolve_model(model), **options)
    if method == "learned":
        from specactor.drafters.learned import learned_drafter
        from specactor.models import resolve_model

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
