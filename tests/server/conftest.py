"""A real ``specactor serve`` daemon in a subprocess on loopback, and reference tokens."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from specactor.protocol import SamplingParams
from specactor.seeds import sample_seed
from specactor.cli.serve import DaemonProcess
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence

MAX_LEN = 512


def start_daemon(cache: Path, *args: str) -> DaemonProcess:
    """Start ``specactor serve`` on a free loopback port (small KV cache) and wait until it is ready."""
    env = {**os.environ, "SPECACTOR_CACHE": str(cache)}
    return DaemonProcess.start("--max-len", str(MAX_LEN), "--max-batch", "8", *args, env=env)


@pytest.fixture(scope="module")
def daemon_factory(session_cache: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def make(*args: str) -> DaemonProcess:
        d = start_daemon(session_cache, *args)
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()


def reference_tokens(model, tok, prompt: list[int], params: SamplingParams, request_id: str,
                     sample: int = 0) -> list[int]:
    """What autoregressive decoding gives for sample ``sample`` of request ``request_id``
    (its seed by the one seed rule)."""
    seed = sample_seed(params.seed, request_id, sample)
    seq = Sequence("ref", list(prompt), params, seed=seed)
    eos = set(model.cfg.eos_token_ids) | {tok.eos_token_id}  # what the VerifyActor uses
    Engine(model, max_batch=1, max_len=MAX_LEN, eos_token_ids=eos).run([seq])
    return seq.output_ids


@pytest.fixture(scope="module")
def prompts(default_model) -> list[list[int]]:
    from specactor.prompts import humaneval_prompts

    _, _, tok = default_model
    return [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(4)]
