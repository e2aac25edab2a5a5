"""The daemon fixtures of tests/server, for the daemon fault tests."""

from tests.server.conftest import daemon_factory, prompts  # noqa: F401
