"""A pool of rollout replicas on Ray: the RolloutEngine API over many engines (``docs/ray.md``)."""

from specactor.pool.pool import RolloutPool

__all__ = ["RolloutPool"]
