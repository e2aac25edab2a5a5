"""Loading the repository's examples (examples/) as modules, so tests call their functions.

Not for bench/: what tests use of the benchmarks lives in the package (``specactor.bench.*``),
and a bench script is tested through its command line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (from the repository root) as a module, registered in
    ``sys.modules`` under its file's stem: its dataclasses look their module up there."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, f"no script at {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
