"""An async GRPO-style loop on HumanEval with the rollout engine embedded.

    python examples/grpo_humaneval.py [--epochs 3] [--prompts 8] [--n 4] [--max-tokens 160] [--backend torch]
        [--mode coupled --drafters model --draft-quant llama-q8_0]

Each epoch: roll out ``n`` samples per prompt through RolloutEngine (SpecActor
mode: decoupled drafters steered by the Fastest-of-N policy), reward every
sample by running the problem's HumanEval tests in a subprocess, take one real
policy-gradient step on the model in torch (CPU), and push the new weights
into the engine with ``update_weights`` (the policy version goes up; every
result says which version produced it). The same prompts come back each epoch,
so the history drafter (``suffix``) can draft from the previous epochs'
samples: watch acceptance rise in later epochs. Unless ``--no-compare``, an
autoregressive engine rolls out the same prompts and seeds each epoch too
(and gets the same weight updates; the two take turns going first), so each
epoch also shows the speedup and that the tokens are identical. ``--backend vllm`` runs the same
loop with vLLM as the verifier of both engines (``bash scripts/setup.sh --vllm``): the weight
updates then go into vLLM.

Takes about 4 minutes on a 2-core CPU with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable
from typing import TypeVar

from specactor.config import DRAFT_QUANTS, EngineConfig
from specactor.rollout_engine import RolloutEngine
from specactor.drafters.registry import parse_methods
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_problems, humaneval_prompts
from specactor.protocol import SamplingParams
from specactor.rl.grpo import GRPOTrainer, Sample
from specactor.rl.reward import score
from specactor.tokenizer import Tokenizer

T = TypeVar("T")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8, help="HumanEval problems per epoch")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (the GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=2e-6)
    parser.add_argument("--mode", default="specactor", choices=["autoregressive", "coupled", "specactor"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="torch", choices=["torch", "vllm"],
                        help="the verifier of both engines: specactor's own engine or vLLM")
    parser.add_argument("--drafters", default="ngram,suffix",
                        help="drafting methods of the specactor engine; add 'learned' for the drafter that "
                             "trains on the rollouts (between RL steps, while the verifier is idle: on a small "
                             "machine also while the autoregressive engine rolls out, so use --no-compare)")
    parser.add_argument("--draft-quant", default=None, choices=DRAFT_QUANTS,
                        help="the model drafter's copy of the target (with --drafters model): llama-q8_0 drafts "
                             "on llama.cpp, re-made from every weight update")
    parser.add_argument("--draft-threads", type=int, default=0,
                        help="CPU cores of the model drafter's own (the verifier gets the others, and these "
                             "while the drafter drafts for no request); 0: it shares the verifier's")
    parser.add_argument("--no-compare", action="store_true", help="skip the autoregressive rollout of each epoch")
    args = parser.parse_args()
    try:
        args.drafters = parse_methods(args.drafters)
    except ValueError as exc:
        parser.error(str(exc))
    return args


async def _timed(call: Awaitable[T]) -> tuple[T, float]:
    """The call's result and its wall time in seconds."""
    t0 = time.perf_counter()
    result = await call
    return result, time.perf_counter() - t0


async def main(args: argparse.Namespace) -> None:
    folder = resolve_model(None)
    tok = Tokenizer(folder)
    problems = humaneval_problems(args.prompts)
    prompt_ids = [tok.apply_chat_template([{"role": "user", "content": p.text}])
                  for p in humaneval_prompts(args.prompts)]
    trainer = GRPOTrainer(folder, lr=args.lr, temperature=args.temperature)
    split = {}
    if args.draft_threads:
        split = {"verifier_threads": max(1, (os.cpu_count() or 2) - args.draft_threads),
                 "drafter_threads": args.draft_threads}
    config = EngineConfig(mode=args.mode, drafters=args.drafters, max_batch=args.prompts * args.n,
                          max_len=max(map(len, prompt_ids)) + args.max_tokens, backend=args.backend,
                          draft_quant=args.draft_quant, **split)
    print(f"{args.prompts} HumanEval problems x {args.n} samples, {args.max_tokens} tokens max, "
          f"T={args.temperature}, mode {args.mode}, backend {args.backend}")
    print("epoch | version | reward | solved | rollout s | tokens | tokens/s | accepted/drafted | "
          + ("autoregressive s | speedup | identical | " if not args.no_compare else "") + "step s | update s")
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(RolloutEngine(config))
        baseline = None if args.no_compare else await stack.enter_async_context(
            RolloutEngine(EngineConfig(mode="autoregressive", max_batch=config.max_batch, max_len=config.max_len,
                                       backend=args.backend)))
        for epoch in range(args.epochs):
            params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, n=args.n,
                                    seed=args.seed * 1000 + epoch)
            ids = [p["task_id"] for p in problems]
            # the two engines take turns going first: the rollout right after training runs on a
            # machine still settling from it, and that must not always fall on the same engine
            baseline_first = baseline is not None and epoch % 2 == 1
            if baseline_first:
                reference, ar_s = await _timed(baseline.generate(prompt_ids, params, request_ids=ids))
            results, rollout_s = await _timed(engine.generate(prompt_ids, params, request_ids=ids))
            compared = ""
            if baseline is not None:
                if not baseline_first:
                    reference, ar_s = await _timed(baseline.generate(prompt_ids, params, request_ids=ids))
                same = sum(a.token_ids == b.token_ids for a, b in zip(results, reference))
                compared = f"{ar_s:16.1f} | {ar_s / rollout_s:6.2f}x | {same:4d}/{len(results):<4d}| "
            texts = [tok.decode(r.token_ids) for r in results]
            rewards = await score(texts, [p for p in problems for _ in range(args.n)])
            groups = [[Sample(r.prompt_ids, r.token_ids, reward)
                       for r, reward in zip(results[i * args.n:(i + 1) * args.n], rewards[i * args.n:(i + 1) * args.n])]
                      for i in range(len(problems))]
            t1 = time.perf_counter()
            # training runs on a worker thread so the engines' actors stay responsive
            stats = await asyncio.to_thread(trainer.step, groups)
            new_weights = trainer.state_dict()
            t2 = time.perf_counter()
            # what the next rollout waits for: the weights loaded by every holder (a learned drafter
            # that trained during the step above has only its embedding to swap)
            version = await engine.update_weights(new_weights)
            if baseline is not None:
                await baseline.update_weights(new_weights)
            step_s, update_s = t2 - t1, time.perf_counter() - t2
            tokens = sum(len(r.token_ids) for r in results)
            drafted = sum(r.stats.drafted for r in results)
            accepted = sum(r.stats.accepted for r in results)
            used = {r.policy_version for r in results}
            print(f"{epoch:5d} | {','.join(map(str, sorted(used))):>7} | {sum(rewards) / len(rewards):6.3f} | "
                  f"{sum(r >= 0.999 for r in rewards):3d}/{len(rewards):<3d}| {rollout_s:9.1f} | {tokens:6d} | "
                  f"{tokens / rollout_s:8.1f} | {accepted:5d}/{drafted:<6d}({accepted / max(drafted, 1):4.0%}) | "
                  f"{compared}{step_s:6.1f} | {update_s:8.1f}   (step: {int(stats['samples'])} samples with advantage, "
                  f"grad norm {stats['grad_norm']:.2f}; weights -> version {version})", flush=True)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
