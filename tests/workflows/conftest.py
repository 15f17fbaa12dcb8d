"""What every workflow test shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testproject.workflow_checks import tasks as checks


@pytest.fixture(autouse=True)
def fresh_tries() -> Iterator[None]:
    """The test project's flaky step counts its tries per (run id, key) in this
    process: a run id another test used before would find its tries spent (on a
    test worker that ran it first, its "first try fails" would not fail)."""
    checks.TRIES.clear()
    yield
    checks.TRIES.clear()
