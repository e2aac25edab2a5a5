"""The learned drafter in a replay: every draft's verdict on a rollout, from one forward a sample.

A token-only drafter's state is its context, and under position-keyed sampling its token at output
position t depends only on the tokens before t and the noise of (seed, t). A draft made on the
committed prefix c is verified up to its first token that differs from the sample's, and up to
there it drafted on the sample's own tokens: each of its tokens so far is the drafter's
*teacher-forced* prediction at that position. So the accepted length of any draft from c is the run
of positions from c where the teacher-forced prediction equals the sample's token, and one forward
of the student over the sample (no KV cache, no chain of draft steps) gives every verdict a replay
can ask for. Its tokens after the first wrong one are never verified, so they need not be right.

What it leaves out: the live drafter runs the packed student with a KV cache, whose floating-point
sums differ from a whole-sequence forward's in the last bits, so a near-tie may fall the other way;
and its drafting time, which a replay prices with :func:`learned_draft_cost` (a share of the target's
decode step: a small model of the target's architecture scales with batch as the target does).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from specactor.drafters.base import DraftState
from specactor.drafters.learned import LearnedDrafter, TrainReport, sample_in_vocab, train_logits
from specactor.policy.cost_model import CostModel, DraftCost
from specactor.seeds import sample_seed

#: the method name the policy knows the learned drafter by, live and replayed
LEARNED = LearnedDrafter.name


class TeacherForcedDrafter:
    """A replay drafter proposing a token-only drafter's teacher-forced predictions (module
    docstring): ``predictions[request id]`` holds its token at every output position."""

    def __init__(self, predictions: dict[str, list[int]] | None = None) -> None:
        if predictions is None:
            raise ValueError(f"the {LEARNED} drafter replays from its predictions on the rollout: build them "
                             "with teacher_forced_predictions() (bench/replay_policy.py --learned)")
        self.predictions = predictions

    def start(self, state: DraftState) -> None:
        return None  # earlier epochs' samples (a replay's history) train the drafter, not its drafts

    def observe(self, state: DraftState, start: int, tokens: list[int]) -> None:
        return None

    def finish(self, state: DraftState) -> None:
        return None

    def propose(self, states: list[DraftState], k: int) -> list[list[int]]:
        missing = next((s.request_id for s in states if s.request_id not in self.predictions), None)
        if missing is not None:
            raise KeyError(f"no {LEARNED} predictions for sample {missing!r}: were they made on this rollout?")
        return [self.predictions[s.request_id][len(s.committed):len(s.committed) + k] for s in states]


def sample_key(row: dict[str, Any]) -> str:
    """A rollout row's sample as replays name it (``id#sample``)."""
    return f"{row['id']}#{row['sample']}"


@torch.no_grad()
def teacher_forced_predictions(drafter: LearnedDrafter, rows: Iterable[dict[str, Any]], temperature: float,
                               seed: int | None) -> dict[str, list[int]]:
    """``drafter``'s token at every output position of each rollout row (``specactor rollout``
    output), sampled as it drafts live: the target's rule and noise for the row's sample seed
    (:func:`specactor.seeds.sample_seed` of the rollout's ``seed``, None for the engine's default),
    over the student's vocabulary. An untrained drafter predicts nothing (empty lists), as live."""
    student = drafter.student
    out: dict[str, list[int]] = {}
    for row in rows:
        prompt, output = list(row["prompt_ids"]), list(row["token_ids"])
        if not drafter.trained or not output:
            out[sample_key(row)] = []
            continue
        logits = train_logits(student, torch.tensor(prompt + output[:-1], dtype=torch.long))[len(prompt) - 1:]
        n = len(output)
        out[sample_key(row)] = sample_in_vocab(logits, student.vocab, [temperature] * n,  # type: ignore[arg-type]
                                               [sample_seed(seed, row["id"], row["sample"])] * n, list(range(n)),
                                               drafter.vocab_size)
    return out


def hit_rate(predictions: dict[str, list[int]], rows: Iterable[dict[str, Any]]) -> float:
    """The share of output positions where the prediction is the sample's token: a one-token
    draft's acceptance, drafted on every step."""
    hits = total = 0
    for row in rows:
        pred = predictions.get(sample_key(row), [])
        hits += sum(int(a == b) for a, b in zip(pred, row["token_ids"]))
        total += len(row["token_ids"])
    return hits / total if total else 0.0


def train_on_rollouts(drafter: LearnedDrafter, rows: Iterable[dict[str, Any]]) -> TrainReport | None:
    """One training round on the rollout rows' samples, as the drafter trains between RL epochs."""
    for row in rows:
        drafter.add_rollout(list(row["prompt_ids"]), list(row["token_ids"]))
    return drafter.train()


def learned_draft_cost(cost: CostModel, fraction: float) -> DraftCost:
    """Drafting time per token for ``n`` rows: ``fraction`` of the target's decode step at batch
    ``n``, linear between batch 1 and the profile's largest batch (the student is the target's
    architecture at a few layers and a truncated head, so its batch curve is the target's, scaled)."""
    if fraction < 0:
        raise ValueError(f"the learned drafter's cost must be >= 0 target steps a token, got {fraction}")
    top = max(cost.batch_sizes)
    one, most = cost.verify_s(1, 1), cost.verify_s(top, 1)
    per_row = fraction * (most - one) / (top - 1) if top > 1 else 0.0
    return DraftCost(per_row_s=per_row, fixed_s=fraction * one - per_row)
