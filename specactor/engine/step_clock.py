"""A step's forward timed as the device ran it, not as the host queued it.

On a CPU the forward returns when its work is done, so the host's clock is its time. On a GPU it
returns once its kernels are queued (a replayed CUDA graph at once), and the work finishes while
the sampler waits for its tokens: the host's clock says the launch. The policy corrects its cost
profile (forwards timed with a synchronisation) by the live steps' forward times, so launch
times (3% of a graphed H100 step) made it believe steps ~30x cheaper than profiled, and the
cheap drafters' real CPU time too slow to keep up with them. CUDA events around the forward give its device time once
the sampler's copy to the host has synchronised, without a synchronisation of their own.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    """``start``, then ``forward_queued`` once the forward returned, then ``finish`` once the
    step's tokens are on the host: (forward seconds, seconds of the rest)."""

    def __init__(self, device: torch.device) -> None:
        self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
            if device.type == "cuda" else None
        self.t0 = self.t1 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()
        if self.events is not None:
            self.events[0].record()

    def forward_queued(self) -> None:
        self.t1 = time.perf_counter()
        if self.events is not None:
            self.events[1].record()

    def finish(self) -> tuple[float, float]:
        """(the forward's seconds, the rest of the step's): call after the step synchronised."""
        t2 = time.perf_counter()
        if self.events is None:
            return self.t1 - self.t0, t2 - self.t1
        self.events[1].synchronize()  # done already (the sampler's copy waited for it): a no-op check
        forward = self.events[0].elapsed_time(self.events[1]) / 1e3
        return forward, max(t2 - self.t0 - forward, 0.0)
