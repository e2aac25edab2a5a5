"""The VerifyActor: verifies every request's freshest draft in one batched step of the engine, commits, tells drafters and the policy."""
