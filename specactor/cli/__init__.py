"""The ``specactor`` command: rollout, serve, bench, replay and events (see :mod:`specactor.cli.main`)."""
