"""The whole patch surface on vLLM (written against 0.32.0; checked at import).

Four pieces, each the smallest hook vLLM offers:

- :class:`NullProposer`, vLLM's ``custom_class`` speculative method: it switches
  the verification path on (logits for every draft position, the rejection
  step) and proposes nothing itself.
- :class:`SpecActorScheduler` (``scheduler_cls``): before each step it puts the
  drafts specactor's drafters made for each request (keyed by request, which a
  proposer never sees) on the running requests that can take them, and it
  keeps what was really scheduled, so verdicts count only verified drafts.
- :func:`position_keyed_sample` replaces the model runner's sampling step:
  every row samples with specactor's position-keyed sampler (noise keyed by
  the request's seed and the output position), and a draft token is accepted
  iff it equals the target's own sample at its position. The bonus row and the
  rows of requests without drafts go through the same rule, so the output is
  what decoding without drafts gives, whatever the drafts are. Log-probs of
  the emitted tokens are handed to the engine through :data:`LOGPROBS`
  (in-process engine core).
- :func:`refresh_lm_head`, run after a weight reload: the CPU kernels' packed
  copy of a tied LM head is otherwise left on the old weights.
"""

from __future__ import annotations

from typing import Any

import torch

from specactor.vllm_backend import require_vllm

require_vllm()

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import SamplerOutput  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

from specactor.engine.sampler import SamplingBatch, sample  # noqa: E402

#: SamplingParams.extra_args key: [seed, resumed output tokens, temperature, top_k, top_p]
EXTRA_KEY = "specactor"
#: internal request id -> log-probs of the tokens the last step emitted for it
LOGPROBS: dict[str, list[float]] = {}


class NullProposer:
    """vLLM's custom speculative method: turns verification on, drafts nothing."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config

    def load_model(self, model: Any) -> None:
        """Nothing to load (vLLM's CPU runner calls this unconditionally)."""

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]


class SpecActorScheduler(Scheduler):
    """vLLM's scheduler, with specactor's drafts on the requests instead of a proposer's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.external_drafts: dict[str, list[int]] = {}  # internal id -> draft, for the next step only
        self.scheduled_drafts: dict[str, list[int]] = {}  # what the last schedule() really verifies

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        """The runner's (empty) proposals are ignored: drafts come from specactor's drafters."""

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        drafts, self.external_drafts = self.external_drafts, {}
        for request in self.running:
            draft = drafts.get(request.request_id)
            # only a request whose next step decodes (not a prefill chunk, nothing in flight) takes a draft
            ready = (draft and not request.is_prefill_chunk and request.num_output_placeholders == 0
                     and request.num_computed_tokens == request.num_tokens - 1)
            request.spec_token_ids = list(draft[: self.num_spec_tokens]) if ready else []
        output = super().schedule(*args, **kwargs)
        self.scheduled_drafts = {rid: list(t) for rid, t in output.scheduled_spec_decode_tokens.items()}
        return output

    @staticmethod
    def of(llm: Any) -> "SpecActorScheduler":
        """The scheduler of an in-process ``LLMEngine`` built with this class (vLLM keeps it on
        its engine core, which has no public accessor)."""
        core = getattr(llm.engine_core, "engine_core", None)
        if core is None:  # a client of an engine-core process: its scheduler is in that process
            raise RuntimeError("vLLM's engine core runs in another process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                               "before building the engine (VllmEngine does)")
        scheduler = core.scheduler
        if not isinstance(scheduler, SpecActorScheduler):
            raise RuntimeError(f"the engine's scheduler is {type(scheduler).__name__}, not SpecActorScheduler: "
                               "build it with scheduler_cls='specactor.vllm_backend.patch.SpecActorScheduler'")
        return scheduler


def position_keyed_sample(self: GPUModelRunner, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
    """Replaces ``GPUModelRunner._sample``: specactor's sampling rule on every row."""
    batch = self.input_batch
    req_ids = list(batch.req_ids)
    if logits is None:  # nothing sampled this step (a pipeline stage without the head)
        return _original_sample(self, logits, spec_decode_metadata)
    keyed = [EXTRA_KEY in (self.requests[rid].sampling_params.extra_args or {}) for rid in req_ids]
    if not any(keyed):  # plain vLLM requests only: vLLM's own sampler (the reference a test compares with)
        return _original_sample(self, logits, spec_decode_metadata)
    if not all(keyed):
        raise ValueError("a vLLM batch mixes specactor's requests with plain vLLM ones: "
                         "serve plain requests from another engine, or give them specactor's sampling")
    if spec_decode_metadata is None:  # one row per request
        rows_per_req = [[i] for i in range(len(req_ids))]
        drafts: list[list[int]] = [[] for _ in req_ids]
    else:
        meta = spec_decode_metadata
        targets = meta.target_logits_indices.tolist()
        bonus = meta.bonus_logits_indices.tolist()
        draft_ids = meta.draft_token_ids.tolist()
        rows_per_req, drafts, at = [], [], 0
        for i, n in enumerate(meta.num_draft_tokens):
            rows_per_req.append(targets[at:at + n] + [bonus[i]])
            drafts.append(draft_ids[at:at + n])
            at += n
    rows: list[int] = []
    keys: list[tuple[float, int, float, int, int]] = []
    for i, rid in enumerate(req_ids):
        state = self.requests[rid]
        seed, resumed, temperature, top_k, top_p = state.sampling_params.extra_args[EXTRA_KEY]
        base = resumed + len(state.output_token_ids)  # output position the first row predicts
        for j, row in enumerate(rows_per_req[i]):
            rows.append(row)
            keys.append((temperature, top_k, top_p, seed, base + j))
    picked, logprobs = sample(logits[torch.tensor(rows, device=logits.device)].float(),
                              SamplingBatch.build(keys, logits.device))
    picked_list, logprob_list = picked.tolist(), logprobs.tolist()
    width = max(len(r) for r in rows_per_req)
    out = torch.full((len(req_ids), width), -1, dtype=torch.int32)
    at = 0
    for i, rid in enumerate(req_ids):
        n = len(rows_per_req[i])
        picks, lps = picked_list[at:at + n], logprob_list[at:at + n]
        at += n
        accepted = 0
        while accepted < len(drafts[i]) and drafts[i][accepted] == picks[accepted]:
            accepted += 1
        out[i, :accepted + 1] = torch.tensor(picks[:accepted + 1], dtype=torch.int32)
        LOGPROBS[rid] = lps[:accepted + 1]
    return SamplerOutput(sampled_token_ids=out.to(logits.device), logprobs_tensors=None)


def refresh_lm_head(worker: Any) -> bool:
    """After an in-place weight reload: vLLM's CPU kernels keep a repacked copy of the LM head,
    made when the model loaded, and a reload does not remake it for a head tied to the embedding
    (measured: new embedding, old head). Remake it from the head's current weight."""
    head = getattr(worker.model_runner.get_model(), "lm_head", None)
    if head is None or not hasattr(head, "cpu_linear"):
        return False
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
    return True


_original_sample = GPUModelRunner._sample
GPUModelRunner._sample = position_keyed_sample  # type: ignore[method-assign]
