"""The package's shape: dependencies run one way, and README's Layout map names every module.

The target-model engine is a leaf: it imports none of the actors, drafters, policy, server or
the vLLM backend, so it can be read, tested and replaced on its own. The three components above
it (verifier, drafters, policy) import each other not at all: what they share
(method names, the window's geometry) lives in ``specactor.speculation``. Only
``specactor.backends`` (and the benchmarks) import the vLLM backend.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specactor"

#: Each top-level part of the package and its floor: a part imports only parts on a lower floor
#: (and itself). The three components on floor 4 are siblings: none imports another.
FLOORS = {
    "protocol": 0, "seeds": 0, "speculation": 0, "events": 0, "compressed": 0, "memory": 0, "tokenizer": 0,
    "prompts": 0, "calls": 0.5, "config": 0.5, "event_log": 0.5,
    "engine": 1,
    "actor": 2, "weight_update": 2, "vllm_backend": 2,
    "backends": 3,
    "verifier": 4, "drafters": 4, "policy": 4,
    "coordinator": 5, "rollout_engine": 6,
    "rl": 6.5, "pool": 6.6, "server": 7, "bench": 7.5,
    "cli": 8, "__main__": 9, "__init__": 9,
}
SIBLINGS = {"verifier", "drafters", "policy"}


def _part(module: str) -> str:
    """``specactor.engine.model`` -> ``engine``; ``specactor`` (the package itself) -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every specactor module ``path`` imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "specactor":
            found.add(node.module)
            # ``from specactor import protocol`` imports the module specactor.protocol
            found.update(f"{node.module}.{a.name}" for a in node.names
                         if node.module == "specactor" and a.name in FLOORS)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "specactor")
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_has_a_floor() -> None:
    parts = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in _sources()}
    assert parts <= set(FLOORS), f"parts with no floor in FLOORS: {sorted(parts - set(FLOORS))}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_parts_below_its_own(path: Path) -> None:
    module = _module_of(path)
    own = _part(module) if module != "specactor" else "__init__"
    wrong = []
    for imported in _imports(path):
        other = _part(imported)
        if other == own or imported == "specactor":
            continue
        if FLOORS[other] >= FLOORS[own] or (own in SIBLINGS and other in SIBLINGS):
            wrong.append(imported)
    assert not wrong, f"{module} (floor {FLOORS[own]}) imports {sorted(wrong)}"


def test_only_the_backend_picker_and_the_benchmarks_import_vllm_backend() -> None:
    importers = {_part(_module_of(p)) for p in _sources()
                 if any(_part(m) == "vllm_backend" for m in _imports(p))} - {"vllm_backend"}
    assert importers <= {"backends", "bench"}, importers


def test_the_engine_imports_nothing_above_it() -> None:
    """The contract in words, as README states it."""
    above = {"actor", "drafters", "policy", "verifier", "vllm_backend", "server", "rollout_engine", "coordinator",
             "backends", "cli", "bench"}
    for path in (PACKAGE / "engine").rglob("*.py"):
        assert not {_part(m) for m in _imports(path)} & above, path


def test_scripts_never_reach_into_the_tests() -> None:
    """Bench scripts and examples use the package; they neither import tests nor edit sys.path."""
    for path in sorted([*(ROOT / "bench").glob("*.py"), *(ROOT / "examples").glob("*.py")]):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) tests\b", text, re.M), path
        assert "sys.path" not in text, path


def _layout() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_readme_s_layout_names_every_module() -> None:
    layout = _layout()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", layout))
    missing = [str(p.relative_to(ROOT)) for p in _sources()
               if p.stem not in ("__init__", "__main__") and p.stem not in words]
    assert not missing, f"modules not on README's Layout map: {missing}"
    packages = {p.parent.name for p in _sources() if p.parent != PACKAGE}
    assert all(f"{name}/" in layout for name in packages), packages
