"""Fixtures of the real-process tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.outbox import DispatcherProcess


@pytest.fixture
def dispatchers(tmp_path: Path) -> Iterator[Callable[..., DispatcherProcess]]:
    """``dispatchers(*args, env=...)`` starts a ``dispatch_outbox`` process; every one
    still running at the end of the test is killed."""
    started: list[DispatcherProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> DispatcherProcess:
        proc = DispatcherProcess(tmp_path, *args, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()
