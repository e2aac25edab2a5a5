"""The target-model engine: continuous batching over a slot KV cache.

``Engine.step()`` runs one batched forward for every active request: newly
admitted requests contribute their whole prompt (prefill), running ones their
newest token (decode), or, with speculation, their token plus a draft
(verification). Requests join between steps when a slot is free and leave when
they finish; the slots stay compact (``0..B-1``) by moving the last request's
cache into the freed slot. The samples of a group (GRPO's n per prompt) share
their prompt: one is prefilled, the others copy its cached prompt and feed only
its last token (a third of a rollout's forward time on 8 prompts x 4 on a CPU
was the same prompts prefilled four times each).

This class is the autoregressive baseline on its own, and the core of the
VerifyActor when drafts are supplied. Everything a request needs for its
output lives in its :class:`Sequence`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Iterable

import torch

from specactor.engine.cuda_graphs import GraphedSteps
from specactor.engine.kv_cache import KVCache
from specactor.engine.model import CausalLM
from specactor.engine.sampler import SamplingBatch, sample
from specactor.engine.step_clock import StepClock
from specactor.engine.sequence import Candidate, Sequence, ServesToCompletion, StepReport, check_sequence
from specactor.engine.tree import DraftTree, matched
from specactor.protocol import FinishReason, SamplingParams, Verdict


class Engine(ServesToCompletion):
    def __init__(
        self,
        model: CausalLM,
        *,
        max_batch: int = 32,
        max_len: int = 1024,
        eos_token_ids: Iterable[int] = (),
        max_prefill_tokens: int = 4096,
        device: torch.device | str | None = None,
        pack: bool = True,
        share_prompts: bool = True,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.model = model
        self.share_prompts = share_prompts  # a group's samples copy one prefilled prompt (see _admit)
        # prepacked weights make a CPU decode step ~1.5x faster and a verify step of a few tokens
        # cost little more than a decode step (specactor.engine.prepacked_linear): the engine owns the model
        self.packed = model.pack() if pack else False
        # the cache and every step's tensors live where the weights are, unless told otherwise
        self.device = torch.device(device) if device is not None else model.embed.weight.device
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = model.cfg.vocab_size
        dtype = model.embed.weight.dtype
        self.cache = KVCache(model.cfg, max_batch, max_len, dtype=dtype, device=self.device)
        # a step on a GPU is bound by launching its kernels: replay them as CUDA graphs (None: on a GPU)
        use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.graphs = GraphedSteps(model, self.cache) if use_graphs else None
        self.clock = StepClock(self.device)  # a forward's device time, also where it runs asynchronously
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # index = slot
        self.steps = 0

    # ------------------------------------------------------------------ requests

    def check(self, seq: Sequence) -> None:
        """Raise ValueError naming what makes ``seq`` impossible to serve."""
        check_sequence(seq, self.vocab_size, self.cache.max_len, self.eos_token_ids)

    def add(self, seq: Sequence) -> None:
        self.check(seq)
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        for seq in list(self.waiting):
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.finish_reason = FinishReason.ABORT
                return seq
        for slot, seq in enumerate(self.running):
            if seq.request_id == request_id:
                seq.finish_reason = FinishReason.ABORT
                self._release([slot])
                return seq
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def replays_graphs(self) -> bool:
        """Whether decode and verify steps replay captured CUDA graphs (on a GPU, unless told not to)."""
        return self.graphs is not None and self.graphs.capture

    def warm_up(self, prompt_len: int = 64) -> float:
        """Serve two throwaway requests (prompts of ``prompt_len`` and half that, two tokens each),
        so that the eager path's one-off costs come before serving: on an H100 the first eager
        step (a rollout's prefill) took 140-200 ms where later prefill steps took 33-58, in
        rollouts of 1.2 s. A CPU has no such cost (three identical prefills: 883, 843, 834 ms).
        Only while nothing is being served; the engine is left as it was. Returns its seconds."""
        if self.has_work:
            raise RuntimeError("warm_up() needs an idle engine: requests are being served")
        started = time.perf_counter()
        top = min(prompt_len, self.cache.max_len - 2)  # room for the two tokens
        if top < 1:
            return 0.0
        warm = [Sequence(f"warm-up-{i}", [(7 * j + i) % self.vocab_size for j in range(n)],
                         SamplingParams(temperature=1.0, max_tokens=2), seed=i)
                for i, n in enumerate((top, max(1, top // 2)))]
        for seq in warm:
            self.check(seq)  # all or nothing
        self.waiting.extend(warm)
        while self.has_work:
            self.step()
        return time.perf_counter() - started

    # ------------------------------------------------------------------ stepping

    def _admit(self) -> int:
        """Admit waiting requests while slots and the prefill budget last (at least one a step).

        A request whose prompt a running request has prefilled already (another sample of its
        group) copies that cached prompt instead, less its last token, which it feeds itself: its
        first sample comes from its own logits and seed, and the prompt's forward is paid once. A
        request whose prompt is prefilled in this very step waits for the next one, its slot kept,
        to copy it then."""
        budget = self.max_prefill_tokens
        admitted = 0
        prefilling: set[tuple[int, ...]] = set()  # prompts this step prefills
        deferred: list[Sequence] = []
        while self.waiting and len(self.running) + len(deferred) < self.max_batch:
            seq = self.waiting[0]
            shared = self.share_prompts and not seq.output_ids and len(seq.prompt_ids) > 1
            source = self._prefilled(seq.prompt_ids) if shared else None
            if source is not None:
                self.waiting.popleft()
                slot = len(self.running)
                self.running.append(seq)
                self.cache.copy_prefix(source, slot, len(seq.prompt_ids) - 1)
                admitted += 1
                continue
            key = tuple(seq.prompt_ids) if shared else None
            if key is not None and key in prefilling:
                deferred.append(self.waiting.popleft())
                continue
            n = seq.context_len
            if admitted and n > budget:
                break
            self.waiting.popleft()
            slot = len(self.running)
            self.running.append(seq)
            self.cache.lengths[slot] = 0
            budget -= n
            admitted += 1
            if key is not None:
                prefilling.add(key)
        self.waiting.extendleft(reversed(deferred))
        return admitted

    def _prefilled(self, prompt_ids: list[int]) -> int | None:
        """A running slot whose cache holds ``prompt_ids`` (all but the last token at least)."""
        need = len(prompt_ids) - 1
        for slot, seq in enumerate(self.running):
            if self.cache.lengths[slot] >= need and seq.prompt_ids == prompt_ids:
                return slot
        return None

    def _inputs(self, slot: int, extra: list[int]) -> list[int]:
        """Tokens row ``slot`` feeds this step: its context from where its cache ends (the whole
        prompt and any resumed output at a prefill; the prompt's last token after a shared
        prefill; the newest token when decoding), plus ``extra``."""
        seq, have = self.running[slot], self.cache.lengths[slot]
        prompt = len(seq.prompt_ids)
        if have >= prompt:
            return seq.output_ids[have - prompt:] + extra
        return seq.prompt_ids[have:] + seq.output_ids + extra

    def max_draft(self, slot: int) -> int:
        """How many draft tokens row ``slot`` can use this step (0 during prefill)."""
        seq = self.running[slot]
        if self.cache.lengths[slot] == 0:
            return 0
        return max(0, seq.params.max_tokens - len(seq.output_ids) - 1)

    def step(self, drafts: dict[str, Candidate | list[Candidate]] | None = None) -> StepReport:
        """One batched forward over all running requests; sample; retire finished.

        ``drafts`` maps request id -> (method, tokens proposed for the next
        output positions), or a list of such candidates (racing): several are
        merged into a token tree and verified in the same forward, and the
        longest accepted path is kept. A draft token is accepted only where it
        equals the target's own position-keyed sample, so the output is the
        same with or without drafts. Returns one Verdict per running request.
        """
        self._admit()
        if not self.running:
            return StepReport(0, 0, 0, 0.0, 0.0, [])
        drafts = drafts or {}
        proposals: list[list[Candidate]] = []
        trees: list[DraftTree | None] = []
        for slot, seq in enumerate(self.running):
            given = drafts.get(seq.request_id, [])
            candidates = [given] if isinstance(given, tuple) else list(given)
            limit = self.max_draft(slot)
            kept = [(m, list(t[:limit])) for m, t in candidates if t and limit]
            proposals.append(kept)
            trees.append(DraftTree.build([t for _, t in kept]) if len(kept) > 1 else None)
        rows, parents = [], []
        for slot in range(len(self.running)):
            tree = trees[slot]
            if tree is None:
                extra = proposals[slot][0][1] if proposals[slot] else []
                rows.append(self._inputs(slot, extra))
                parents.append(None)
            else:
                rows.append(self._inputs(slot, tree.tokens))
                parents.append([-1] + [q + 1 for q in tree.parents])
        q_lens = [len(r) for r in rows]
        prefill = sum(q for slot, q in enumerate(q_lens) if self.cache.lengths[slot] == 0)
        # Logits are needed at the last prompt/decode position and at each draft node.
        logit_rows: list[int] = []
        sampling: list[tuple[float, int, float, int, int]] = []
        offset = 0
        starts = list(self.cache.lengths[: len(q_lens)])
        fed = [q - 1 if starts[slot] else 0 for slot, q in enumerate(q_lens)]  # draft tokens (none at prefill)
        for slot, q in enumerate(q_lens):
            seq = self.running[slot]
            tree = trees[slot]
            nodes = fed[slot]
            p = seq.params
            for j in range(nodes + 1):
                logit_rows.append(offset + q - 1 - nodes + j)
                depth = j if tree is None or j == 0 else tree.depth(j - 1)
                sampling.append((p.temperature, p.top_k, p.top_p, seq.seed, len(seq.output_ids) + depth))
            offset += q
        self.clock.start()
        has_trees = any(t is not None for t in trees)
        graph = self.graphs.shape(q_lens, starts) if self.graphs is not None and not has_trees else None
        if graph is not None:
            assert self.graphs is not None
            logits = self.graphs.run(rows, logit_rows, graph)
        else:
            tokens = torch.tensor([t for r in rows for t in r], dtype=torch.int64, device=self.device)
            logits = self.model(tokens, q_lens, self.cache, torch.tensor(logit_rows, device=self.device),
                                parents if has_trees else None)
        self.clock.forward_queued()
        sampled, logprobs = sample(logits, SamplingBatch.build(sampling, self.device))
        sampled_list, logprob_list = sampled.tolist(), logprobs.tolist()
        forward_s, sample_s = self.clock.finish()
        captured = self.graphs.last_capture_s if graph is not None and self.graphs is not None else 0.0
        report = StepReport(len(q_lens), prefill, 0, forward_s, sample_s, [], graph=graph, capture_s=captured,
                            waiting=len(self.waiting))
        finished_slots = []
        i = 0
        for slot, seq in enumerate(self.running):
            tree, candidates = trees[slot], proposals[slot]
            targets = sampled_list[i : i + fed[slot] + 1]
            lps = logprob_list[i : i + fed[slot] + 1]
            i += fed[slot] + 1
            if tree is None:
                draft = candidates[0][1] if candidates else []
                accepted = matched(draft, targets)
                committed, committed_lps = targets[: accepted + 1], lps[: accepted + 1]
                self.cache.lengths[slot] -= len(draft) - accepted  # only the accepted prefix stays
            else:
                path = tree.walk(targets)
                accepted = len(path)
                picks = [0] + [n + 1 for n in path]  # logit rows: the root's, then each accepted node's
                committed = [targets[r] for r in picks]
                committed_lps = [lps[r] for r in picks]
                self.cache.keep_path(slot, starts[slot], [n + 1 for n in path])
            start = len(seq.output_ids)
            seq.steps += 1
            scores: dict[str, list[int]] = {}
            method = ""
            for name, draft in candidates:
                got = matched(draft, committed)
                scores[name] = [len(draft), got]
                seq.count_draft(name, len(draft), got)
                if not method or got > scores[method][1]:
                    method = name
            drafted = sum(len(d) for _, d in candidates)
            seq.drafted += drafted
            seq.accepted += accepted
            kept = self._commit(seq, committed, committed_lps)
            report.new_tokens += kept
            report.drafted += drafted
            report.accepted += accepted
            report.verdicts.append(Verdict(request_id=seq.request_id, start=start, tokens=seq.output_ids[start:],
                                           accepted=accepted, drafted=drafted, method=method,
                                           finished=seq.finished, scores=scores if tree is not None else {},
                                           max_tokens=seq.params.max_tokens, greedy=seq.params.temperature == 0,
                                           prompt_len=len(seq.prompt_ids)))
            if seq.finished:
                finished_slots.append(slot)
        report.finished = [self.running[s] for s in finished_slots]
        self._release(finished_slots)
        self.steps += 1
        return report

    def _commit(self, seq: Sequence, tokens: list[int], logprobs: list[float]) -> int:
        """Append tokens until a stop condition; returns how many were kept."""
        stops = self.eos_token_ids | set(seq.params.stop_token_ids)
        kept = 0
        for tok, lp in zip(tokens, logprobs):
            seq.output_ids.append(tok)
            seq.logprobs.append(lp)
            kept += 1
            if tok in stops:
                seq.finish_reason = FinishReason.STOP
            elif len(seq.output_ids) >= seq.params.max_tokens:
                seq.finish_reason = FinishReason.LENGTH
            if seq.finished:
                seq.finish_s = time.perf_counter()
                break
        return kept

    def _release(self, slots: list[int]) -> None:
        """Free finished slots, moving the last running requests down to keep slots compact."""
        for slot in sorted(slots, reverse=True):
            last = len(self.running) - 1
            if slot != last:
                self.cache.move(last, slot)
                self.running[slot] = self.running[last]
            self.cache.lengths[last] = 0
            self.running.pop()
