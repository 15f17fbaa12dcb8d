"""Named fault points at the dispatcher's commit boundaries.

Crash tests register a hook that raises, blocks or kills the process at one named
point, so that a crash happens exactly there instead of after a hopeful sleep. With
no hook registered (always, in production) a fault point costs one list check.

Points:

``outbox.dispatcher.claimed``
    a batch is claimed and committed; nothing is published yet.
``outbox.in_process.delivered``
    the in-process transport delivered one message of a batch (``index`` counts
    from 1); the batch is not yet recorded.
``outbox.dispatcher.published``
    the transport confirmed the batch; nothing is recorded yet.
``outbox.dispatcher.recorded``
    the batch's outcomes are committed.
``outbox.consumer.received``
    ``consume_events`` received a message; nothing is handled yet.
``outbox.consumer.committed``
    a received message's transaction (inbox record and handlers' work) committed;
    it is not acknowledged yet.
``outbox.consumer.acknowledged``
    the message was acknowledged (or parked, or skipped).
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
