"""Talk to a running daemon: start one with

    specactor serve --endpoint tcp://127.0.0.1:5557

then run

    python examples/client.py [--endpoint tcp://127.0.0.1:5557] [--prompts 4] [--n 4]
"""

import argparse
import asyncio
import time

from specactor import RolloutClient, SamplingParams
from specactor.engine.model_registry import resolve_model
from specactor.prompts import humaneval_prompts
from specactor.tokenizer import Tokenizer


async def main(args: argparse.Namespace) -> None:
    tok = Tokenizer(resolve_model(None))  # the client tokenizes; the daemon works on token ids
    prompts = [tok.apply_chat_template([{"role": "user", "content": p.text}]) for p in humaneval_prompts(args.prompts)]
    async with RolloutClient(args.endpoint, timeout_s=600) as client:
        print("health:", await client.health())
        start = time.perf_counter()
        tokens = 0
        params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, n=args.n, seed=0)
        async for result in client.stream(prompts, params):  # each sample as soon as it finishes
            tokens += len(result.token_ids)
            print(f"{result.request_id:>10}: {len(result.token_ids):4d} tokens, {result.finish_reason}, "
                  f"policy version {result.policy_version}")
        wall = time.perf_counter() - start
        print(f"{tokens} tokens in {wall:.1f} s ({tokens / wall:.1f} tokens/s)")
        print("verifier:", (await client.stats()).get("verifier"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Generate HumanEval samples through a running specactor daemon.")
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:5557")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    asyncio.run(main(parser.parse_args()))
