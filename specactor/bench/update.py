"""The policy update every mode of the bench loads before epoch 2.

Made once, when the first mode needs it (between its epochs, outside the timed
part), from epoch 1's samples at T=1: autoregressive's, when that is what ran
first (our engine is lossless, so they are every engine mode's samples), or
sampled afresh otherwise. They are rewarded by the HumanEval tests with a small
length penalty (so that groups whose tests all fail still differ and the step
is real), then one GRPO step is taken on the first ``groups`` prompts' groups
(a minibatch, as GRPO trainers take them: on 2 cores the step over all 32
samples of up to 768 tokens took 291 s, more than a rollout). Reusing
autoregressive's samples spares the bench a whole rollout of the workload
(~3 minutes on 2 cores).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import torch

from specactor.bench.measure import RunRecord
from specactor.bench.runners import Workload
from specactor.memory import release_freed_memory

LENGTH_PENALTY = 0.05  # reward per sample: test reward - 0.05 * (tokens / max_tokens)


class PolicyUpdate:
    """Callable with a mode's first-epoch record; returns the updated weights (made on first call)."""

    def __init__(self, work: Workload, lr: float, progress: Callable[[str], Any] = print,
                 groups: int | None = None) -> None:
        """``groups``: prompts whose sample groups the GRPO step uses (None: all)."""
        self.work, self.lr, self.progress = work, lr, progress
        self.groups = groups
        self.state: dict[str, torch.Tensor] | None = None
        self.stats: dict[str, Any] | None = None

    def __call__(self, first_epoch: RunRecord | None = None) -> dict[str, torch.Tensor]:
        if self.state is None:
            started = time.perf_counter()
            reuse = first_epoch is not None and first_epoch.mode == "autoregressive" \
                and first_epoch.temperature == 1.0 and first_epoch.epoch == 0
            outputs = [first_epoch.outputs[sid] for sid in self.work.sample_ids()] if reuse else self._sample()
            self.state, self.stats = self._step(outputs)
            self.stats["reused_autoregressive_samples"] = reuse
            self.stats["seconds"] = round(time.perf_counter() - started, 1)
            self.progress(f"policy update for epoch 2: mean test reward {self.stats['mean_test_reward']:.3f}, "
                          f"{int(self.stats['samples'])} samples with advantage, grad norm "
                          f"{self.stats['grad_norm']:.3f}, made in {self.stats['seconds']:.0f} s")
        return self.state

    def _sample(self) -> list[list[int]]:
        """Epoch 1's samples at T=1 (what autoregressive, and so every engine mode, returns)."""
        from specactor.protocol import SamplingParams
        from specactor.engine.llm_engine import Engine
        from specactor.engine.sequence import sample_sequences
        from specactor.engine.weights import load_causal_lm

        work = self.work
        seqs = sample_sequences(work.prompt_ids, SamplingParams(temperature=1.0, max_tokens=work.max_tokens,
                                                                n=work.n, seed=work.seed(0)), work.request_ids())
        Engine(load_causal_lm(work.folder), max_batch=len(seqs),
               max_len=max(map(len, work.prompt_ids)) + work.max_tokens, eos_token_ids=work.eos).run(seqs)
        return [s.output_ids for s in seqs]

    def _step(self, outputs: list[list[int]]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        from specactor.rl.grpo import GRPOTrainer, Sample
        from specactor.rl.reward import score
        from specactor.tokenizer import Tokenizer

        work = self.work
        prompts = [p for p in work.prompt_ids for _ in range(work.n)]
        tok = Tokenizer(work.folder)
        tests = asyncio.run(score([tok.decode(o) for o in outputs], [p for p in work.problems
                                                                      for _ in range(work.n)]))
        rewards = [t - LENGTH_PENALTY * len(o) / work.max_tokens for t, o in zip(tests, outputs)]
        samples = [Sample(p, o, r) for p, o, r in zip(prompts, outputs, rewards)]
        trainer = GRPOTrainer(work.folder, lr=self.lr)
        groups = [samples[i:i + work.n] for i in range(0, len(samples), work.n)]
        stats = trainer.step(groups[:self.groups] if self.groups else groups)
        state = {k: v.clone() for k, v in trainer.state_dict().items()}
        del trainer
        release_freed_memory()
        return state, {"mean_test_reward": sum(tests) / len(tests), "mean_reward": sum(rewards) / len(rewards),
                       **stats}
