"""Does a sampler draw from the model's own distribution? A test on the samples it produced.

Speculative decoding must not change what is sampled. Token identity with a
reference shows that for our engine; a sampler with its own random streams
(vLLM's) can only be judged by its statistics. This module judges any sampler's
output against the model, position by position:

Each sampled token is scored by the model, teacher-forced: at its position the
model ranks it 1st, 2nd, 3rd-5th, 6th-20th or lower (five buckets). Given its
prefix, a position is one categorical draw over those buckets with the
probabilities the model gives; over N positions the bucket counts minus their
expectations are a sum of martingale increments of known covariance, and their
Mahalanobis length is chi-square with 4 degrees of freedom when the sampler is
right, whatever the prefixes were. :func:`power_against_a_shift` says, from the
same positions, how often the test would catch a sampler that moved ``shift`` of
probability from the most likely token to the second at every position.
"""

from __future__ import annotations

import math

import torch

from specactor.engine.kv_cache import KVCache

#: rank buckets: 1st | 2nd | 3rd-5th | 6th-20th | the rest
EDGES = torch.tensor([1, 2, 5, 20])


def score(model, samples: list[tuple[list[int], list[int]]], temperature: float = 1.0,
          wrong_temperature: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per output position of ``samples`` ((prompt ids, output ids) pairs) under ``model`` (a
    CausalLM) at ``temperature``: the probability of each rank bucket [N, 5] and the bucket the
    sampled token fell in [N]; with ``wrong_temperature``, also the bucket of a token drawn afresh
    at that temperature at the same position [N] (a deliberately wrong sampler, to show the test
    sees one)."""
    gen = torch.Generator().manual_seed(1)
    probs_all, draws_all, wrong_all = [], [], []
    for prompt, output in samples:
        ids = prompt + output
        logits = model(torch.tensor(ids), [len(ids)], KVCache(model.cfg, 1, len(ids)),
                       torch.arange(len(prompt) - 1, len(ids) - 1)) / temperature
        top, _ = logits.topk(int(EDGES[-1]), dim=-1)
        top = (top.double() - torch.logsumexp(logits.double(), -1, keepdim=True)).exp()
        buckets = torch.stack([top[:, 0], top[:, 1], top[:, 2:5].sum(-1), top[:, 5:20].sum(-1)], -1)
        probs_all.append(torch.cat([buckets, (1 - buckets.sum(-1, keepdim=True)).clamp_min(0)], -1))
        judged = [(torch.tensor(output), draws_all)]
        if wrong_temperature is not None:  # Gumbel-max: a draw at that temperature
            gumbel = -torch.log(-torch.log(torch.rand(logits.shape, generator=gen).clamp(1e-20, 1 - 1e-7)))
            judged.append(((logits * temperature / wrong_temperature + gumbel).argmax(-1), wrong_all))
        for tokens, into in judged:
            rank = (logits > logits.gather(1, tokens[:, None])).sum(-1)
            into.append(torch.bucketize(rank, EDGES, right=True))
    return torch.cat(probs_all), torch.cat(draws_all), torch.cat(wrong_all) if wrong_all else None


def chi_square_p(q: torch.Tensor, draws: torch.Tensor) -> float:
    """p-value that ``draws`` [N] came from the per-position bucket probabilities ``q`` [N, 5].

    The statistic is taken in the eigenbasis of the counts' covariance, over the directions whose
    variance is at least 5 (the counts sum to N, so one direction has none; buckets the model
    almost never uses carry too few counts for the chi-square law), with that many degrees of freedom.
    """
    d = (torch.nn.functional.one_hot(draws, 5).double() - q).sum(0)
    cov = (torch.diag_embed(q) - q[:, :, None] * q[:, None, :]).sum(0)
    values, vectors = torch.linalg.eigh(cov)
    keep = values >= 5.0
    if not bool(keep.any()):
        raise ValueError("too few uncertain positions to judge a sampler")
    x = float(((vectors[:, keep].T @ d) ** 2 / values[keep]).sum())
    return chi2_sf(x, int(keep.sum()))


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with ``dof`` degrees of freedom (closed forms; no scipy)."""
    half = x / 2
    if dof % 2 == 0:
        term, total = 1.0, 1.0
        for i in range(1, dof // 2):
            term *= half / i
            total += term
        return math.exp(-half) * total
    total = math.erfc(math.sqrt(half))
    term = math.sqrt(half) * math.exp(-half) / math.gamma(1.5)
    for i in range(1, (dof + 1) // 2):
        total += term
        term *= half / (i + 0.5)
    return total


def power_against_a_shift(q: torch.Tensor, shift: float = 0.02, alpha: float = 1e-3, replicas: int = 200) -> float:
    """Share of simulated runs, at the positions ``q`` describes, of a sampler that moves ``shift``
    of probability from the 1st token to the 2nd (as far as the 1st has it) that the test rejects
    at level ``alpha``."""
    moved = q[:, 0].clamp(max=shift)
    shifted = q.clone()
    shifted[:, 0] -= moved
    shifted[:, 1] += moved
    gen = torch.Generator().manual_seed(0)
    rejected = sum(chi_square_p(q, torch.multinomial(shifted.float(), 1, generator=gen)[:, 0]) < alpha
                   for _ in range(replicas))
    return rejected / replicas
