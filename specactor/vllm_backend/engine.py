"""VllmEngine: vLLM's engine core behind the contract of specactor's Engine.

The VerifyActor drives an engine through ``add``/``check``/``abort``/
``step(drafts)``/``running``/``has_work`` and loads weights through
``engine.model``. This class gives vLLM (in this process, synchronously: no
engine-core process, no async scheduling) that same face: each ``step`` puts
the given drafts on the requests through :class:`~specactor.vllm_backend.patch.SpecActorScheduler`,
runs one vLLM step, and turns what each request emitted into a Verdict.
A resumed request (``output_ids`` already set) is prefilled with prompt and
output; its sampling positions go on from where it was.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from specactor.protocol import FinishReason, Verdict
from specactor.engine.sequence import Candidate, Sequence, ServesToCompletion, StepReport, check_sequence
from specactor.engine.tree import matched

#: the settings vLLM must run with here: the engine core in this process, the V1 model runner (the
#: one the patch replaces a method of)
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}


@dataclass
class _Lengths:
    """``cache.lengths`` as the coupled barrier reads it: > 0 once a request is past its prefill."""

    engine: "VllmEngine"

    def __getitem__(self, slot: int) -> int:
        return len(self.engine.running[slot].output_ids) + 1 if slot < len(self.engine.running) else 0


@dataclass
class _Cache:
    engine: "VllmEngine"
    max_len: int
    lengths: _Lengths = field(init=False)

    def __post_init__(self) -> None:
        self.lengths = _Lengths(self.engine)


class VllmModel:
    """What weight updates need of ``engine.model``: the checkpoint's shapes and a loader."""

    def __init__(self, llm: Any, folder: Path) -> None:
        from specactor.engine.config import ModelConfig
        from specactor.engine.model import hf_shapes

        self.llm = llm
        self.cfg = ModelConfig.from_dir(folder)
        self._shapes = hf_shapes(self.cfg)

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def load_hf_state_dict(self, state: dict[str, Any]) -> None:
        """Load HF-named tensors into vLLM's model through its in-place reload (it fuses q/k/v and
        gate/up, and repacks for its CPU kernels, itself), then drop the prefix cache, whose entries
        were computed with the old weights."""
        items = list(state.items())
        from specactor.vllm_backend.patch import refresh_lm_head

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        self.llm.collective_rpc(refresh_lm_head)
        self.llm.reset_prefix_cache()


class VllmEngine(ServesToCompletion):
    def __init__(self, folder: str | Path, *, max_batch: int = 32, max_len: int = 1024,
                 eos_token_ids: Iterable[int] = (), max_draft: int = 8, dtype: str = "float32",
                 kv_cache_gb: int = 2, device: str = "cpu", threads: int | None = None,
                 prefix_caching: bool = True) -> None:
        for key, value in VLLM_ENV.items():
            os.environ[key] = value
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        # vLLM's CPU worker runs on one thread unless OMP_NUM_THREADS says otherwise
        os.environ.setdefault("OMP_NUM_THREADS", str(threads or os.cpu_count() or 1))
        from specactor.vllm_backend import patch  # installs the sampling rule; holds the scheduler
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.folder = Path(folder)
        args = EngineArgs(
            model=str(self.folder), tokenizer=str(self.folder), dtype=dtype, enforce_eager=True,
            max_model_len=max_len, max_num_seqs=max_batch, max_num_batched_tokens=max(max_len, 2048) * 2,
            # a GRPO group's samples share their prompt: vLLM's prefix cache computes it once
            enable_prefix_caching=prefix_caching, seed=0,
            speculative_config={"method": "custom_class", "model": "specactor.vllm_backend.patch.NullProposer",
                                "num_speculative_tokens": max_draft},
            scheduler_cls="specactor.vllm_backend.patch.SpecActorScheduler")
        self.llm = LLMEngine.from_engine_args(args)
        self.scheduler = patch.SpecActorScheduler.of(self.llm)
        self.model = VllmModel(self.llm, self.folder)
        self.vocab_size = self.model.cfg.vocab_size
        self.max_batch, self.max_draft, self.dtype, self.device = max_batch, max_draft, dtype, device
        self.eos_token_ids = frozenset(eos_token_ids)
        self.cache = _Cache(self, max_len)
        self.sequences: dict[str, Sequence] = {}  # internal id -> sequence, while vLLM holds it
        self.internal: dict[str, str] = {}  # request id -> internal id

    # ------------------------------------------------------------------ requests

    def check(self, seq: Sequence) -> None:
        """Raise ValueError naming what makes ``seq`` impossible to serve."""
        check_sequence(seq, self.vocab_size, self.cache.max_len, self.eos_token_ids)

    def add(self, seq: Sequence) -> None:
        from vllm import SamplingParams as VllmParams
        from vllm.sampling_params import RequestOutputKind

        from specactor.vllm_backend.patch import EXTRA_KEY

        self.check(seq)
        p = seq.params
        resumed = len(seq.output_ids)
        params = VllmParams(
            n=1, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else 0,
            max_tokens=p.max_tokens - resumed, stop_token_ids=sorted(self.eos_token_ids | set(p.stop_token_ids)),
            ignore_eos=True, detokenize=False, output_kind=RequestOutputKind.DELTA, skip_special_tokens=False,
            extra_args={EXTRA_KEY: [seq.seed, resumed, p.temperature, p.top_k, p.top_p]})
        internal = self.llm.add_request(seq.request_id, {"prompt_token_ids": seq.prompt_ids + seq.output_ids},
                                        params)
        self.sequences[internal] = seq
        self.internal[seq.request_id] = internal

    def abort(self, request_id: str) -> Sequence | None:
        internal = self.internal.pop(request_id, None)
        if internal is None:
            return None
        from specactor.vllm_backend.patch import LOGPROBS

        self.llm.abort_request([internal], internal=True)
        LOGPROBS.pop(internal, None)
        seq = self.sequences.pop(internal)
        seq.finish_reason = FinishReason.ABORT
        return seq

    @property
    def has_work(self) -> bool:
        return bool(self.sequences)

    @property
    def running(self) -> list[Sequence]:
        """The requests vLLM is running (drafts are taken for these)."""
        return [self.sequences[r.request_id] for r in self.scheduler.running if r.request_id in self.sequences]

    def max_draft_for(self, seq: Sequence) -> int:
        return max(0, min(self.max_draft, seq.params.max_tokens - len(seq.output_ids) - 1))

    # ------------------------------------------------------------------ stepping

    def step(self, drafts: dict[str, Candidate | list[Candidate]] | None = None) -> StepReport:
        """One vLLM step with ``drafts`` (request id -> (method, tokens); a list of candidates
        is not merged into a tree here: the longest is verified)."""
        from specactor.vllm_backend.patch import LOGPROBS

        given: dict[str, tuple[str, list[int]]] = {}
        for rid, candidate in (drafts or {}).items():
            internal = self.internal.get(rid)
            if internal is None:
                continue
            options = [candidate] if isinstance(candidate, tuple) else list(candidate)
            method, tokens = max(options, key=lambda c: len(c[1]))
            tokens = tokens[: self.max_draft_for(self.sequences[internal])]
            if tokens:
                given[internal] = (method, tokens)
        self.scheduler.external_drafts = {rid: tokens for rid, (_, tokens) in given.items()}
        batch = len(self.scheduler.running)
        t0 = time.perf_counter()
        outputs = self.llm.step()
        elapsed = time.perf_counter() - t0
        scheduled = self.scheduler.scheduled_drafts
        # requests vLLM still queues after this step (while any wait, the policy treats the batch as open)
        report = StepReport(batch, 0, 0, elapsed, 0.0, [], waiting=len(self.scheduler.waiting))
        for out in outputs:  # named by our request ids; the scheduler and runner use vLLM's internal ones
            internal = self.internal.get(out.request_id)
            seq = self.sequences.get(internal) if internal is not None else None
            if seq is None:
                continue
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            lps = LOGPROBS.pop(internal, [])[: len(tokens)]
            if len(lps) < len(tokens):
                lps += [0.0] * (len(tokens) - len(lps))
            verified = scheduled.get(internal, [])
            method = given.get(internal, ("", []))[0] if verified else ""
            accepted = matched(verified, tokens)
            start = len(seq.output_ids)
            if not seq.steps:  # its first output: what its prefill computed, less what the prefix cache had
                report.prefill_tokens += max(0, seq.context_len - (out.num_cached_tokens or 0))
            seq.steps += 1
            seq.output_ids.extend(tokens)
            seq.logprobs.extend(lps)
            if verified:
                seq.drafted += len(verified)
                seq.accepted += accepted
                seq.count_draft(method, len(verified), accepted)
            if out.finished:
                stops = self.eos_token_ids | set(seq.params.stop_token_ids)
                seq.finish_reason = FinishReason.STOP if seq.output_ids and seq.output_ids[-1] in stops \
                    else FinishReason.LENGTH
                seq.finish_s = time.perf_counter()
                self.sequences.pop(internal, None)
                self.internal.pop(seq.request_id, None)
                report.finished.append(seq)
            report.new_tokens += len(tokens)
            report.drafted += len(verified)
            report.accepted += accepted
            report.verdicts.append(Verdict(request_id=seq.request_id, start=start, tokens=tokens,
                                           accepted=accepted, drafted=len(verified), method=method,
                                           finished=seq.finished, max_tokens=seq.params.max_tokens,
                                           greedy=seq.params.temperature == 0, prompt_len=len(seq.prompt_ids)))
        return report
