"""A finished rollout as the policy simulator's workload: its own tokens replayed through the real drafters.

The simulator's own requests draw accepted lengths from the geometric law the cost model assumes,
which is not what drafters do (a suffix drafter's first token is right 38% of the time at T=0,
its next ones 84-100% once it is in a run; ``bench/drafter_steps.py``). Under specactor's
position-keyed sampling a draft token is accepted iff it equals the token the sample committed at
that position, at any temperature, so a rollout's output gives every draft's exact verdict with
no model run: a policy can be run on the real acceptance process, step by step, and two policies
compared on the same workload without the machine's noise (the step times come from a cost
profile). One drafter per method serves every request, as the drafter actors do, so a suffix
drafter sees the sibling samples in flight and the ones that finished. What it leaves out: the
decoupled drafters' lookahead (drafts here are always made on the committed prefix), prefill
(every request starts in the same step), and drafting time beyond the cost model's.

A *clairvoyant* request feeds, each step, the longest right prefix of any of its methods' drafts
and no wrong token: every token these drafters get right, known in advance, which is what a
policy over them could at best make of the workload (a ceiling for the policy, where the perfect
drafter is one for the drafters). It is not a strict bound: feeding every right token is not
always worth its cost at a large batch, and a policy could decline some.
"""

from __future__ import annotations

import random
from pathlib import Path

from specactor.bench.replay import load_rollout
from specactor.bench.replay_learned import LEARNED, TeacherForcedDrafter, sample_key
from specactor.drafters.base import DraftState
from specactor.drafters.ngram import NgramDrafter
from specactor.drafters.suffix import SuffixDrafter

#: the drafters a replay can run: the cheap ones, and the learned drafter from its teacher-forced
#: predictions (``drafter_options[LEARNED]["predictions"]``, :mod:`specactor.bench.replay_learned`)
REPLAY_METHODS = {"ngram": NgramDrafter, "suffix": SuffixDrafter, LEARNED: TeacherForcedDrafter}


class ReplayRequest:
    """One sample of a rollout, drafted for by drafters shared with the workload's other requests."""

    def __init__(self, request_id: str, prompt: list[int], output: list[int], drafters: dict[str, object],
                 clairvoyant: bool = False, limit: int | None = None, greedy: bool = False) -> None:
        if not output:
            raise ValueError(f"sample {request_id} has no output tokens to replay")
        self.request_id, self.output, self.length = request_id, list(output), len(output)
        self.limit, self.greedy = limit, greedy  # what the policy is told (the simulator's module docstring)
        self.clairvoyant = clairvoyant
        self.drafters = drafters
        self.states = {m: DraftState(request_id, list(prompt), []) for m in drafters}
        for m, d in drafters.items():
            d.start(self.states[m])

    def draft(self, method: str, committed: int, window: int, rng: random.Random) -> tuple[int, int]:
        """(drafted, accepted): ``method``'s draft of up to ``window`` tokens on the committed prefix,
        right up to the first token that differs from the sample's. Clairvoyant: the most any method
        has right, and only those tokens."""
        if self.clairvoyant:
            right = max(self._draft(m, committed, window) for m in self.drafters)
            return right, right
        proposal = self.drafters[method].propose([self.states[method]], window)[0][:window]
        return len(proposal), self._right(proposal, committed)

    def _draft(self, method: str, committed: int, window: int) -> int:
        return self._right(self.drafters[method].propose([self.states[method]], window)[0][:window], committed)

    def _right(self, proposal: list[int], committed: int) -> int:
        truth = self.output[committed:committed + len(proposal)]
        ok = 0
        while ok < len(truth) and proposal[ok] == truth[ok]:
            ok += 1
        return ok

    def tokens(self, start: int, count: int) -> list[int]:
        """The sample's tokens there, which the policy is told as the verifier tells it."""
        return self.output[start:start + count]

    def commit(self, committed: int, tokens: int) -> None:
        new = self.output[committed:committed + tokens]
        for m, d in self.drafters.items():
            state = self.states[m]
            state.committed += new
            d.observe(state, committed, new)
            if committed + tokens >= self.length:
                d.finish(state)  # into the drafter's history, as a finished request is


def replay_requests(samples: list[tuple[str, list[int], list[int]]], methods: list[str],
                    history: list[tuple[list[int], list[int]]] = (), clairvoyant: bool = False,
                    drafter_options: dict[str, dict] | None = None, limit: int | None = None,
                    greedy: bool = False) -> list[ReplayRequest]:
    """Simulator requests for ``(request id, prompt ids, output ids)`` samples, drafted for by fresh
    drafters of ``methods`` (built with ``drafter_options[method]``, e.g. ``{"ngram": {"min_n": 3}}``)
    that hold ``history`` (earlier epochs' (prompt, output) pairs) as finished outputs, as the
    drafter actors do after an epoch. Empty outputs are left out. ``limit`` and ``greedy``: the
    rollout's max_tokens (None: not known) and whether it decoded at temperature 0, which the policy
    is told."""
    unknown = [m for m in methods if m not in REPLAY_METHODS]
    if unknown:
        raise ValueError(f"cannot replay {', '.join(unknown)}: replayable drafters are "
                         f"{', '.join(REPLAY_METHODS)}")
    drafters = {m: REPLAY_METHODS[m](**(drafter_options or {}).get(m, {})) for m in methods}
    for i, (prompt, output) in enumerate(history):
        for d in drafters.values():
            state = DraftState(f"history-{i}", list(prompt), [])
            d.start(state)
            state.committed += list(output)
            d.observe(state, 0, list(output))
            d.finish(state)
    return [ReplayRequest(rid, prompt, output, drafters, clairvoyant, limit, greedy)
            for rid, prompt, output in samples if output]


def rollout_samples(path: str | Path) -> list[tuple[str, list[int], list[int]]]:
    """A ``specactor rollout`` output file's samples as (``id#sample``, prompt ids, output ids)."""
    return samples_of(load_rollout(path))


def samples_of(rows: list[dict]) -> list[tuple[str, list[int], list[int]]]:
    """:func:`specactor.bench.replay.load_rollout`'s rows as (``id#sample``, prompt ids, output ids)."""
    return [(sample_key(row), row["prompt_ids"], row["token_ids"]) for row in rows]


def rollout_limit(rows: list[dict]) -> int | None:
    """The rollout's max_tokens as far as its rows show it: the length of the samples that stopped at
    their limit (finish reason ``length``); None where none did (the limit is then not known)."""
    capped = [len(row["token_ids"]) for row in rows if row.get("finish_reason") == "length"]
    return max(capped) if capped else None


def looks_greedy(rows: list[dict]) -> bool:
    """Whether the rollout decoded at temperature 0, as far as its rows show it (they do not record
    the temperature): a prompt's samples are then all the same tokens, while at any temperature
    above 0 their position-keyed noise differs. False where no prompt has two samples."""
    groups: dict[str, list[list[int]]] = {}
    for row in rows:
        groups.setdefault(str(row["id"]), []).append(row["token_ids"])
    siblings = [g for g in groups.values() if len(g) > 1]
    return bool(siblings) and all(all(s == g[0] for s in g) for g in siblings)


def told_of(rows: list[dict], temperature: float | None = None, max_tokens: int | None = None
            ) -> tuple[int | None, bool]:
    """(max_tokens, greedy) the policy is told of a replayed rollout: what the caller says, else what
    its rows show (:func:`rollout_limit`, :func:`looks_greedy`)."""
    greedy = looks_greedy(rows) if temperature is None else temperature == 0
    return max_tokens or rollout_limit(rows), greedy


def replay_workload(path: str | Path, methods: list[str], clairvoyant: bool = False,
                    drafter_options: dict[str, dict] | None = None) -> list[ReplayRequest]:
    """The samples of a ``specactor rollout`` output file as simulator requests (fresh drafters:
    replay the same file twice with two calls)."""
    return replay_requests(rollout_samples(path), methods, clairvoyant=clairvoyant, drafter_options=drafter_options)
