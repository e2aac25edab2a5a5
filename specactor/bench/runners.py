"""One runner per kind of mode: our engine (autoregressive, coupled, specactor),
transformers ``generate`` (plain, and with prompt lookup), and vLLM when installed.

Each runs every epoch of one temperature on the same prompts and seeds, loads
the same policy update between epochs, and returns a RunRecord per epoch.
Model loading and process start-up are outside the timed part.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from specactor.bench.measure import Clock, PeakMemory, RunRecord
from specactor.config import EngineConfig
from specactor.protocol import SamplingParams
from specactor.seeds import sample_request_id, sample_seed


#: the weights to load before epoch 2, given the mode's first-epoch record (see bench/update.py)
Updater = Callable[[RunRecord], "dict[str, torch.Tensor]"]


@dataclass
class Workload:
    """HumanEval prompts x ``n`` samples, responses as long as the model's EOS makes them."""

    folder: Any
    prompt_ids: list[list[int]]
    problems: list[dict[str, Any]]
    n: int
    max_tokens: int
    epochs: int
    eos: set[int] = field(default_factory=set)
    engine: EngineConfig = field(default_factory=EngineConfig)  # the flags' settings, shared by every mode

    def request_ids(self) -> list[str]:
        return [p["task_id"] for p in self.problems]

    def seed(self, epoch: int) -> int:
        return 1000 + epoch

    def params(self, temperature: float, epoch: int) -> SamplingParams:
        return SamplingParams(temperature=temperature, max_tokens=self.max_tokens, n=self.n, seed=self.seed(epoch))

    def sample_ids(self) -> list[str]:
        """The names RolloutEngine gives the samples (``id`` when n == 1, else ``id#s``)."""
        return [sample_request_id(rid, s, self.n) for rid in self.request_ids() for s in range(self.n)]

    def sample_prompts(self) -> dict[str, list[int]]:
        """Each sample's prompt ids, by the sample's name."""
        return {sample_request_id(rid, s, self.n): prompt for rid, prompt in zip(self.request_ids(), self.prompt_ids)
                for s in range(self.n)}


@dataclass
class Mode:
    name: str
    kind: str  # engine | transformers | vllm
    engine_mode: str = "autoregressive"
    drafters: list[str] = field(default_factory=list)
    prompt_lookup: int = 0
    max_prompts: int | None = None  # run only the first prompts (a mode too slow for the whole workload)
    #: CPU cores of the model drafter's own (the verifier gets the rest, and these while it is idle)
    draft_cores: int = 0

    def note(self, work: Workload) -> str:
        """What the table must say about this mode's run, if it is not the whole workload."""
        if self.max_prompts is None or self.max_prompts >= len(work.prompt_ids):
            return ""
        return (f"first {self.max_prompts} of {len(work.prompt_ids)} prompts ({self.max_prompts * work.n} samples), "
                f"one sample at a time: not comparable with the full workload")


async def run_engine(mode: Mode, work: Workload, temperature: float,
                     update: Updater | None, events: str | None = None) -> list[RunRecord]:
    """Our engine, verifier in its own process; epochs on one engine, so drafters keep their history."""
    from specactor.rollout_engine import RolloutEngine

    config = replace(work.engine, mode=mode.engine_mode, drafters=mode.drafters or ["ngram"],
                     max_batch=len(work.prompt_ids) * work.n,
                     max_len=max(map(len, work.prompt_ids)) + work.max_tokens, events_path=events)
    if mode.draft_cores and config.device == "cpu":
        cores = config.verifier_threads or os.cpu_count() or 2
        config = replace(config, verifier_threads=max(1, cores - mode.draft_cores), drafter_threads=mode.draft_cores)
    records = []
    before = PeakMemory.tree_mb()
    async with RolloutEngine(config) as engine:
        for epoch in range(work.epochs):
            if epoch and update is not None:
                # made on first use (minutes of GRPO): off the event loop, so the actors' heartbeats go on
                await engine.update_weights(await asyncio.to_thread(update, records[0]))
            record = RunRecord(mode.name, temperature, epoch)
            with PeakMemory() as memory:
                clock = Clock()
                async for result in engine.stream(work.prompt_ids, work.params(temperature, epoch),
                                                  work.request_ids()):
                    record.finishes.append((clock.now(), len(result.token_ids)))
                    record.samples[result.request_id] = _engine_sample(result)
                    record.outputs[result.request_id] = result.token_ids
                    record.tokens += len(result.token_ids)
                    record.drafted += result.stats.drafted
                    record.accepted += result.stats.accepted
                    record.verified_drafts += sum(m.get("steps", 0) for m in result.stats.per_method.values())
                    record.policy_version = result.policy_version
                record.makespan_s = clock.now()
            record.set_memory(memory, before)
            records.append(record)
    return records


def _engine_sample(result: Any) -> dict[str, Any]:
    """What the ceilings need of one sample: its length, why it stopped, and each method's
    verified drafts (drafted tokens, accepted tokens, drafts) over its verify steps."""
    return {"tokens": len(result.token_ids), "finish_reason": str(result.finish_reason),
            "verify_steps": result.stats.verify_steps,
            "per_method": {m: {k: int(c.get(k, 0)) for k in ("drafted", "accepted", "steps")}
                           for m, c in result.stats.per_method.items()}}


def _plain_sample(tokens: list[int], work: Workload) -> dict[str, Any]:
    """A sample from another library: it stopped at the cap if it is max_tokens long and has no EOS."""
    capped = len(tokens) >= work.max_tokens and not (tokens and tokens[-1] in work.eos)
    return {"tokens": len(tokens), "finish_reason": "length" if capped else "stop"}


def _trim(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def run_transformers(mode: Mode, work: Workload, temperature: float,
                     update: Updater | None) -> list[RunRecord]:
    """transformers ``generate``: plain, batched with left padding (all samples at once, as a user
    would); with prompt lookup one sample at a time (transformers allows no batch there), on the
    mode's subset of the prompts."""
    import transformers

    before = PeakMemory.tree_mb()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(work.folder), dtype=work.engine.torch_dtype).eval()
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
        dict(do_sample=False)
    common = dict(max_new_tokens=work.max_tokens, eos_token_id=sorted(work.eos), pad_token_id=0, **sampling)
    prompts = list(zip(work.prompt_ids, work.request_ids()))[:mode.max_prompts]
    rows = [(sid, prompt) for prompt, rid in prompts for sid in (sample_request_id(rid, s, work.n)
                                                                 for s in range(work.n))]
    records = []
    for epoch in range(work.epochs):
        if epoch and update is not None:
            hf.load_state_dict(update(records[0]), strict=False)
        record = RunRecord(mode.name, temperature, epoch, note=mode.note(work))
        torch.manual_seed(work.seed(epoch))
        with PeakMemory() as memory, torch.no_grad():
            clock = Clock()
            if mode.prompt_lookup:
                for sid, prompt in rows:
                    out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      prompt_lookup_num_tokens=mode.prompt_lookup, **common)
                    record.outputs[sid] = _trim(out[0, len(prompt):].tolist(), work.eos)
                    record.finishes.append((clock.now(), len(record.outputs[sid])))
            else:
                width = max(len(p) for _, p in rows)
                ids = torch.tensor([[0] * (width - len(p)) + p for _, p in rows])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p in rows])
                out = hf.generate(ids, attention_mask=mask, **common)
                done = clock.now()  # a padded batch returns every sample at once
                for (sid, _), row in zip(rows, out[:, width:].tolist()):
                    record.outputs[sid] = _trim(row, work.eos)
                    record.finishes.append((done, len(record.outputs[sid])))
            record.makespan_s = clock.now()
        record.tokens = sum(len(t) for t in record.outputs.values())
        record.samples = {sid: _plain_sample(t, work) for sid, t in record.outputs.items()}
        record.set_memory(memory, before)
        records.append(record)
    return records


def vllm_available() -> str | None:
    """None if vLLM can run here (on a GPU, or its CPU build), else why not."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "vllm is not installed: `bash scripts/setup.sh --vllm` (its CPU build where there is no GPU)"
    if not (current_platform.is_cuda_alike() or current_platform.is_cpu()):
        return f"vllm found no device it can run on here (platform {current_platform.device_type or 'none'!r})"
    return None


def run_vllm(mode: Mode, work: Workload, temperature: float,
             update: Updater | None) -> list[RunRecord]:
    """Stock vLLM's offline engine on the same prompts and seeds (its own sampler: no token
    identity with the other modes at T > 0, so compare its tokens/s)."""
    import vllm
    from vllm.platforms import current_platform

    from specactor.vllm_backend.engine import VLLM_ENV, VllmModel

    cpu = {}
    if current_platform.is_cpu():  # the CPU build: eager, and never a chunked prefill (a seeded
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # one crashes vLLM 0.32 on CPU)
        cpu = {"enforce_eager": True, "max_num_batched_tokens": 32768}
    os.environ.update(VLLM_ENV)  # the engine core in this process: weight updates reach it in place
    before = PeakMemory.tree_mb()
    llm = vllm.LLM(model=str(work.folder), dtype=work.engine.dtype, seed=0, **cpu)
    records = []
    for epoch in range(work.epochs):
        if epoch and update is not None:  # in place, as the vllm backend updates its verifier
            VllmModel(llm, work.folder).load_hf_state_dict(update(records[0]))
        params = [vllm.SamplingParams(temperature=temperature, max_tokens=work.max_tokens,
                                      seed=sample_seed(work.seed(epoch), rid, s)) for rid in work.request_ids()
                  for s in range(work.n)]
        prompts = [vllm.TokensPrompt(prompt_token_ids=p) for p in work.prompt_ids for _ in range(work.n)]
        record = RunRecord(mode.name, temperature, epoch)
        with PeakMemory() as memory:
            clock = Clock()
            outs = llm.generate(prompts, params, use_tqdm=False)
            record.makespan_s = clock.now()
        for sid, out in zip(work.sample_ids(), outs):
            record.outputs[sid] = list(out.outputs[0].token_ids)
            record.finishes.append((record.makespan_s, len(record.outputs[sid])))
            record.samples[sid] = {"tokens": len(record.outputs[sid]),
                                   "finish_reason": str(out.outputs[0].finish_reason or "stop")}
        record.tokens = sum(len(t) for t in record.outputs.values())
        record.set_memory(memory, before)
        records.append(record)
    return records


def run_mode(mode: Mode, work: Workload, temperature: float,
             update: Updater | None, events: str | None = None) -> list[RunRecord]:
    """Every epoch of ``mode``; ``events``: where our engine writes its event log."""
    if mode.kind == "engine":
        return asyncio.run(run_engine(mode, work, temperature, update, events))
    if mode.kind == "transformers":
        return run_transformers(mode, work, temperature, update)
    if mode.kind == "vllm":
        return run_vllm(mode, work, temperature, update)
    raise ValueError(f"unknown mode kind {mode.kind!r}")

