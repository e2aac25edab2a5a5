"""EngineConfig: the one configuration of a rollout engine.

The Python API takes it directly; ``specactor rollout``, ``serve`` and
``bench`` build it from their flags through one function
(:func:`specactor.cli.engine_flags.engine_config_from_args`), so every engine
setting reaches every entry point the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specactor.speculation import DEFAULT_WINDOW
from specactor.speculation import METHODS, MODEL_METHODS

if TYPE_CHECKING:
    import torch

MODES = ("autoregressive", "coupled", "specactor")
#: the cost profile's backend for our engine's steps replayed as CUDA graphs (EngineConfig.profile_backend)
GRAPHED_PROFILE = "torch-cuda-graphs"
BACKENDS = ("torch", "vllm")  # the verifier's engine: specactor's own, or vLLM (specactor.vllm_backend)
DTYPES = ("float32", "bfloat16")
#: EngineConfig.draft_quant's choices (specactor.drafters.model.default_model_drafter builds them)
DRAFT_QUANTS = ("llama-q8_0", "llama-q4_0", "int8w", "int4w", "int8", "bf16", "fp32")
PROFILES = (None, "auto", "cached", "packaged")  # EngineConfig.profile, besides a file
#: The window on vLLM (its num_speculative_tokens). Not 16 as on our engine: vLLM's long-tail
#: figures were measured at 8, and at batch 64 x 128 tokens, T=0, the policy drafted ~1,000 tokens
#: at window 16 in two of three runs (median 0.955x stock vLLM) against a few dozen at 8 (median
#: 0.987x stock; both ~0.94x the keyed run, so drafting was not that gap's cause;
#: bench/RESULTS.md, "vLLM backend").
VLLM_WINDOW = 8


@dataclass
class EngineConfig:
    model: str | None = None  # registry name (default smollm2-135m) or a local checkpoint folder
    mode: str = "specactor"
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    k: int = 4  # draft length per proposal (coupled: per verify step)
    #: the most draft tokens a verify step checks per request (the policy picks 0..window; a decoupled
    #: drafter runs up to 2 * window + 1 tokens ahead of the last verdict); None: the backend's
    #: default, see :attr:`max_window`
    window: int | None = None
    max_batch: int = 32
    max_len: int = 1024
    #: the samples of a group (n per prompt) prefill their prompt once: the others copy its cached
    #: prompt (our engine), or find it in vLLM's prefix cache (vllm). Off: every sample prefills its own
    share_prompts: bool = True
    #: samples accepted but not finished, at most (beyond max_batch they queue; beyond this a call is
    #: refused with an error saying so): one call cannot make the engine hold unbounded state
    max_in_flight: int = 16384
    #: keep the last weight update (its bytes, or its checkpoint path) to load it into a verifier the
    #: supervisor restarted: without it a restart after an update cannot serve (costs the model's size)
    restore_weights: bool = True
    #: times the supervisor starts a crashed or hung verifier / model drafter again (requests in flight
    #: are sent again and come out token-identical); then the engine fails every request, saying why
    max_restarts: int = 3
    #: seconds between the verifier's reports of committed tokens to the coordinator: a restarted
    #: verifier resumes each request from the last one (the work lost to a crash is at most this)
    progress_every_s: float = 1.0
    device: str = "cpu"  # cpu, cuda or cuda:N: where the target (and a model drafter) runs
    dtype: str = "float32"  # float32 or bfloat16: weights, activations and KV cache of the target
    #: on a GPU, replay decode and verify steps as CUDA graphs (one launch for a step's ~1,400
    #: kernels; specactor.engine.cuda_graphs). False: every step eager, like vLLM's enforce_eager
    cuda_graphs: bool = True
    #: run a decode or verify step on the verifier's event-loop thread instead of its worker thread.
    #: None: where steps replay CUDA graphs. Such a step is a few milliseconds of host work around
    #: one launch, and handing it to a thread made it wait on the GIL while the loop took messages:
    #: on an H200 the host part of a step fell by 0.3-1.0 ms with it (bench/RESULTS.md, "GPU").
    #: On a CPU a step is tens to hundreds of milliseconds of GIL-free matmuls, beside which the loop
    #: takes the drafts in for the next one; steps that admit requests (prefill) always use the thread,
    #: and so does vLLM's step (it schedules and prefills inside), whatever this says.
    inline_steps: bool | None = None
    seed: int = 0  # the seed of requests that name none (see specactor.seeds)
    transport: str = "ipc"
    processes: bool = True  # verifier and model drafters in their own processes
    # The verifier's torch threads; None: torch's default, every core. A model drafter gets no cores of
    # its own unless this split gives them (drafters_on_verifier): one set aside is lost to every step
    # it does not draft for. On 2 cores the old automatic split (verifier 1 thread, model drafter 1) ran
    # at 0.55-0.82x of autoregressive over batch 1-32 and T=0-1 with the model never drafting, the
    # shared cores at 0.90-1.01x, the cheap drafters' own level.
    verifier_threads: int | None = None
    drafter_threads: int = 1
    #: the ``model`` drafter's copy of the target: ``llama-q8_0`` / ``llama-q4_0`` (the target's weights
    #: at 8 / 4 bits on llama.cpp's kernels, CPU only; needs `bash scripts/setup.sh --llama-cpp`, else
    #: int8w, with a warning), or torch's ``int8w``, ``int8``, ``bf16``, ``fp32``; None: int8w on the
    #: CPU, bf16 on a GPU
    draft_quant: str | None = None
    events_path: str | None = None  # route this process's events, and its actors', to this JSONL file
    policy: bool = True  # specactor mode: Fastest-of-N policy (False: static, all drafters)
    racing: bool = True  # the policy may race extra methods for tail requests
    #: the policy's cost profile: None or "auto" = this machine's (the verifier measures it once, before
    #: it serves, and caches it: specactor.engine.profiling), "cached" = this machine's if cached, never
    #: measured, "packaged" = the one shipped (another machine's, corrected online), else a file.
    #: Default: $SPECACTOR_PROFILE, else auto.
    profile: str | None = field(default_factory=lambda: os.environ.get("SPECACTOR_PROFILE") or None)
    #: the verifier's engine: "torch" (specactor's) or "vllm" (vLLM verifies, specactor's drafters and
    #: policy feed it; needs `bash scripts/setup.sh --vllm`; one candidate verified a step, so no racing)
    backend: str = "torch"

    @property
    def max_window(self) -> int:
        """``window``, or the backend's default: DEFAULT_WINDOW (16) on our engine, VLLM_WINDOW (8)
        on vLLM, whose longer windows were measured only where they cost (batch 64)."""
        if self.window is not None:
            return self.window
        return VLLM_WINDOW if self.backend == "vllm" else DEFAULT_WINDOW

    @property
    def graphed(self) -> bool:
        """Whether the verifier's steps replay CUDA graphs (our engine on a GPU, unless told not to)."""
        return self.backend == "torch" and self.device.startswith("cuda") and self.cuda_graphs

    @property
    def policy_races(self) -> bool:
        """Whether the policy may race methods: not on vLLM, which verifies one candidate a step, and
        not with CUDA graphs, where a token tree runs eagerly: on an H100 a racing step took 27-42 ms
        against 6-8 ms for a graphed one (about one a rollout, 3% of a 1.2 s T=0 rollout), and the
        cost profile, which times graphed steps, prices it as one of those."""
        return self.racing and self.backend == "torch" and not self.graphed

    @property
    def profile_backend(self) -> str:
        """What the verifier's cost profile is cached under: its backend, and on our engine on a
        GPU whether steps replay CUDA graphs (they cost several times less than eager ones)."""
        return GRAPHED_PROFILE if self.graphed else self.backend

    def check(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: choose one of {', '.join(MODES)}")
        unknown = [d for d in self.drafters if d not in METHODS]
        if unknown:
            raise ValueError(f"unknown drafting method {unknown[0]!r}: choose from {', '.join(METHODS)}")
        if self.mode != "autoregressive" and not self.drafters:
            raise ValueError(f"mode {self.mode} needs at least one drafter")
        if not 1 <= self.k <= self.max_window:
            raise ValueError(f"need 1 <= k <= window (got k={self.k}, window={self.max_window})")
        if self.max_batch < 1 or self.max_len < 2:
            raise ValueError(f"need max_batch >= 1 and max_len >= 2 (got {self.max_batch}, {self.max_len})")
        if self.max_restarts < 0:
            raise ValueError(f"need max_restarts >= 0 (got {self.max_restarts})")
        if not self.progress_every_s > 0:
            raise ValueError(f"need progress_every_s > 0 (got {self.progress_every_s})")
        if self.max_in_flight < 1:
            raise ValueError(f"need max_in_flight >= 1 (got {self.max_in_flight})")
        if self.processes and self.transport == "inproc":
            raise ValueError("processes=True needs transport ipc or tcp")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.profile not in PROFILES and not os.path.isfile(self.profile):
            raise ValueError(f"profile {self.profile!r}: no such file (or choose one of "
                             f"{', '.join(p for p in PROFILES if p)})")
        if self.draft_quant is not None and self.draft_quant not in DRAFT_QUANTS:
            raise ValueError(f"draft_quant {self.draft_quant!r}: choose one of {', '.join(DRAFT_QUANTS)}")
        if (self.draft_quant or "").startswith("llama-") and self.device != "cpu":
            raise ValueError(f"draft_quant {self.draft_quant} runs on llama.cpp's CPU kernels: needs device cpu "
                             f"(got {self.device})")
        check_device(self.device)
        if self.drafter_threads < 1:
            raise ValueError(f"need drafter_threads >= 1 (got {self.drafter_threads})")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.backend == "vllm":
            if not self.processes:
                raise ValueError("backend vllm runs vLLM in the verifier's own process: needs processes=True")

    @property
    def torch_dtype(self) -> "torch.dtype":
        return torch_dtype(self.dtype)

    @property
    def measure_profile(self) -> bool:
        """Whether the verifier measures this machine's cost profile when none is cached."""
        return self.mode == "specactor" and self.policy and self.profile in (None, "auto")

    @property
    def drafters_on_verifier(self) -> list[str]:
        """Active drafters that compute on the verifier's own hardware, so that their time adds to
        a step's instead of hiding beside it (the policy prices them so: ``CostModel.shared_methods``):
        a model drafter on the verifier's GPU, or on the CPU unless the user's thread split gives it
        cores of its own (the ``model`` drafter in its own process, ``verifier_threads`` and its
        ``drafter_threads`` within the machine's cores). The cheap drafters run on spare CPU cores
        beside a GPU, and cost microseconds on a CPU."""
        threads = self.verifier_threads
        own_cores = self.device == "cpu" and self.processes and threads is not None \
            and threads + self.drafter_threads <= (os.cpu_count() or 1)
        return [m for m in self.active_drafters if m in MODEL_METHODS and not (own_cores and m == "model")]

    @property
    def lent_threads(self) -> int:
        """Threads the verifier's forward adds while no request drafts with the model drafter: that
        drafter's own cores (``drafter_threads``), where it has them (not in :attr:`drafters_on_verifier`)
        and the verifier is our engine on the CPU with a thread count set."""
        model_own_cores = "model" in self.active_drafters and "model" not in self.drafters_on_verifier
        lend = self.mode == "specactor" and self.backend == "torch" and self.device == "cpu" and model_own_cores
        return self.drafter_threads if lend else 0

    @property
    def active_drafters(self) -> list[str]:
        if self.mode == "autoregressive":
            return []
        return self.drafters[:1] if self.mode == "coupled" else list(self.drafters)


def torch_dtype(name: str) -> "torch.dtype":
    """The torch dtype called ``name`` (one of :data:`DTYPES`)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def check_device(device: str) -> None:
    """Refuse a device this torch cannot use, saying why (before any process starts)."""
    if device == "cpu":
        return
    if not re.fullmatch(r"cuda(:\d+)?", device):
        raise ValueError(f"device {device!r}: choose cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch ({torch.__version__}) sees no CUDA GPU")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
