"""Which replica serves a request: group-affine, sticky, then least loaded.

The router lives in the caller's process (the pool's event loop): a routing
decision is a few dictionary operations, with no message to another actor, so
it costs microseconds per request and scales with the caller, not with a
central router actor (``bench/pool.py`` measures it; ``docs/ray.md`` works out
64 and 512 replicas).

Rules, in order:

1. a **group** (all samples of one prompt, ``n > 1``, or requests the caller
   gave one group key) goes to one replica, so its prompt is prefilled once
   and the suffix drafter sees the siblings' outputs;
2. a group seen before (a multi-turn request id, a GRPO prompt's next call)
   goes back to the replica that served it, while that replica is up (an LRU of
   ``max_sticky`` keys);
3. otherwise the live replica with the fewest tokens outstanding (prompt plus
   ``max_tokens`` of each unfinished request), ties to the lowest index.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class Router:
    """Routing state for ``replicas`` replicas (see the module docstring)."""

    replicas: int
    max_sticky: int = 100_000
    outstanding: list[int] = field(default_factory=list)  # tokens outstanding per replica
    sticky: "OrderedDict[str, int]" = field(default_factory=OrderedDict)  # group key -> replica

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"a pool needs at least one replica, got {self.replicas}")
        if not self.outstanding:
            self.outstanding = [0] * self.replicas

    def route(self, group: str, tokens: int, live: Iterable[int]) -> int:
        """The replica for a group of requests worth ``tokens``, among the ``live`` ones; the
        tokens count as outstanding there until :meth:`finished` gives them back."""
        up = sorted(set(live))
        if not up:
            raise RuntimeError("no replica of the pool is up")
        replica = self.sticky.get(group)
        if replica is None or replica not in up:
            replica = min(up, key=lambda i: (self.outstanding[i], i))
        self.sticky[group] = replica
        self.sticky.move_to_end(group)
        while len(self.sticky) > self.max_sticky:
            self.sticky.popitem(last=False)
        self.outstanding[replica] += tokens
        return replica

    def finished(self, replica: int, tokens: int) -> None:
        """A request worth ``tokens`` left ``replica`` (finished, aborted, or moved elsewhere)."""
        self.outstanding[replica] = max(0, self.outstanding[replica] - tokens)

    def forget(self, replica: int) -> None:
        """``replica`` died: nothing is outstanding there any more (its requests are re-routed)."""
        self.outstanding[replica] = 0
