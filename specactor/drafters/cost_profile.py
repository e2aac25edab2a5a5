"""What a model drafter's proposals cost at each batch size, measured once per machine and cached.

The policy drafts with the target's quantised copy only where it brings the end of the rollout
nearer, so it must know the copy's price before the first proposal, and at batch sizes it has
not seen yet. A straight line through what it has seen is wrong there: on a 2-core AVX-512 CPU
llama.cpp's q8_0 copy of the default model drafts a token for one row in 6.5 ms, for two rows in
15 ms and for eight in 28 ms (its batched 8-bit kernel is slower per row than its one-row kernel
until about four rows), while torch's int8 copy costs 53 / 21 / 35 ms per row-token at batch
1 / 4 / 8. So, as the verifier's steps are (:mod:`specactor.engine.profiling`), proposals are
timed on this machine over a grid of batch sizes, cached under the drafter's kind, quantisation,
threads and CPU, and the cost model interpolates that table, scaled online by what the drafter
then reports (:class:`specactor.policy.cost_model.DraftCost`).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from specactor.drafters.base import DraftState
from specactor.speculation import DRAFT_COST_STATS, DRAFT_PREFILL_STATS

#: bumped when what is measured changes (older cached tables are measured again)
DRAFT_PROFILE_VERSION = 2
#: the key of a table's prefill figure: seconds per context token a request's first proposal feeds
PREFILL = 0
#: batch sizes timed (those above the drafter's slots are left out)
DRAFT_BATCHES = (1, 2, 4, 8, 16, 32)


def measure_draft_cost(drafter: Any, batch_sizes: tuple[int, ...] = DRAFT_BATCHES, *, context: int = 128,
                       k: int = 4, repeats: int = 2, vocab_size: int | None = None) -> dict[int, float]:
    """Seconds per proposal round (one token for each row) at each batch size: ``k``-token
    proposals after a ``context``-token prompt per row (fed first), median of ``repeats``; under
    :data:`PREFILL` (0), the seconds per token of feeding one row's prompt. Requests are started
    and finished here: the drafter is left as it was."""
    slots = getattr(drafter, "max_slots", max(batch_sizes))
    max_len = getattr(drafter, "max_len", context + k * (repeats + 2))
    context = max(2, min(context, max_len - k * (repeats + 2)))
    vocab = vocab_size or getattr(drafter, "vocab_size", 1000)
    table: dict[int, float] = {}
    for batch in [b for b in batch_sizes if b <= slots]:
        states = [DraftState(f"cost-{batch}-{i}", [(7 + 131 * i + 17 * j) % vocab for j in range(context)],
                             seed=i, temperature=1.0) for i in range(batch)]
        for state in states:
            drafter.start(state)
        try:
            t0 = time.perf_counter()
            drafter.propose(states, 1)  # feeds the prompts
            if batch == 1:
                table[PREFILL] = (time.perf_counter() - t0) / context
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                drafts = drafter.propose(states, k)
                times.append((time.perf_counter() - t0) / max(1, max(map(len, drafts))))
                for state, draft in zip(states, drafts):
                    state.lookahead.extend(draft)
            table[batch] = statistics.median(times)
        finally:
            for state in states:
                drafter.finish(state)
    return table


def draft_profile_key(drafter: Any, model: str, threads: int) -> dict[str, Any]:
    """What a cached table must match: the drafter's kind and quantisation, the model folder's
    name, threads, CPU and cores."""
    import os

    from specactor.engine.profiling import cpu_model

    return {"drafter": type(drafter).__name__, "quant": str(getattr(drafter, "quant", "")),
            "model": Path(model).name, "threads": int(threads), "cpu": cpu_model(),
            "cores": os.cpu_count() or 0, "slots": int(getattr(drafter, "max_slots", 0)),
            "version": DRAFT_PROFILE_VERSION}


def draft_profile_path(key: dict[str, Any]) -> Path:
    import hashlib

    from specactor.engine.profiling import profiles_dir

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return profiles_dir() / f"draft-{key['drafter']}-{key['quant'] or 'none'}-t{key['threads']}-{digest}.json"


def ensure_draft_profile(drafter: Any, model: str, threads: int, *,
                         measure: Callable[[Any], dict[int, float]] = measure_draft_cost,
                         log: Any = None) -> dict[int, float]:
    """This machine's table for ``drafter`` (cached), measured now when none is cached or the
    cached one is unreadable or for another key."""
    from specactor.engine.profiling import write_profile

    key = draft_profile_key(drafter, model, threads)
    path = draft_profile_path(key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") == key:
            return check_draft_table({int(b): s for b, s in data["seconds"].items()}, str(path))
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        pass
    t0 = time.perf_counter()
    table = check_draft_table(measure(drafter), "measured")
    write_profile(path, {"key": key, "seconds": {str(b): s for b, s in table.items()}})
    if log is not None:
        log.info("draft.profiled", path=str(path), seconds=round(time.perf_counter() - t0, 2),
                 ms_by_batch={b: round(1000 * s, 2) for b, s in table.items()})
    return table


def check_draft_table(table: dict[int, float], name: str) -> dict[int, float]:
    """``table`` sorted by batch size; ValueError (naming ``name``) for an empty one, a batch
    size below 1 or a time that is not a positive number."""
    if not [b for b in table if b != PREFILL]:
        raise ValueError(f"{name}: no batch size in the drafter's cost table")
    for batch, seconds in table.items():
        if not isinstance(batch, int) or batch < 0:
            raise ValueError(f"{name}: batch size {batch!r} in the drafter's cost table")
        if not isinstance(seconds, (int, float)) or not 0 < seconds < 3600:
            raise ValueError(f"{name}: {seconds!r} s at batch {batch} in the drafter's cost table")
    return dict(sorted(table.items()))


def table_to_stats(table: dict[int, float]) -> dict[str, float]:
    """The table as StatsReply values (``draft_cost_s/<batch>``, ``draft_prefill_s``), as the
    policy reads them."""
    return {(DRAFT_PREFILL_STATS if b == PREFILL else f"{DRAFT_COST_STATS}{b}"): float(s) for b, s in table.items()}
