"""The GRPO step changes the weights exactly when a group's rewards differ, towards the better sample."""

from __future__ import annotations

import torch

from specactor.rl.grpo import GRPOTrainer, Sample
from tests.conftest import tiny_hf_model


def _logprob(trainer: GRPOTrainer, sample: Sample) -> float:
    ids = torch.tensor([sample.prompt_ids + sample.token_ids])
    with torch.no_grad():
        logits = trainer.model(ids).logits[0, len(sample.prompt_ids) - 1:-1]
    return float(torch.log_softmax(logits, -1).gather(-1, ids[0, len(sample.prompt_ids):, None]).sum())


def test_step_moves_towards_the_rewarded_sample(tmp_path) -> None:
    tiny_hf_model("llama").save_pretrained(tmp_path)
    trainer = GRPOTrainer(tmp_path, lr=1e-2)
    good, bad = Sample([1, 2, 3], [7, 8, 9], 1.0), Sample([1, 2, 3], [20, 21, 22], 0.0)
    before = {k: v.clone() for k, v in trainer.state_dict().items()}
    stats = trainer.step([[Sample(good.prompt_ids, good.token_ids, 0.5), Sample(bad.prompt_ids, bad.token_ids, 0.5)]])
    assert stats["samples"] == 0 and all(torch.equal(before[k], v) for k, v in trainer.state_dict().items())
    gap = _logprob(trainer, good) - _logprob(trainer, bad)
    stats = trainer.step([[good, bad]])
    assert stats["samples"] == 2 and stats["grad_norm"] > 0
    assert _logprob(trainer, good) - _logprob(trainer, bad) > gap
