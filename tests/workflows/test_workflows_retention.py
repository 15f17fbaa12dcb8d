"""Every ``run_jobs`` worker deletes finished runs past their retention on a time
basis: at start-up, then every ``WORKFLOWS["CLEANUP_INTERVAL"]``, draining a backlog
batch after batch, and stops with the worker; the same passes end the items whose
job ended without recording them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import JobStatus
from jobs.models import Job
from jobs.signals import worker_started, worker_stopping
from jobs.worker import Worker
from workflows import RunStatus, start_workflow
from workflows.models import WorkflowRun
from workflows.testing import run_workflow, run_workflows_inline
from workflows.upkeep import on_worker_started, on_worker_stopping, upkeep_of

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-retention"


def finished_runs(count: int, *, days_ago: float) -> None:
    for index in range(count):
        run_id = f"old-{days_ago}-{index}"
        start_workflow(SCOPE, run_id, "checks.linear", {"start": index})
        assert run_workflow(SCOPE, run_id).status == RunStatus.SUCCEEDED
        WorkflowRun.objects.filter(run_id=run_id).update(
            finished_at=timezone.now() - timedelta(days=days_ago)
        )


def test_a_worker_deletes_finished_runs_past_retention_and_keeps_the_rest(settings):
    settings.WORKFLOWS = {"RETENTION_SECONDS": 86_400, "RETENTION_BATCH": 2}
    finished_runs(5, days_ago=3)  # a backlog of three batches
    finished_runs(1, days_ago=0.5)  # within retention
    start_workflow(SCOPE, "unfinished", "checks.signals", {})
    worker = object()
    on_worker_started(Worker, worker=worker)
    upkeep = upkeep_of(worker)
    assert upkeep is not None
    assert upkeep.caught_up.wait(30)
    on_worker_stopping(Worker, worker=worker)
    assert upkeep.stopped.is_set()
    assert upkeep_of(worker) is None
    left = sorted(WorkflowRun.objects.values_list("run_id", flat=True))
    # Two full batches, then a short one: then it waits.
    assert (upkeep.purged, upkeep.passes, left) == (5, 3, ["old-0.5-0", "unfinished"])


def test_no_retention_keeps_finished_runs_and_still_ends_the_items_of_ended_jobs(settings):
    settings.WORKFLOWS = {"RETENTION_SECONDS": None}
    finished_runs(1, days_ago=400)
    start_workflow(SCOPE, "orphan", "checks.fanout", {"items": [1]})
    run_workflows_inline(max_attempts_run=1)  # its item's job is queued
    # The item's job ended without recording it (its signal lost with its worker).
    Job.objects.filter(handler="checks.double").update(
        status=JobStatus.FAILED, error="ValueError: lost"
    )
    worker = object()
    on_worker_started(Worker, worker=worker)
    upkeep = upkeep_of(worker)
    assert upkeep is not None
    assert upkeep.caught_up.wait(30)
    on_worker_stopping(Worker, worker=worker)
    assert (upkeep.purged, upkeep.items_ended) == (0, 1)
    assert WorkflowRun.objects.filter(run_id="old-400-0").exists()
    snap = run_workflow(SCOPE, "orphan")
    assert snap.status == RunStatus.FAILED
    assert "ActivityJobEnded: its job ended Failed without recording it: ValueError: lost" in (
        snap.error
    )


def test_every_worker_starts_and_stops_it():
    for signal in (worker_started, worker_stopping):
        assert "workflows.upkeep" in {key[0] for key, *_ in signal.receivers}
