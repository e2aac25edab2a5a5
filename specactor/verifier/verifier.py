"""The verification loop's core, free of any messaging: engine + draft book.

Each step takes the freshest usable draft of every running request (trimmed
to its window), verifies all of them in one batched forward, and returns the
verdicts. A request with no usable draft still advances one token, so
progress never depends on a drafter. The VerifyActor runs this; tests drive it
directly with adversarial drafters.
"""

from __future__ import annotations

from specactor.verifier.drafts import DraftBook
from specactor.verifier.engine import Engine, Sequence, StepReport


class Verifier:
    def __init__(self, engine: Engine, default_window: int = 8) -> None:
        if default_window < 0:
            raise ValueError(f"window must be >= 0, got {default_window}")
        self.engine = engine
        self.book = DraftBook()
        self.default_window = default_window
        self.windows: dict[str, int] = {}
        self.sequences: dict[str, Sequence] = {}
        #: request id -> output position the newest draft (even empty) was made for
        self.answered: dict[str, int] = {}

    def add(self, seq: Sequence, window: int | None = None) -> None:
        if seq.request_id in self.sequences:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        self.engine.add(seq)
        self.sequences[seq.request_id] = seq
        self.windows[seq.request_id] = self.default_window if window is None else window

    def add_draft(self, request_id: str, method: str, start: int, tokens: list[int]) -> bool:
        """Record a draft; False if the request is unknown or already finished."""
        if request_id not in self.sequences:
            return False
        self.book.add(request_id, method, start, tokens)
        self.answered[request_id] = max(self.answered.get(request_id, -1), start + len(tokens))
        return True

    def awaiting_drafts(self) -> list[str]:
        """Running, past-prefill requests with no draft reaching their next position.

        The coupled baseline waits for these before stepping; decoupled never waits.
        """
        engine = self.engine
        return [
            seq.request_id
            for slot, seq in enumerate(engine.running)
            if engine.cache.lengths[slot] > 0 and self.answered.get(seq.request_id, -1) < len(seq.output_ids)
        ]

    def collect_drafts(self) -> dict[str, tuple[str, list[int]]]:
        """The usable draft (method, tokens) of each running request, trimmed to its window."""
        drafts = {}
        for seq in self.engine.running:
            window = self.windows.get(seq.request_id, self.default_window)
            method, tokens = self.book.usable(seq.request_id, seq.output_ids, window)
            if tokens:
                drafts[seq.request_id] = (method, tokens)
        return drafts

    def retire(self, report: StepReport) -> None:
        """Forget what finished requests held."""
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
        self.answered.pop(request_id, None)

    def abort(self, request_id: str) -> Sequence | None:
        seq = self.engine.abort(request_id)
        if seq is not None:
            self._forget(request_id)
        return seq

    @property
    def has_work(self) -> bool:
        return self.engine.has_work
