"""Drive a specactor daemon the way verl's agent loop drives its rollout servers.

verl's server contract is one request per call:
``generate(prompt_ids, sampling_params, request_id) -> token ids, log-probs, stop reason``.
An agent loop runs one coroutine per sample (a GRPO group is n separate requests
with their own ids), many in flight at once, each awaiting its own answer. The
daemon batches whatever is in flight and speculates on it.

    specactor serve --endpoint tcp://127.0.0.1:5557 [--backend vllm] &
    python examples/verl_style.py --endpoint tcp://127.0.0.1:5557

Without ``--endpoint`` the example starts a daemon of its own (``--backend vllm``: vLLM verifies
what specactor's drafters propose) and stops it at the end. docs/verl.md says how a verl job uses it.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import dataclass

from specactor import RolloutClient, SamplingParams


@dataclass
class TokenOutput:
    """What a verl rollout server returns for one request."""

    request_id: str
    token_ids: list[int]
    log_probs: list[float]
    stop_reason: str  # "stop" (EOS or a stop token), "length", "abort" or "error"


def sampling_params_from_verl(params: dict, max_tokens: int) -> SamplingParams:
    """verl's sampling dict as specactor's SamplingParams. verl sends ``temperature``, ``top_p``,
    ``top_k`` (-1: off), ``repetition_penalty`` and ``logprobs``, and sizes the response itself
    (``max_tokens`` where it sends one, else the server's ``response_length``). specactor returns the
    log-prob of every sampled token and samples without penalties: a penalty other than 1.0, or a key
    it does not know, is an error naming it rather than a silently different sampler."""
    known = {"temperature", "top_p", "top_k", "max_tokens", "seed", "repetition_penalty", "logprobs", "n"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"sampling parameters specactor does not take: {', '.join(unknown)}")
    if float(params.get("repetition_penalty", 1.0)) != 1.0:
        raise ValueError(f"repetition_penalty {params['repetition_penalty']}: specactor samples the model's own "
                         "distribution (RL needs the policy's log-probs), so only 1.0")
    if int(params.get("n", 1)) != 1:
        raise ValueError("n: verl sends one request per sample; give each its own request_id")
    top_k = int(params.get("top_k", 0) or 0)
    return SamplingParams(temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                          top_k=max(top_k, 0), max_tokens=int(params.get("max_tokens", max_tokens)),
                          seed=params.get("seed"))


class RolloutServer:
    """What a verl job puts where its vLLM rollout server stands: ``generate`` takes one request,
    with verl's sampling parameters as a dict, and answers with a :class:`TokenOutput`; the trainer
    pushes each step's weights through ``update_weights``. ``response_length`` is verl's cap on a
    response, used where the dict carries no ``max_tokens``."""

    def __init__(self, endpoint: str, response_length: int = 768, timeout_s: float = 600) -> None:
        self.client = RolloutClient(endpoint, timeout_s=timeout_s)
        self.response_length = response_length

    async def __aenter__(self) -> "RolloutServer":
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(*exc)

    async def generate(self, prompt_ids: list[int], sampling_params: dict, request_id: str) -> TokenOutput:
        params = sampling_params_from_verl(sampling_params, self.response_length)
        result = await self.client.generate(prompt_ids, params, request_id=request_id)
        return TokenOutput(result.request_id, list(result.token_ids), list(result.logprobs), str(result.finish_reason))

    async def update_weights(self, state_dict: dict, step: int) -> None:
        """The trainer's new weights; every result after this carries ``policy_version == step``."""
        await self.client.update_weights(state_dict, version=step)


async def agent_loop(server: RolloutServer, prompt_ids: list[int], request_id: str,
                     sampling_params: dict) -> TokenOutput:
    """One sample of one prompt: a single request, awaited on its own."""
    return await server.generate(prompt_ids, sampling_params, request_id)


async def rollout(endpoint: str, prompts: list[list[int]], n: int, params: SamplingParams,
                  on_done=None) -> list[TokenOutput]:
    """A GRPO batch: ``n`` concurrent single requests per prompt; outputs in (prompt, sample) order."""
    # verl hands its servers a plain dict (no max_tokens: the server's response_length caps it)
    sampling_params = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or -1,
                       "repetition_penalty": 1.0, "logprobs": True}
    if params.seed is not None:
        sampling_params["seed"] = params.seed
    async with RolloutServer(endpoint, response_length=params.max_tokens) as server:
        ids = [f"{uuid.uuid4().hex[:12]}-p{i}-s{s}" for i in range(len(prompts)) for s in range(n)]
        tasks = {rid: asyncio.create_task(agent_loop(server, prompts[k // n], rid, sampling_params))
                 for k, rid in enumerate(ids)}
        for done in asyncio.as_completed(tasks.values()):
            out = await done
            if on_done is not None:
                on_done(out)
        return [tasks[rid].result() for rid in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default=None, help="a running daemon (default: start one)")
    parser.add_argument("--prompts", type=int, default=4, help="HumanEval problems")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (a GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--backend", default="torch", choices=("torch", "vllm"),
                        help="the started daemon's verifier: specactor's engine or vLLM")
    args = parser.parse_args()

    from specactor.engine.model_registry import resolve_model
    from specactor.prompts import humaneval_prompts
    from specactor.cli.serve import DaemonProcess
    from specactor.tokenizer import Tokenizer

    tok = Tokenizer(resolve_model(None))  # the client tokenizes; the daemon works on token ids
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(args.prompts)]
    daemon = None if args.endpoint else DaemonProcess.start("--max-batch", str(args.prompts * args.n),
                                                            "--backend", args.backend)
    endpoint = args.endpoint or daemon.endpoint  # type: ignore[union-attr]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    start = time.perf_counter()
    try:
        outputs = asyncio.run(rollout(endpoint, prompts, args.n, params, on_done=lambda out: print(
            f"{out.request_id}: {len(out.token_ids):4d} tokens, {out.stop_reason}")))
    finally:
        if daemon is not None:
            daemon.stop()
    tokens = sum(len(o.token_ids) for o in outputs)
    wall = time.perf_counter() - start
    print(f"{len(outputs)} requests, {tokens} tokens in {wall:.1f} s ({tokens / wall:.1f} tokens/s)")


if __name__ == "__main__":
    main()
