"""The workflows' upkeep beside every worker: finished runs past
``WORKFLOWS["RETENTION_SECONDS"]`` are deleted on a time basis, as the jobs' worker
deletes finished jobs, and what an engine job that ended without telling the
workflows left behind is ended.

When a ``run_jobs`` worker starts (``jobs.signals.worker_started``) an
:class:`Upkeep` engine runs beside it on a thread of its own (``ledon.beside``): one
bounded pass at once, then one every ``WORKFLOWS["CLEANUP_INTERVAL"]`` seconds (at
once again while full batches come back: a backlog drains batch after batch); it
stops with the worker (``worker_stopping``). Beside a ``--burst`` worker the burst
is not over before its passes found no item or run left to end, so that the advance
jobs of the runs they woke are run too (:mod:`ledon.burst`). A pass:

- ends up to a batch of items still Running whose job ended for good without
  recording them (its worker kept dying until the job ended Interrupted, or was
  killed between the job's end and the signal that ends the item), so that their
  runs go on (:func:`workflows.store.end_items_of_ended_jobs`);
- lets go of up to a batch of runs still Running under an advance job that ended
  for good the same way, which nothing else would ever take again: Failed if its
  worker kept dying, else to a new advance
  (:func:`workflows.engine.let_go_runs_of_ended_jobs`);

Both are what the receivers of the jobs' signals do at once (:mod:`.receivers`):
the pass catches what a process took with it as it died.
- deletes up to ``WORKFLOWS["RETENTION_BATCH"]`` finished runs past the retention
  (none when it is ``None``).

A database error is logged and the next try waits for the next interval: neither
ever spins on an outage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections

from ledon.beside import Beside
from ledon.burst import Member, join_burst_of

from . import store
from .conf import workflows_settings
from .engine import current_time, let_go_runs_of_ended_jobs

logger = logging.getLogger(__name__)


class Upkeep:
    """Purges finished runs past their retention, and ends what ended engine jobs
    left behind (items, runs), pass after pass until :meth:`stop`."""

    def __init__(self, burst_member: Member | None = None) -> None:
        self._stopping = threading.Event()
        #: Beside a burst worker: the upkeep's part in its burst (:mod:`ledon.burst`).
        #: The runs its passes release (and the items they end) are woken, and the
        #: burst runs their advance jobs; once none is left it takes no part (the
        #: rest is retention).
        self.burst_member = burst_member
        #: Runs deleted so far (for logs and tests).
        self.purged = 0
        #: Items of ended jobs ended so far.
        self.items_ended = 0
        #: Runs of ended advance jobs let go so far (failed, released or cancelled).
        self.runs_let_go = 0
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
                more = self.end_leftovers_once()
                if not more:
                    self._leave_burst()  # what is left is retention: no burst waits for it
                more = self.purge_once() or more
                self.passes += 1
                interval = 0.0 if more else workflows_settings().CLEANUP_INTERVAL
                if not more:
                    self.caught_up.set()
                if self._stopping.wait(interval):
                    return
        finally:
            self._leave_burst()
            connections.close_all()  # this thread's own connections
            self.stopped.set()

    def _leave_burst(self) -> None:
        if self.burst_member is not None:
            self.burst_member.leave()

    def purge_once(self) -> bool:
        """Delete one bounded batch of finished runs past the retention; True if it
        was full (more may be left)."""
        settings = workflows_settings()
        keep = settings.RETENTION_SECONDS
        if keep is None:
            return False
        count = self._batch(
            "deleting finished runs past the retention",
            lambda: store.purge_finished(older_than=current_time() - timedelta(seconds=keep)),
        )
        if count:
            self.purged += count
            logger.info("workflows retention: %d finished run(s) deleted", count)
        return count >= settings.RETENTION_BATCH

    def end_leftovers_once(self) -> bool:
        """End one bounded batch of the items whose job ended without recording them,
        and let go of one of the runs held by an advance job that ended for good
        unheard; True if either was full (more may be left)."""
        items = self._leftovers(
            store.end_items_of_ended_jobs,
            "ending the items of ended jobs",
            "workflows: %d item(s) ended whose job had ended without recording them",
        )
        runs = self._leftovers(
            let_go_runs_of_ended_jobs,
            "letting go of the runs of ended advance jobs",
            "workflows: %d run(s) let go whose advance job had ended holding them",
        )
        self.items_ended += items
        self.runs_let_go += runs
        if (items or runs) and self.burst_member is not None:
            self.burst_member.worked()  # their runs' advance jobs are queued
        return max(items, runs) >= store.ITEM_BATCH

    def _leftovers(self, end: Callable[..., int], what: str, said: str) -> int:
        """End one batch of what ended engine jobs left behind (``end``, a store
        function): how many, said in a WARNING (its ``count`` in ``extra=``)."""
        count = self._batch(what, lambda: end(current_time(), limit=store.ITEM_BATCH))
        if count:
            logger.warning(said, count, extra={"count": count})
        return count

    @staticmethod
    def _batch(what: str, batch: Callable[[], int]) -> int:
        """Run one batch: how many rows it changed; 0 after a database error, which is
        logged (the next try is the next pass's: an outage is never spun on)."""
        try:
            return batch()
        except DatabaseError:
            logger.warning("workflows upkeep: %s failed; tried again later", what, exc_info=True)
            connections.close_all()
            return 0


_beside: Beside[Upkeep] = Beside("workflows-upkeep")


def on_worker_started(sender: Any, *, worker: Any = None, **kwargs: Any) -> None:
    """``jobs.signals.worker_started``: start this worker's upkeep."""
    upkeep = Upkeep(join_burst_of(worker, "workflows upkeep", lambda: None))
    _beside.start(worker, upkeep, upkeep.run)


def on_worker_stopping(sender: Any, *, worker: Any = None, **kwargs: Any) -> None:
    """``jobs.signals.worker_stopping``: stop the worker's upkeep (a pass under way
    ends first; a worker stops on without it after 10 s)."""
    _beside.stop(worker, timeout=10.0)


def upkeep_of(worker: Any) -> Upkeep | None:
    """The upkeep started beside ``worker`` (for tests)."""
    return _beside.engine_of(worker)
