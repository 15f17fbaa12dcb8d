"""Helpers for the workflows tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.utils import timezone

from ledon.faults import add_fault_hook, remove_fault_hook
from tests.conftest import in_own_connection
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


@contextmanager
def elsewhere_at(
    point: str, action: Callable[[], Any], *, times: int = 1, **match: Any
) -> Iterator[list[Any]]:
    """At the ``times``-th time fault point ``point`` is reached with the context
    ``match`` (in any thread), run ``action`` in another thread with its own database
    connection and wait for it to end before going on: a deterministic interleaving.
    Yields the list that receives ``action``'s return value (empty if the point was
    never reached that often); an error of ``action`` is raised from the point."""
    outcomes: list[Any] = []
    seen = 0
    lock = threading.Lock()

    def hook(name: str, context: dict[str, Any]) -> None:
        nonlocal seen
        if name != point or any(context.get(k) != v for k, v in match.items()):
            return
        with lock:
            seen += 1
            if seen != times:
                return
        with ThreadPoolExecutor(max_workers=1) as pool:
            outcomes.append(pool.submit(in_own_connection(action)).result(timeout=60))

    add_fault_hook(hook)
    try:
        yield outcomes
    finally:
        remove_fault_hook(hook)
