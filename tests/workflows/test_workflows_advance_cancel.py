"""A run's advance jobs live in the reserved scope "workflows", where an operator can
still cancel one in the jobs admin. When it was the run's last advance job, nothing
else would ever advance the run, so the run is cancelled with it, at once, instead
of waiting for ever; a run with another advance job goes on."""

from __future__ import annotations

import logging

import pytest
from django.db import transaction

from jobs import execution
from jobs.models import Job
from jobs.signals import finished_attempt
from jobs.testing import run_jobs_inline
from jobs.types import CancelOutcome, FinishOutcome, JobStatus
from workflows import RunStatus, WorkflowScope, start_workflow, store
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-advance-cancel"


def run_pk(run_id: str) -> int:
    return WorkflowRun.objects.get(run_id=run_id).pk


def advance_job(run_id: str) -> Job:
    return Job.objects.get(
        handler=store.ADVANCE_HANDLER, job_id__startswith=f"wf:{run_pk(run_id)}."
    )


def test_a_cancelled_queued_advance_job_cancels_its_run(caplog) -> None:
    start_workflow(SCOPE, "queued", "checks.linear", {"start": 1})
    job = advance_job("queued")
    caplog.set_level(logging.WARNING, logger="workflows")

    assert execution.reserved_scope("workflows").cancel(job.job_id) == CancelOutcome.CANCELLED

    snap = WorkflowScope(SCOPE).get("queued")
    assert snap.status == RunStatus.CANCELLED
    assert any(job.job_id in r.getMessage() for r in caplog.records), caplog.text
    run_jobs_inline(queues=["default"])  # nothing is left to advance it
    assert WorkflowScope(SCOPE).get("queued").status == RunStatus.CANCELLED


def test_a_run_held_by_an_advance_job_cancelled_in_a_look_ahead_ends_cancelled() -> None:
    start_workflow(SCOPE, "held", "checks.linear", {"start": 1})
    job = advance_job("held")
    # A worker claimed the advance job and took the run; the job is cancelled
    # before its handler runs, and the worker gives it back: Cancelled.
    claim = execution.try_start(job.scope_hash, job.job_id, worker_id="look-ahead")
    assert claim is not None
    assert store.take(run_pk("held"), job.job_id) is not None
    assert WorkflowScope(SCOPE).get("held").status == RunStatus.RUNNING
    assert execution.reserved_scope("workflows").cancel(job.job_id) == CancelOutcome.REQUESTED
    outcome = execution.release(claim.token)
    assert outcome == FinishOutcome.CANCELLED
    finished_attempt(claim, outcome, retry_scheduled=False)  # as the worker does

    assert WorkflowScope(SCOPE).get("held").status == RunStatus.CANCELLED
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED


def test_cancelling_a_finished_runs_old_job_or_another_job_changes_no_run() -> None:
    start_workflow(SCOPE, "done", "checks.linear", {"start": 1})
    run_jobs_inline(queues=["default"])
    assert WorkflowScope(SCOPE).get("done").status == RunStatus.SUCCEEDED
    job = advance_job("done")
    assert store.advance_job_cancelled(job.scope_hash, job.job_id, job.created_at) == (
        CancelOutcome.ALREADY_FINISHED
    )
    # A job of a tenant's scope with a look-alike id is no advance job.
    assert store.advance_job_cancelled("0" * 64, job.job_id, job.created_at) is None
    assert WorkflowScope(SCOPE).get("done").status == RunStatus.SUCCEEDED


def test_a_run_with_another_advance_job_goes_on_when_one_is_cancelled() -> None:
    start_workflow(SCOPE, "two-wakes", "checks.linear", {"start": 1})
    first = advance_job("two-wakes")
    with transaction.atomic():
        store.wake(run_pk("two-wakes"), 0, "extra")  # a second wake-up, queued too

    assert execution.reserved_scope("workflows").cancel(first.job_id) == CancelOutcome.CANCELLED

    assert WorkflowScope(SCOPE).get("two-wakes").status == RunStatus.WAITING
    run_jobs_inline(queues=["default"])
    assert WorkflowScope(SCOPE).get("two-wakes").status == RunStatus.SUCCEEDED
