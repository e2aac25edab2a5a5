"""Pieces of an RL loop around the engine: HumanEval rewards and a GRPO step (examples, bench)."""
