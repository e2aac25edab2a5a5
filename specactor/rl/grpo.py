"""A small, real GRPO policy-gradient step on CPU with transformers.

Group-relative advantages (each sample's reward minus its group's mean, over
the group's standard deviation) weight the mean log-probability of the
sample's own tokens; one optimizer step per call. On-policy (the rollout used
the current weights), so the PPO ratio is 1 and no clipping or reference
model is needed for a demonstration. The trainer's ``state_dict()`` uses
Hugging Face names, which is what ``update_weights`` takes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Sample:
    prompt_ids: list[int]
    token_ids: list[int]
    reward: float


def group_advantages(rewards: list[float], eps: float = 1e-4) -> list[float]:
    """GRPO: (r - mean) / (std + eps) within one group; all zero when every reward is equal."""
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


class GRPOTrainer:
    def __init__(self, folder: str | Path, lr: float = 1e-6, temperature: float = 1.0,
                 max_grad_norm: float = 1.0) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a progress bar per load clutters a training log
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.temperature, self.max_grad_norm = temperature, max_grad_norm

    def step(self, groups: list[list[Sample]]) -> dict[str, float]:
        """One policy-gradient step over every group (gradients accumulated sample by sample)."""
        weighted = [(s, a) for group in groups for s, a in zip(group, group_advantages([x.reward for x in group]))
                    if a != 0.0 and s.token_ids]
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for sample, advantage in weighted:
            ids = torch.tensor([sample.prompt_ids + sample.token_ids])
            logits = self.model(ids).logits[0, len(sample.prompt_ids) - 1:-1] / self.temperature
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(sample.prompt_ids):, None])
            loss = -advantage * logp.mean() / len(weighted)
            loss.backward()
            total += loss.item()
        grad_norm = 0.0
        if weighted:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
            self.optimizer.step()
        return {"loss": total, "samples": float(len(weighted)), "grad_norm": grad_norm}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: t.detach() for name, t in self.model.state_dict().items()}
