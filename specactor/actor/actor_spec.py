"""How to start an actor in another process, as plain JSON (never pickle)."""

from __future__ import annotations

import importlib
from typing import Any

import msgspec

#: the environment variable that tells a child process which process started it (it dies with it)
PARENT_ENV = "SPECACTOR_PARENT_PID"


class ActorSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything a child process needs to build and run one actor.

    ``cls`` is an import path ``"package.module:ClassName"``; ``kwargs`` must be
    JSON-serialisable and are passed to the constructor with ``name``.
    ``env`` is applied before the class is imported (e.g. thread counts).
    """

    name: str
    cls: str
    kwargs: dict[str, Any] = {}
    env: dict[str, str] = {}


def load_class(path: str) -> type:
    module_name, sep, qualname = path.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"actor class {path!r} must be 'package.module:ClassName'")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{path!r} is not a class")
    return obj


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
