"""The workflows' upkeep beside every worker: finished runs past
``WORKFLOWS["RETENTION_SECONDS"]`` are deleted on a time basis, as the jobs' worker
deletes finished jobs, and what a job that ended without telling the workflows left
behind is ended.

When a ``run_jobs`` worker starts (``jobs.signals.worker_started``) an
:class:`Upkeep` engine runs beside it on a thread of its own (``ledon.beside``): one
bounded pass at once, then one every ``WORKFLOWS["CLEANUP_INTERVAL"]`` seconds (at
once again while full batches come back: a backlog drains batch after batch); it
stops with the worker (``worker_stopping``). A pass:

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

from ledon.beside import Beside

from . import store
from .conf import workflows_settings
from .engine import current_time

logger = logging.getLogger(__name__)


class Upkeep:
    """Purges finished runs past their retention, and ends the items of ended jobs,
    pass after pass until :meth:`stop`."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        #: Runs deleted so far (for logs and tests).
        self.purged = 0
        #: Items of ended jobs ended so far.
        self.items_ended = 0
        #: Passes made so far.
        self.passes = 0
        #: Set once the backlog is drained and the engine waits for its next interval.
        self.caught_up = threading.Event()
        #: Set once :meth:`run` has returned.
        self.stopped = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        try:
            while True:
                more = self.end_items_once()
                more = self.purge_once() or more
                self.passes += 1
                interval = 0.0 if more else workflows_settings().CLEANUP_INTERVAL
                if not more:
                    self.caught_up.set()
                if self._stopping.wait(interval):
                    return
        finally:
            connections.close_all()  # this thread's own connections
            self.stopped.set()

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


_beside: Beside[Upkeep] = Beside("workflows-upkeep")


def on_worker_started(sender: Any, *, worker: Any = None, **kwargs: Any) -> None:
    """``jobs.signals.worker_started``: start this worker's upkeep."""
    upkeep = Upkeep()
    _beside.start(worker, upkeep, upkeep.run)


def on_worker_stopping(sender: Any, *, worker: Any = None, **kwargs: Any) -> None:
    """``jobs.signals.worker_stopping``: stop the worker's upkeep (a pass under way
    ends first; a worker stops on without it after 10 s)."""
    _beside.stop(worker, timeout=10.0)


def upkeep_of(worker: Any) -> Upkeep | None:
    """The upkeep started beside ``worker`` (for tests)."""
    return _beside.engine_of(worker)
