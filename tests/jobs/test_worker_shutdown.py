"""The worker's graceful shutdown, in process: what runs beside it stops with the
claiming (not after the handlers), and every end is counted as what it was."""

from __future__ import annotations

import threading

import pytest

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.signals import worker_stopping
from jobs.types import AttemptStatus
from jobs.worker import Worker

SCOPE = "shutdown"

pytestmark = pytest.mark.django_db(transaction=True)


def test_worker_stopping_is_sent_while_handlers_still_run(handler):
    """The scheduler (and the saga runner) stop on ``worker_stopping``: it comes as
    claiming stops, while the handler still runs, so nothing is enqueued during the
    shutdown."""
    started, release = threading.Event(), threading.Event()
    held_at_stopping: list[int] = []

    @handler("shutdown.hold")
    def run(ctx):
        started.set()
        release.wait(30)
        return "done"

    def stopping(sender, worker, **kwargs):
        held_at_stopping.append(worker.running_count())
        release.set()

    worker_stopping.connect(stopping, dispatch_uid="test.stopping")
    try:
        submit_job(SCOPE, "s", JobSubmission.create("shutdown.hold"))
        worker = Worker(listen=False, shutdown_timeout=30)
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert started.wait(30)
        worker.stop()
        thread.join(30)
    finally:
        worker_stopping.disconnect(dispatch_uid="test.stopping")
        release.set()
    assert held_at_stopping == [1]
    # The handler was given its time: it finished normally.
    assert JobScope(SCOPE).get("s").status == JobStatus.SUCCEEDED


def test_a_handler_that_outlives_the_grace_is_counted_as_interrupted(handler):
    """One attempt, a handler deaf to its signal: recovered without an attempt left,
    it is Interrupted — and the summary says so, not "re-queued"."""
    started, release = threading.Event(), threading.Event()
    events: list[str] = []

    @handler("shutdown.deaf")
    def run(ctx):
        started.set()
        release.wait(30)
        return "late"

    submit_job(SCOPE, "deaf", JobSubmission.create("shutdown.deaf"))
    worker = Worker(
        listen=False,
        shutdown_timeout=0,
        cancel_grace=0.05,
        on_event=lambda event, claim, detail: events.append(event),
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert started.wait(30)
        worker.stop()
        thread.join(30)
    finally:
        release.set()
    snap = JobScope(SCOPE).get("deaf")
    assert snap.status == JobStatus.INTERRUPTED
    assert [a.status for a in snap.attempts] == [AttemptStatus.INTERRUPTED]
    assert (worker.stats.interrupted, worker.stats.requeued, worker.stats.released) == (1, 0, 0)
    assert "interrupted" in events
    assert "requeued" not in events
    assert "interrupted 1" in worker.stats.summary()
