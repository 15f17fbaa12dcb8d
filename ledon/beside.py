"""Engines that run on a thread beside another, one per owner: the schedules' scheduler,
the saga recovery runner and the workflows' upkeep beside each job worker. Started from the worker's
``worker_started`` signal, stopped from its ``worker_stopping`` signal."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class Stoppable(Protocol):
    def stop(self) -> None: ...


class Beside[E: Stoppable]:
    """The engines (of type ``E``) running beside their owners, by owner."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self._lock = threading.Lock()
        self._running: dict[int, tuple[E, threading.Thread]] = {}

    def start(self, owner: object, engine: E, run: Callable[[], object]) -> None:
        """Run ``run`` (the engine's loop) on a daemon thread of its own, beside ``owner``."""
        thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        with self._lock:
            self._running[id(owner)] = (engine, thread)
        thread.start()

    def engine_of(self, owner: object) -> E | None:
        """The engine running beside ``owner``, if one was started (for reports and
        tests)."""
        with self._lock:
            entry = self._running.get(id(owner))
        return entry[0] if entry is not None else None

    def stop(self, owner: object, *, timeout: float | None) -> E | None:
        """Stop the engine beside ``owner`` and wait for its thread at most ``timeout``
        seconds (None: do not ask it to stop, wait until it ends by itself). The
        engine if its thread still runs after that; None if it ended (or there was
        none)."""
        with self._lock:
            entry = self._running.pop(id(owner), None)
        if entry is None:
            return None
        engine, thread = entry
        if timeout is not None:
            engine.stop()
        thread.join(timeout)
        return engine if thread.is_alive() else None
