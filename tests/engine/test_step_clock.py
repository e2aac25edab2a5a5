"""The engine times a step's forward as the device ran it (:mod:`specactor.engine.step_clock`):
the policy corrects its cost profile by these times, and the event log reports them."""

from __future__ import annotations

import time

import pytest
import torch

from specactor.protocol import SamplingParams
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence
from specactor.engine.step_clock import StepClock


def test_on_a_cpu_the_forward_and_the_rest_are_the_host_clock_between_the_marks() -> None:
    clock = StepClock(torch.device("cpu"))
    clock.start()
    time.sleep(0.02)
    clock.forward_queued()
    time.sleep(0.01)
    forward, rest = clock.finish()
    assert 0.02 <= forward < 0.03 and 0.01 <= rest < 0.02


def test_an_engine_step_reports_its_forward_and_the_rest(tiny_model) -> None:
    _, model, _ = tiny_model
    engine = Engine(model, max_batch=4, max_len=128)
    engine.add(Sequence("a", [1, 2, 3], SamplingParams(temperature=1.0, max_tokens=4), seed=0))
    started = time.perf_counter()
    report = engine.step()
    wall = time.perf_counter() - started
    assert report.forward_s > 0 and report.sample_s > 0 and report.forward_s + report.sample_s <= wall


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_forward_is_its_device_time_not_its_launch() -> None:
    """A queued matmul chain returns at once on the host; its device time is what the clock says,
    measured without a synchronisation of its own (the step's copy to the host is that)."""
    x = torch.randn(4096, 4096, device="cuda")
    (x @ x).sum().item()  # warm up: cuBLAS's set-up and lazy kernel loading are not the forward's
    torch.cuda.synchronize()
    reference = time.perf_counter()
    for _ in range(20):
        x = x @ x / 64
    torch.cuda.synchronize()
    synced = time.perf_counter() - reference
    clock = StepClock(torch.device("cuda"))
    clock.start()
    for _ in range(20):
        x = x @ x / 64
    clock.forward_queued()
    launch = clock.t1 - clock.t0
    x.sum().item()  # the sampler's copy to the host
    forward, rest = clock.finish()
    assert launch < 0.5 * synced  # the host's clock would have said the launch
    assert 0.7 * synced <= forward <= 1.3 * synced and rest >= 0
