"""A real ``specactor serve`` daemon in a subprocess on loopback, and reference tokens."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

from specactor.protocol import SamplingParams
from specactor.server.serve import READY
from specactor.verifier.engine import Engine, Sequence

MAX_LEN = 512


class Daemon:
    def __init__(self, proc: subprocess.Popen, endpoint: str, log: list[str]) -> None:
        self.proc, self.endpoint, self.log = proc, endpoint, log

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_daemon(cache: Path, *args: str) -> Daemon:
    """Start ``specactor serve`` on a free loopback port and wait for its ready line."""
    env = {**os.environ, "SPECACTOR_CACHE": str(cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specactor.cli", "serve", "--endpoint", "tcp://127.0.0.1:0", "--max-len",
         str(MAX_LEN), "--max-batch", "8", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log: list[str] = []
    ready = threading.Event()
    endpoint: list[str] = []

    def pump() -> None:  # keep reading so the pipe never fills
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            if line.startswith(READY):
                endpoint.append(re.search(r"tcp://\S+", line).group(0))
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(180):
        proc.kill()
        raise RuntimeError("daemon did not become ready:\n" + "".join(log))
    return Daemon(proc, endpoint[0], log)


@pytest.fixture(scope="module")
def daemon_factory(session_cache: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def make(*args: str) -> Daemon:
        d = start_daemon(session_cache, *args)
        started.append(d)
        return d

    yield make
    for d in started:
        d.stop()


def reference_tokens(model, tok, prompt: list[int], params: SamplingParams) -> list[int]:
    """What autoregressive decoding gives for one request with an explicit seed (n=1)."""
    seq = Sequence("ref", list(prompt), params, seed=params.seed)
    eos = set(model.cfg.eos_token_ids) | {tok.eos_token_id}  # what the VerifyActor uses
    Engine(model, max_batch=1, max_len=MAX_LEN, eos_token_ids=eos).run([seq])
    return seq.output_ids


@pytest.fixture(scope="module")
def prompts(default_model) -> list[list[int]]:
    from specactor.prompts import humaneval_prompts

    _, _, tok = default_model
    return [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(4)]
