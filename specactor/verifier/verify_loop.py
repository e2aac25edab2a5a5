"""The verification loop's core, free of any messaging: engine + draft book.

Each step takes the freshest usable draft of every running request (trimmed
to its window), verifies all of them in one batched forward, and returns the
verdicts. A request with no usable draft still advances one token, so
progress never depends on a drafter. The VerifyActor runs this; tests drive it
directly with adversarial drafters.

Every usable draft that is not verified is still scored against what the step
commits (full information for the policy, at no extra forward): the other
methods' drafts of a speculating request, and the drafts of a *shadowed*
request (methods assigned with window 0: its drafters draft, nothing is
verified). With the position-keyed sampler a draft token is accepted exactly
when it equals the committed token, so such a score is what verification would
have said. A score that ran out of committed tokens before the draft
disagreed is censored (``drafted`` = what could be checked), not a rejection.
A shadowed request's draft is scored on every token the output passed since it
was stored, so one that arrives late counts its miss as well as its run.
"""

from __future__ import annotations

from specactor.verifier.drafts import DraftBook
from specactor.engine.llm_engine import Engine
from specactor.engine.sequence import Sequence, StepReport
from specactor.engine.tree import matched


def _score(draft: list[int], committed: list[int]) -> list[int]:
    """[drafted, accepted] of a draft nobody verified: a rejection only where the draft
    disagreed with a committed token; where the committed tokens ran out first, only
    what was checked counts as drafted (the rest is unknown, not wrong)."""
    got = matched(draft, committed)
    return [len(draft) if got < min(len(draft), len(committed)) else got, got]


class Verifier:
    def __init__(self, engine: Engine, default_window: int = 8) -> None:
        if default_window < 0:
            raise ValueError(f"window must be >= 0, got {default_window}")
        self.engine = engine
        self.book = DraftBook()
        self.default_window = default_window
        self.windows: dict[str, int] = {}
        self.sequences: dict[str, Sequence] = {}
        #: request id -> output position where its drafter last said it has nothing (an empty draft)
        self.nothing_at: dict[str, int] = {}
        #: request id -> the methods whose drafts it uses (absent: any), and which race
        self.methods: dict[str, list[str]] = {}
        self.racing: set[str] = set()
        self._offered: dict[str, list[tuple[str, list[int]]]] = {}  # this step's unverified alternatives

    def assign(self, request_id: str, methods: list[str] | None, window: int | None = None,
               race: bool = False) -> None:
        """Use only ``methods``' drafts for the request (all of them, as a token tree, if ``race``)."""
        if methods is None:
            self.methods.pop(request_id, None)
        else:
            self.methods[request_id] = list(methods)
            for method in set(self.book.methods(request_id)) - set(methods):
                self.book.drop_method(request_id, method)
        if window is not None:
            self.windows[request_id] = window
        if race and methods and len(methods) > 1:
            self.racing.add(request_id)
        else:
            self.racing.discard(request_id)

    def add(self, seq: Sequence, window: int | None = None) -> None:
        if seq.request_id in self.sequences:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        self.engine.add(seq)
        self.sequences[seq.request_id] = seq
        self.windows[seq.request_id] = self.default_window if window is None else window

    def add_draft(self, request_id: str, method: str, start: int, tokens: list[int]) -> bool:
        """Record a draft; False if the request is unknown or already finished."""
        seq = self.sequences.get(request_id)
        if seq is None:
            return False
        # on the event loop while the step thread may append to output_ids: it only ever grows,
        # and a contradiction found on a prefix of it stays one
        self.book.add(request_id, method, start, tokens, seq.output_ids)
        if not tokens:
            self.nothing_at[request_id] = start
        return True

    def awaiting_drafts(self) -> list[str]:
        """Running, past-prefill requests whose drafter has not yet answered their next position:
        no usable draft continues the committed output, and no empty draft said "nothing here".

        The coupled baseline waits for these before stepping; decoupled never waits. A draft
        the last step rejected part of does not answer: it reached past the output, but
        continues a future that did not happen (counting it made a coupled request step
        without drafts after every rejection: at T=1 the model drafter's 3.5 accepted tokens
        a step fell to 1.5).
        """
        engine = self.engine
        waiting = []
        for slot, seq in enumerate(engine.running):
            rid = seq.request_id
            if engine.cache.lengths[slot] == 0 or self.nothing_at.get(rid) == len(seq.output_ids):
                continue
            if not self.book.candidates(rid, seq.output_ids, 1, self.methods.get(rid)):
                waiting.append(rid)
        return waiting

    def collect_drafts(self) -> dict[str, tuple[str, list[int]] | list[tuple[str, list[int]]]]:
        """The usable draft (method, tokens) of each running request, trimmed to its
        window; for a racing request, every assigned method's usable draft."""
        drafts: dict[str, tuple[str, list[int]] | list[tuple[str, list[int]]]] = {}
        for seq in self.engine.running:
            rid = seq.request_id
            window = self.windows.get(rid, self.default_window)
            methods = self.methods.get(rid)
            if window <= 0:  # off, or shadowed: its drafts are scored after the step (retire), none verified
                continue
            if rid in self.racing:
                candidates = self.book.candidates(rid, seq.output_ids, window, methods)
                if candidates:
                    drafts[rid] = candidates
                continue
            candidates = self.book.candidates(rid, seq.output_ids, window, methods)
            if candidates:
                drafts[rid] = max(candidates, key=lambda c: len(c[1]))  # the first longest
                if len(candidates) > 1:
                    self._offered[rid] = candidates
        return drafts

    def _score_offered(self, report: StepReport) -> None:
        """Full information: score every usable draft, verified or not, against what was
        committed, so the policy learns each method's acceptance at no extra forward."""
        offered, self._offered = self._offered, {}
        for verdict in report.verdicts:
            candidates = offered.get(verdict.request_id)
            if candidates and not verdict.scores:
                verdict.scores = {m: _score(t, verdict.tokens) for m, t in candidates}

    def is_shadowed(self, request_id: str) -> bool:
        """Whether the request's drafts are scored and none verified: methods assigned, window 0."""
        return bool(self.methods.get(request_id)) and self.windows.get(request_id, self.default_window) <= 0

    def _score_shadowed(self, report: StepReport) -> None:
        """A shadowed request's drafts, scored on every token the output has passed since they were
        last scored (:meth:`DraftBook.settle`): this step's, and, for a draft that arrived late, the
        ones before it."""
        for verdict in report.verdicts:
            rid = verdict.request_id
            seq = self.sequences.get(rid)
            if seq is not None and self.is_shadowed(rid):
                scores = self.book.settle(rid, seq.output_ids, self.methods[rid])
                if scores:
                    verdict.scores = scores

    def retire(self, report: StepReport) -> None:
        """Score the drafts offered this step and the shadowed requests' drafts; forget what
        finished requests held."""
        self._score_offered(report)
        self._score_shadowed(report)
        for seq in report.finished:
            self._forget(seq.request_id)

    def step(self) -> StepReport:
        report = self.engine.step(self.collect_drafts())
        self.retire(report)
        return report

    def _forget(self, request_id: str) -> None:
        self.book.forget(request_id)
        self.sequences.pop(request_id, None)
        self.windows.pop(request_id, None)
        self.nothing_at.pop(request_id, None)
        self.methods.pop(request_id, None)
        self.racing.discard(request_id)

    def abort(self, request_id: str) -> Sequence | None:
        seq = self.engine.abort(request_id)
        if seq is not None:
            self._forget(request_id)
        return seq

    @property
    def has_work(self) -> bool:
        return self.engine.has_work
