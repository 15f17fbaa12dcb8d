"""How the apps' registries (job handlers, schedules, workflows, activities) name the
functions they hold, tell a second definition under one name from the same one
registered again, and suggest the name that was meant for one they do not know."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any, Protocol


def qualified_name(func: Callable[..., Any]) -> str:
    """``module.qualname`` of ``func`` (what it is, where a callable has no such name)."""
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


class Registered(Protocol):
    """What a registry holds under a name: a spec of the function it registered."""

    @property
    def func(self) -> Callable[..., Any]: ...


def other_definition(registered: Registered | None, func: Callable[..., Any]) -> str | None:
    """The qualified name of the function ``registered`` holds if it is another one than
    ``func``: a conflict. None if nothing is registered, or if it is ``func`` itself —
    the same definition registered again (its module imported twice, or reloaded),
    which is no conflict."""
    if registered is None or qualified_name(registered.func) == qualified_name(func):
        return None
    return qualified_name(registered.func)


def closest(name: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` that ``name`` is a likely misspelling of, or None: the
    "did you mean" of an unknown handler, workflow, activity or setting."""
    choices = sorted(set(known) - {name})
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.7)
    return close[0] if close else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for :func:`closest`'s answer, or ``""``."""
    meant = closest(name, known)
    return f" (did you mean {meant!r}?)" if meant is not None else ""
