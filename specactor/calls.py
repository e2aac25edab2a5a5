"""The call shape shared by RolloutEngine and RolloutClient, and the expansion of
a call into samples.

Two forms of ``generate`` / ``stream``:

- batch: ``generate([prompt_ids, ...], params, request_ids=[...])`` -> one
  result per sample, in input order;
- single (verl's server contract): ``generate(prompt_ids, params,
  request_id="x")`` -> one :class:`RequestResult` when ``n == 1``, the ``n``
  results in sample order otherwise.

A call is checked whole before anything is submitted: a bad request rejects the
call with a ValueError that names it.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Collection, Sequence as Seq

from specactor import protocol as p
from specactor.seeds import sample_request_id, sample_seed

#: Sampling params as a call takes them: one for every prompt, or one per prompt.
Params = p.SamplingParams | Seq[p.SamplingParams]


@dataclass(frozen=True)
class Call:
    """A call normalised to the batch form; ``single`` says how to shape the answer."""

    prompt_ids: list[list[int]]
    params: p.SamplingParams | list[p.SamplingParams]
    request_ids: list[str] | None
    single: bool

    def shape(self, results: list[p.RequestResult]) -> Any:
        """What ``generate`` returns: a list (batch), or one result / the n samples (single)."""
        if self.single and len(results) == 1:
            return results[0]
        return results


def normalise(prompt_ids: Any, sampling_params: Params | None, request_ids: Seq[str] | None,
              request_id: str | None) -> Call:
    """Accept the batch and the single-request form; refuse a mix of the two."""
    params = p.SamplingParams() if sampling_params is None else sampling_params
    if not hasattr(prompt_ids, "__len__"):  # a generator of prompts
        prompt_ids = list(prompt_ids)
    single = request_id is not None or (len(prompt_ids) > 0 and not _is_sequence(prompt_ids[0]))
    if not single:
        return Call([_as_list(ids) for ids in prompt_ids], params if isinstance(params, p.SamplingParams)
                    else list(params), None if request_ids is None else list(request_ids), False)
    if request_ids is not None:
        raise ValueError("a single request takes request_id=..., not request_ids")
    if not isinstance(params, p.SamplingParams):
        raise ValueError("a single request takes one SamplingParams")
    if len(prompt_ids) and _is_sequence(prompt_ids[0]):
        raise ValueError("request_id names one request: pass its prompt as a flat list of token ids "
                         "(or use request_ids=[...] for a batch)")
    return Call([_as_list(prompt_ids)], params, None if request_id is None else [request_id], True)


def check_not_in_flight(request_ids: Seq[str], in_flight: Collection[str]) -> None:
    """Every id is new: neither in flight nor given twice (ValueError naming the first that is not)."""
    seen: set[str] = set()
    for request_id in request_ids:
        if request_id in in_flight or request_id in seen:
            raise ValueError(f"request id {request_id!r} is already in flight")
        seen.add(request_id)


def check_group_ids(call: Call, group_ids: Seq[str] | None) -> list[str] | None:
    """A call's group ids (one per prompt: prompts sharing one run together on a pool's replica),
    checked; ValueError naming what is wrong."""
    if group_ids is None:
        return None
    if isinstance(group_ids, str) or len(group_ids) != len(call.prompt_ids):
        raise ValueError(f"group_ids needs one id per prompt ({len(call.prompt_ids)}), got "
                         f"{1 if isinstance(group_ids, str) else len(group_ids)}")
    if not all(isinstance(g, str) and g for g in group_ids):
        raise ValueError("group ids must be non-empty strings")
    return list(group_ids)


def _is_sequence(value: Any) -> bool:
    """A list, tuple or array of at least one dimension (a tensor's element is 0-d)."""
    return isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) >= 1


def _as_list(ids: Any) -> list[int]:
    """Token ids as plain Python values (tensors and arrays through ``tolist``)."""
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


@dataclass(frozen=True)
class Job:
    """One sample, ready to submit."""

    request_id: str  # the sample's id (``id`` when n == 1, else ``id#sample``)
    parent_id: str  # the request's id, as the caller named it
    sample: int
    prompt_ids: list[int]
    params: p.SamplingParams  # n == 1, seed set


async def as_finished(submitted: list[tuple[str, "asyncio.Future[p.RequestResult]"]],
                      ) -> AsyncIterator[p.RequestResult]:
    """The results of submitted samples, each as soon as it finishes (``stream``'s order)."""
    for done in asyncio.as_completed([future for _, future in submitted]):
        yield await done


def new_request_id() -> str:
    """An id for a request the caller did not name: fresh and unique (so its noise is too)."""
    return f"req-{uuid.uuid4().hex[:16]}"


#: the id the verifier keeps the policy's choice for requests yet to come under
RESERVED_REQUEST_IDS = ("*",)


def expand(call: Call, *, vocab_size: int | None, max_len: int, default_seed: int,
           in_flight: Collection[str] = (), max_in_flight: int | None = None) -> list[Job]:
    """One job per sample, every request checked first (ValueError naming the bad one), and the
    number of samples before any is made: ``n`` comes from the caller, and a call asking for
    2**62 samples must be refused at once, not expanded."""
    prompts = call.prompt_ids
    params = call.params if isinstance(call.params, list) else [call.params] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
    ids = call.request_ids if call.request_ids is not None else [new_request_id() for _ in prompts]
    if len(ids) != len(prompts):
        raise ValueError(f"{len(ids)} request ids for {len(prompts)} prompts")
    for rid, prompt, sp in zip(ids, prompts, params):
        sp.validate()
        check_prompt(rid, prompt, sp, vocab_size, max_len)
    samples = sum(sp.n for sp in params)
    if max_in_flight is not None and samples + len(in_flight) > max_in_flight:
        raise ValueError(f"the call asks for {samples} samples with {len(in_flight)} in flight: the engine takes "
                         f"at most {max_in_flight} at a time (EngineConfig.max_in_flight); wait for results or "
                         f"split the call")
    jobs = []
    for rid, prompt, sp in zip(ids, prompts, params):
        for sample in range(sp.n):
            one = p.SamplingParams(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                                   max_tokens=sp.max_tokens, stop_token_ids=list(sp.stop_token_ids),
                                   seed=sample_seed(sp.seed, rid, sample, default_seed), n=1, logprobs=sp.logprobs)
            jobs.append(Job(sample_request_id(rid, sample, sp.n), rid, sample, prompt, one))
    seen: set[str] = set()
    for job in jobs:
        if job.request_id in seen or job.request_id in in_flight:
            raise ValueError(f"duplicate request id {job.request_id!r}: " + (
                "it is already in flight" if job.request_id in in_flight else "used twice in this call"))
        seen.add(job.request_id)
    return jobs


def check_prompt(request_id: Any, ids: Seq[int], sp: p.SamplingParams, vocab: int | None, max_len: int) -> None:
    """Raise ValueError naming what makes one request impossible to serve."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request id must be a non-empty string, got {request_id!r}")
    if request_id in RESERVED_REQUEST_IDS:
        raise ValueError(f"request id {request_id!r} is reserved: choose another")
    if len(ids) == 0:
        raise ValueError(f"request {request_id!r}: prompt is empty")
    not_int = next((t for t in ids if not isinstance(t, int) or isinstance(t, bool)), None)
    if not_int is not None:
        raise ValueError(f"request {request_id!r}: token ids must be Python ints, got {type(not_int).__name__} "
                         f"{not_int!r} (pass a tensor or array whole: it is converted with tolist())")
    bad = next((t for t in ids if not 0 <= t < (vocab if vocab is not None else 2**63)), None)
    if bad is not None:
        raise ValueError(f"request {request_id!r}: token id {bad!r} is outside the vocabulary"
                         + (f" (size {vocab})" if vocab is not None else ""))
    bad_stop = next((t for t in sp.stop_token_ids if vocab is not None and t >= vocab), None)
    if bad_stop is not None:
        raise ValueError(f"request {request_id!r}: stop token id {bad_stop} is outside the vocabulary "
                         f"(size {vocab})")
    if len(ids) + sp.max_tokens > max_len:
        raise ValueError(f"request {request_id!r}: prompt ({len(ids)} tokens) + max_tokens ({sp.max_tokens}) "
                         f"exceeds the context of {max_len} tokens")
