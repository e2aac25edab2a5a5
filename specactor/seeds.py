"""The one seed rule: a sample's noise depends on (seed, request id, sample index).

Every entry point (``specactor rollout``, :class:`~specactor.RolloutEngine`,
the daemon and its client) derives the seed of sample ``i`` of a request named
``request_id`` with :func:`sample_seed`, so the same prompt, id and seed give
the same tokens whichever door they come through, in any call order, and
whatever else shares the batch (up to floating-point near-ties: README,
"Lossless"). A request without a seed uses the engine's default seed
(``EngineConfig.seed``, ``--seed``); a request without an id gets a fresh
random one, so its samples are not reproducible: name requests to reproduce
them, and give each RL epoch new ids or a new seed to get new samples.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (hashed, so nearby inputs give unrelated seeds)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sample_seed(seed: int | None, request_id: str, sample: int, default_seed: int = 0) -> int:
    """The seed of sample ``sample`` of request ``request_id`` (``seed=None``: ``default_seed``).

    The same for ``n=1`` and ``n>1`` (sample 0 is sample 0), and independent of
    which other requests share the batch or the call.
    """
    return derive_seed(default_seed if seed is None else seed, request_id, sample)


def sample_request_id(request_id: str, sample: int, n: int) -> str:
    """The id a sample's result carries: the request's own id when ``n == 1``, else ``id#sample``."""
    return request_id if n == 1 else f"{request_id}#{sample}"
