"""What one benchmark run measures: makespan, tokens/s over time, the two phases of a
long-tail rollout, the samples that hit the length cap, peak memory."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field

import psutil


def phase_split(finish_s: list[float], makespan_s: float) -> tuple[float, float]:
    """(phase 1, phase 2) of a rollout: before and after half of the samples finished (the
    ceil(n/2)-th finish). Phase 1 runs at a large batch; phase 2 is the tail, where the batch
    has shrunk and speculation has spare compute to use. The two sum to the makespan."""
    if not finish_s:
        return makespan_s, 0.0
    half = min(sorted(finish_s)[math.ceil(len(finish_s) / 2) - 1], makespan_s)
    return half, makespan_s - half


class PeakMemory:
    """Samples the RSS of this process and all its children (the engine's actors) in a thread,
    and counts the CPU seconds each side used over the run: the caller (coordinator, policy,
    cheap drafters, the bench) against its children (the verifier and any drafter processes).
    On a 2-core machine the caller's CPU is what a speculative mode takes from the verifier.

    Sparingly: on a 2-core machine a sample (a walk of /proc, ~3 ms of CPU) every 20 ms took
    14% of a core from the verifier it was measuring. Models' memory moves in steps that
    last seconds, so a quarter second misses nothing that matters."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.peak_mb = self.tree_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cpu_before: dict[int, float] = {}
        self.caller_cpu_s = 0.0
        self.children_cpu_s = 0.0

    @staticmethod
    def tree_mb() -> float:
        me = psutil.Process(os.getpid())
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total / 2**20

    @staticmethod
    def tree_cpu_s() -> dict[int, float]:
        """User + system CPU seconds of this process and each child, by pid."""
        me = psutil.Process(os.getpid())
        out = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                out[proc.pid] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_mb = max(self.peak_mb, self.tree_mb())
        after, me = self.tree_cpu_s(), os.getpid()
        # a child that started during the run counts from 0; one that ended during it is lost
        used = {pid: cpu - self._cpu_before.get(pid, 0.0) for pid, cpu in after.items()}
        self.caller_cpu_s = used.pop(me, 0.0)
        self.children_cpu_s = sum(used.values())

    def __enter__(self) -> "PeakMemory":
        self._cpu_before = self.tree_cpu_s()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self.tree_mb())


@dataclass
class RunRecord:
    """One mode, one temperature, one epoch."""

    mode: str
    temperature: float
    epoch: int
    makespan_s: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    verified_drafts: int = 0  # drafts that reached the verifier (for the mean accepted length)
    peak_mb: float = 0.0  # of the whole process tree, during the run
    caller_cpu_s: float = 0.0  # CPU seconds of the calling process (coordinator, policy, cheap drafters)
    children_cpu_s: float = 0.0  # CPU seconds of its children (verifier, drafter processes)
    added_mb: float = 0.0  # peak minus what the process tree held before the mode started
    finishes: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, tokens) per sample
    outputs: dict[str, list[int]] = field(default_factory=dict)
    differing: int | None = None  # samples whose tokens differ from autoregressive (None: not comparable)
    policy_version: int | None = None
    #: per sample id: tokens, finish_reason, verify_steps, per_method {method: drafted, accepted, steps}
    samples: dict[str, dict] = field(default_factory=dict)
    note: str = ""  # what makes this run differ from the others (a subset of the prompts, ...)

    def set_memory(self, memory: PeakMemory, before_mb: float) -> None:
        self.peak_mb, self.added_mb = memory.peak_mb, memory.peak_mb - before_mb
        self.caller_cpu_s, self.children_cpu_s = memory.caller_cpu_s, memory.children_cpu_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.makespan_s if self.makespan_s else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        return self.accepted / self.verified_drafts if self.verified_drafts else None

    @property
    def tail_s(self) -> float:
        """Time after 90% of the samples had finished (rounded down: with 8 samples, after the 7th),
        so that the last tenth of the samples is the tail."""
        if not self.finishes:
            return 0.0
        times = sorted(t for t, _ in self.finishes)
        return self.makespan_s - times[max(math.floor(0.9 * len(times)) - 1, 0)]

    @property
    def phases(self) -> tuple[float, float]:
        return phase_split([t for t, _ in self.finishes], self.makespan_s)

    @property
    def capped(self) -> int:
        """Samples that stopped at max_tokens rather than at EOS."""
        return sum(s.get("finish_reason") == "length" for s in self.samples.values())

    def summary(self) -> dict:
        return {"mode": self.mode, "temperature": self.temperature, "epoch": self.epoch,
                "makespan_s": round(self.makespan_s, 3), "tokens": self.tokens,
                "tokens_per_s": round(self.tokens_per_s, 2), "drafted": self.drafted, "accepted": self.accepted,
                "mean_accepted_length": None if self.mean_accepted_length is None
                else round(self.mean_accepted_length, 3),
                "tail_s": round(self.tail_s, 3), "peak_mb": round(self.peak_mb), "added_mb": round(self.added_mb),
                "caller_cpu_s": round(self.caller_cpu_s, 2), "children_cpu_s": round(self.children_cpu_s, 2),
                "differing": self.differing, "policy_version": self.policy_version,
                "phase1_s": round(self.phases[0], 3), "phase2_s": round(self.phases[1], 3),
                "samples": len(self.outputs), "capped": self.capped, "note": self.note,
                "finishes": [(round(t, 3), n) for t, n in self.finishes], "per_sample": self.samples}


class Clock:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start
