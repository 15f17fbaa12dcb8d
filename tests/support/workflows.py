"""Helpers for the workflows tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from workflows import WorkflowContext, registry, workflow


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
