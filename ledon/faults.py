"""Named fault points at commit boundaries, for crash tests.

Code offers a point with ``fault_point("app.where", **context)`` exactly where a
crash matters (after one commit, before the next). Crash tests register a hook that
raises, blocks or kills the process at one named point, so that a crash happens
exactly there instead of after a hopeful sleep. With no hook registered (always, in
production) a fault point costs one list check.

Each app lists the points it offers in its own module docstring (``outbox.faults``,
``sagas.runner``, ``jobs.schedules.service``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

FaultHook = Callable[[str, dict[str, Any]], None]

_hooks: list[FaultHook] = []
_lock = threading.Lock()


def fault_point(name: str, **context: Any) -> None:
    """Give every registered hook the chance to fail here."""
    if not _hooks:
        return
    with _lock:
        hooks = list(_hooks)
    for hook in hooks:
        hook(name, context)


def add_fault_hook(hook: FaultHook) -> None:
    with _lock:
        _hooks.append(hook)


def remove_fault_hook(hook: FaultHook) -> None:
    with _lock:
        if hook in _hooks:
            _hooks.remove(hook)
