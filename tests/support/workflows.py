"""Helpers for the workflows tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.utils import timezone

from workflows import WorkflowContext, registry, workflow
from workflows.testing import TestClock


def later_clock() -> TestClock:
    """A test clock a second ahead of the real time: the jobs staged now (an
    activity's items, at the real time) are due at its time."""
    return TestClock(timezone.now() + timedelta(seconds=1))


@contextmanager
def linear_version_2() -> Iterator[None]:
    """A deploy of ``checks.linear`` version 2 (its body returns ``"v2"``) for the
    block: registered on entry, gone again on exit."""

    @workflow("checks.linear", version=2)
    def linear_v2(wf: WorkflowContext) -> Any:
        return "v2"

    try:
        yield
    finally:
        registry.unregister_workflow("checks.linear", 2)
