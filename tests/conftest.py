"""Shared fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import pytest

from specactor.events import configure_events


@pytest.fixture
def events_file(tmp_path: Path) -> Iterator[Callable[[], list[dict]]]:
    """Route events to a temp JSONL file; yields a reader of the events so far."""
    path = tmp_path / "events.jsonl"
    configure_events(path, console_level=None)

    def read() -> list[dict]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    yield read
    configure_events(None, console_level="warning")
