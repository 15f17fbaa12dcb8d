"""Retention and item upkeep in every worker: finished runs past
``WORKFLOWS["RETENTION_SECONDS"]`` are deleted on a time basis, as the jobs' worker
deletes finished jobs, and items whose job ended without recording them are ended.

When a ``run_jobs`` worker starts (``jobs.signals.worker_started``) a thread of its
own makes one bounded pass at once, then one every ``WORKFLOWS["CLEANUP_INTERVAL"]``
seconds (at once again while full batches come back: a backlog drains batch after
batch); it stops with the worker (``worker_stopping``). A pass:

- ends up to a batch of items still Running whose job ended for good without
  recording them (its worker kept dying until the job ended Interrupted, or was
  killed between the job's end and the signal that ends the item), so that their
  runs go on (:func:`workflows.store.end_items_of_ended_jobs`);
- deletes up to ``WORKFLOWS["RETENTION_BATCH"]`` finished runs past the retention
  (none when it is ``None``).

A database error is logged and the next try waits for the next interval: neither
ever spins on an outage.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections

from . import store
from .conf import workflows_settings
from .engine import current_time

logger = logging.getLogger(__name__)

_threads: dict[int, RetentionThread] = {}
_threads_lock = threading.Lock()


class RetentionThread(threading.Thread):
    """Purges finished runs past their retention, and ends the items of ended jobs,
    until :meth:`halt`."""

    def __init__(self) -> None:
        super().__init__(name="workflows-retention", daemon=True)
        # Not ``_stop``: Thread.join() calls the private Thread._stop().
        self._halted = threading.Event()
        #: Runs deleted so far (for logs and tests).
        self.purged = 0
        #: Items of ended jobs ended so far.
        self.items_ended = 0
        #: Passes made so far.
        self.passes = 0
        #: Set once the backlog is drained and the thread waits for its next interval.
        self.caught_up = threading.Event()

    def halt(self, timeout: float | None = 10.0) -> None:
        self._halted.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        try:
            while True:
                more = self.end_items_once()
                more = self.purge_once() or more
                self.passes += 1
                interval = 0.0 if more else workflows_settings().CLEANUP_INTERVAL
                if not more:
                    self.caught_up.set()
                if self._halted.wait(interval):
                    return
        finally:
            connections.close_all()  # this thread's own connections

    def purge_once(self) -> bool:
        """One bounded batch; True if it was full (more may be left)."""
        settings = workflows_settings()
        keep = settings.RETENTION_SECONDS
        if keep is None:
            return False
        try:
            count = store.purge_finished(older_than=current_time() - timedelta(seconds=keep))
        except DatabaseError:
            logger.warning("workflows retention failed; tried again later", exc_info=True)
            connections.close_all()
            return False
        if count:
            self.purged += count
            logger.info("workflows retention: %d finished run(s) deleted", count)
        return count >= settings.RETENTION_BATCH

    def end_items_once(self) -> bool:
        """End one bounded batch of items whose job ended without recording them;
        True if it was full (more may be left)."""
        try:
            count = store.end_items_of_ended_jobs(current_time(), limit=store.ITEM_BATCH)
        except DatabaseError:
            logger.warning(
                "ending the items of ended jobs failed; tried again later", exc_info=True
            )
            connections.close_all()
            return False
        if count:
            self.items_ended += count
            logger.warning(
                "workflows: %d item(s) ended whose job had ended without recording them",
                count,
                extra={"items": count},
            )
        return count >= store.ITEM_BATCH


def on_worker_started(sender: Any, *, worker: Any = None, **kwargs: Any) -> None:
    """``jobs.signals.worker_started``: start this worker's retention thread."""
    thread = RetentionThread()
    with _threads_lock:
        _threads[id(worker)] = thread
    thread.start()


def on_worker_stopping(sender: Any, *, worker: Any = None, **kwargs: Any) -> None:
    """``jobs.signals.worker_stopping``: stop the worker's retention thread."""
    with _threads_lock:
        thread = _threads.pop(id(worker), None)
    if thread is not None:
        thread.halt()


def thread_of(worker: Any) -> RetentionThread | None:
    """The retention thread started for ``worker`` (for tests)."""
    with _threads_lock:
        return _threads.get(id(worker))
