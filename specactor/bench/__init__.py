"""`specactor bench`: the rollout workload against the baselines (see suite.py)."""
