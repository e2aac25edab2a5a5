"""Where a pool's replicas run: Ray, its resources and one placement group.

One bundle per replica: ``{GPU: 1, CPU: c}`` on a GPU (``--device cuda``),
``{CPU: c}`` otherwise, ``c`` the replica's cores (its verifier's threads,
plus a model drafter's own). A replica Ray restarts goes back into its bundle.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from specactor.config import EngineConfig
from specactor.speculation import MODEL_METHODS

#: how long a pool waits for the cluster to have room for every replica
PLACEMENT_TIMEOUT_S = 120.0


def import_ray() -> Any:
    """Ray, or an ImportError saying how to get it (it is an optional extra)."""
    try:
        import ray
    except ImportError:
        raise ImportError("a pool of replicas runs on Ray: pip install 'specactor[ray]' "
                          "(or bash scripts/setup.sh --ray)") from None
    return ray


#: Ray starts its workers at this niceness unless told otherwise (its default is 15: behind every
#: other process on the node). A pool's workers are its engines, and a verifier step is what the
#: rollout waits on; a Ray the pool starts runs them at normal priority (the environment may say
#: otherwise; a cluster it joins keeps its own setting).
WORKER_NICENESS = "0"


def join_ray(address: str | None) -> bool:
    """Join the cluster at ``address`` (``auto``: the one this machine belongs to), or start a local
    one; True if this call started Ray (the pool then shuts it down when it closes)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    import logging

    if address is None:
        os.environ.setdefault("RAY_worker_niceness", WORKER_NICENESS)  # read by the raylet it starts
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             configure_logging=False)
    return True


def replica_config(config: EngineConfig, replicas: int) -> EngineConfig:
    """Each replica's engine: on a CPU, the cores are shared out (a verifier of ``cpu_count //
    replicas`` threads, less a model drafter's own) unless the config names the threads."""
    if config.device != "cpu" or config.verifier_threads is not None:
        return config
    cores = max(1, (os.cpu_count() or 1) // replicas)
    return replace(config, verifier_threads=max(1, cores - _drafter_cores(config)))


def _drafter_cores(config: EngineConfig) -> int:
    """The cores of a model drafter's own process (0 where there is none)."""
    own = config.processes and any(m in MODEL_METHODS for m in config.active_drafters)
    return config.drafter_threads if own else 0


def bundle(config: EngineConfig) -> dict[str, float]:
    """The resources one replica holds."""
    cores = (config.verifier_threads or 1) + _drafter_cores(config)
    return {"CPU": float(cores), **({"GPU": 1.0} if config.device.startswith("cuda") else {})}


async def place(replicas: int, resources: dict[str, float], strategy: str) -> Any:
    """A placement group of one bundle per replica, ready; RuntimeError naming what is short."""
    import asyncio

    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([dict(resources) for _ in range(replicas)], strategy=strategy)
    try:
        await asyncio.wait_for(group.ready(), PLACEMENT_TIMEOUT_S)
    except asyncio.TimeoutError:
        remove_placement_group(group)
        have = ray.cluster_resources()
        raise RuntimeError(f"the Ray cluster cannot place {replicas} replicas of {resources} within "
                           f"{PLACEMENT_TIMEOUT_S:g} s (it has {_short(have)}): use fewer replicas or "
                           f"--threads, or add nodes") from None
    return group


def actor_options(resources: dict[str, float], group: Any, index: int, max_restarts: int) -> dict[str, Any]:
    """Ray options of replica ``index``: its bundle, Ray's restarts, no task retried (the pool
    re-runs a dead replica's requests itself, on another replica)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"num_cpus": resources["CPU"], "num_gpus": resources.get("GPU", 0.0), "max_restarts": max_restarts,
            "max_task_retries": 0, "max_concurrency": 1000,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)}


def _short(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU", "memory")) or "none"
