"""Fastest-of-N policy: cost model, bandit, PolicyActor."""
