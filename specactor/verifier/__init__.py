"""Target model engine (model code, KV cache, weights), seeded sampling, VerifyActor."""
