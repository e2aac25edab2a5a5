"""The target-model engine, a leaf beneath the actors: model code, KV cache, position-keyed
sampler, CUDA graphs, weights loading, the model registry and the step-cost profiler.

It imports nothing from the actors, drafters, policy, server or the vLLM backend;
vLLM's engine (:mod:`specactor.vllm_backend.engine`) implements the same protocol
(:mod:`specactor.engine.sequence`), and :mod:`specactor.backends` picks one.
"""
