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


def _outlive_the_grace(handler) -> tuple[Worker, list[str]]:
    """One job (its one attempt), a handler deaf to the shutdown's signal, and a
    worker stopped while it runs; the worker and the events it reported."""
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
    return worker, events


def test_a_handler_that_outlives_the_grace_is_requeued_with_its_attempt_unused(handler):
    """The crash budget: recovered at the shutdown, the job's one attempt is not used
    up — it is Queued again, its attempt row Interrupted — and counted as re-queued."""
    worker, events = _outlive_the_grace(handler)
    snap = JobScope(SCOPE).get("deaf")
    assert (snap.status, snap.attempt_count, snap.interruption_count) == (JobStatus.QUEUED, 0, 1)
    assert [a.status for a in snap.attempts] == [AttemptStatus.INTERRUPTED]
    assert (worker.stats.requeued, worker.stats.interrupted, worker.stats.released) == (1, 0, 0)
    assert "requeued" in events
    assert "re-queued 1" in worker.stats.summary()


def test_the_interruption_that_reaches_the_budget_is_counted_as_keeping_killing(handler, settings):
    """With a budget of one interruption, the first one ends the job Interrupted as
    one that keeps killing its worker — and the event and the summary say so."""
    settings.JOBS = {**settings.JOBS, "MAX_INTERRUPTIONS": 1}
    worker, events = _outlive_the_grace(handler)
    snap = JobScope(SCOPE).get("deaf")
    assert (snap.status, snap.keeps_killing_worker) == (JobStatus.INTERRUPTED, True)
    assert (worker.stats.kept_killing, worker.stats.requeued) == (1, 0)
    assert "keeps-killing-worker" in events
    assert "requeued" not in events
    assert "kept killing their worker 1" in worker.stats.summary()
