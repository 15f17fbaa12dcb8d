"""How the apps' registries (job handlers, schedules, workflows, activities) name the
functions they hold, and tell a second definition under one name from the same one
registered again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def qualified_name(func: Callable[..., Any]) -> str:
    """``module.qualname`` of ``func`` (what it is, where a callable has no such name)."""
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def other_definition(registered: Callable[..., Any] | None, func: Callable[..., Any]) -> str | None:
    """The qualified name of ``registered`` if it is another function than ``func``: a
    conflict. None if nothing is registered, or if it is ``func`` itself — the same
    definition registered again (its module imported twice, or reloaded), which is
    no conflict."""
    if registered is None or qualified_name(registered) == qualified_name(func):
        return None
    return qualified_name(registered)
