"""The scheduler beside every ``run_jobs`` worker.

A :class:`Scheduler` runs on a thread of its own (its own database connection):
it brings the stored schedules up to date with the code, enqueues what is due, then
sleeps until the next period starts — no polling in between — and goes again. It
wakes at least every ``JOBS["SCHEDULE_REFRESH_SECONDS"]`` (default 30) to notice what
was changed elsewhere that makes a period due earlier than it knows (a schedule
resumed in the admin, one declared by another deploy); a pause needs no wake-up (the
pass at the next period start reads it), and "run now" enqueues its job directly.

Started and stopped through the worker's signals (``jobs.signals``) unless
``JOBS["SCHEDULER"]`` is False. With ``run_jobs --burst`` there is no thread: one
pass runs before the worker starts claiming, so what is due at its start is
enqueued and run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections

from ledon.beside import Beside
from ledon.clock import now as database_now
from ledon.db import alias_for

from ..conf import jobs_settings
from ..exceptions import InvalidSchedule, JobsError
from . import declarations, service
from .models import Schedule

logger = logging.getLogger(__name__)

#: What the scheduler reports: (event, detail), e.g. ("schedule enqueued", job id).
Report = Callable[[str, str], None]

#: Seconds between retries after a database error, doubling up to the refresh period.
_FIRST_BACKOFF = 1.0


class Scheduler:
    """Enqueue due periods until stopped; ``run()`` blocks, ``stop()`` is safe from any
    thread. ``clock`` gives the current time (injectable for tests)."""

    def __init__(
        self,
        *,
        clock: Callable[[], datetime] = database_now,
        report: Report | None = None,
        refresh_seconds: float | None = None,
    ) -> None:
        self.clock = clock
        self.report = report or (lambda event, detail: None)
        self.refresh_seconds = (
            jobs_settings().SCHEDULE_REFRESH_SECONDS if refresh_seconds is None else refresh_seconds
        )
        self._stopping = threading.Event()
        self.passes = 0
        self.enqueued = 0

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        try:
            self._run()
        finally:
            connections[alias_for(Schedule)].close()

    def _run(self) -> None:
        backoff = _FIRST_BACKOFF
        synced = False
        while not self._stopping.is_set():
            try:
                if not synced:
                    service.sync(now=self.clock())
                    synced = True
                result = service.enqueue_due(self.clock())
            except InvalidSchedule as exc:
                logger.error("schedules are not running: %s", exc)
                self.report("schedules stopped", str(exc))
                return
            except (DatabaseError, JobsError):
                logger.exception(
                    "enqueueing due schedules failed; retrying in %.0f s (is the database up?)",
                    backoff,
                )
                # A new connection at the next try: this thread holds no transaction.
                connections[alias_for(Schedule)].close()
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, max(self.refresh_seconds, _FIRST_BACKOFF))
                continue
            backoff = _FIRST_BACKOFF
            self.passes += 1
            self.enqueued += sum(1 for job in result.jobs if job.created)
            for job in result.jobs:
                if job.created:
                    self.report("schedule enqueued", job.job_id)
            self._sleep_until(result.next_due)

    def _sleep_until(self, due: datetime | None) -> None:
        """Sleep until ``due`` (by the clock) or the refresh period ends, whichever is
        first; no database access meanwhile."""
        refresh_at = time.monotonic() + self.refresh_seconds
        while not self._stopping.is_set():
            left = refresh_at - time.monotonic()
            if due is not None:
                left = min(left, (due - self.clock()).total_seconds())
            if left <= 0:
                return
            self._stopping.wait(left)


# --------------------------------------------------------------------------- in the worker

_beside: Beside[Scheduler] = Beside("jobs-scheduler")


def start_scheduler(sender: Any, worker: Any, **kwargs: Any) -> None:
    """``jobs.signals.worker_started``: enqueue what is due (burst), or start a
    scheduler thread beside ``worker``."""
    if not jobs_settings().SCHEDULER or not declarations.declared():
        return
    if worker.burst:
        service.sync(now=worker.clock())
        for job in service.enqueue_due_schedules(worker.clock()):
            if job.created:
                worker.report("schedule enqueued", job.job_id)
        return
    scheduler = Scheduler(clock=worker.clock, report=worker.report)
    _beside.start(worker, scheduler, scheduler.run)


def stop_scheduler(sender: Any, worker: Any, **kwargs: Any) -> None:
    """``jobs.signals.worker_stopping``: stop the worker's scheduler thread."""
    if _beside.stop(worker, timeout=max(worker.shutdown_timeout, 1.0)) is not None:
        logger.warning("the scheduler is still in a database call as the worker stops")
