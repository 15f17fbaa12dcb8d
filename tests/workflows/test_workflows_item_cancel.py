"""An activity item's job lives in its run's scope, so the scope's caller (or the
admin) can cancel it before its handler runs (Queued, or in a worker's look-ahead):
its item then ends Cancelled and the step fails like one whose item failed, instead
of its run waiting for it for ever."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import JobScope, execution
from jobs.signals import finished_attempt
from jobs.testing import run_jobs_inline
from jobs.types import CancelOutcome, FinishOutcome, JobStatus
from workflows import (
    RunStatus,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    activity,
    start_workflow,
    workflow,
)
from workflows.exceptions import StepFailed
from workflows.testing import TestClock, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-item-cancel"


@activity("itemcancel.triple", queue="itemcancel-held")
def triple(value: int) -> int:
    return value * 3


@workflow("itemcancel.fanout", version=1)
def fanout(wf: WorkflowContext) -> Any:
    try:
        return wf.map("triple", triple, [1, 2, 3])
    except StepFailed as failure:
        return {"key": failure.key, "type": failure.cause_type, "message": failure.cause_message}


def test_a_cancelled_queued_item_job_ends_its_item_and_the_run_goes_on() -> None:
    start_workflow(SCOPE, "fan-1", "itemcancel.fanout")
    run_jobs_inline(queues=["default"])  # the advance: the items' jobs are queued
    item_jobs = JobScope(SCOPE).list(handler="itemcancel.triple")
    assert [job.status for job in item_jobs] == [JobStatus.QUEUED] * 3

    assert JobScope(SCOPE).cancel(item_jobs[1].job_id) == CancelOutcome.CANCELLED
    snap = run_workflow(SCOPE, "fan-1", clock=TestClock())

    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == {
        "key": "triple",
        "type": "Cancelled",
        "message": "1 of 3 items failed; item 1: its job was cancelled",
    }
    step = snap.step("triple")
    assert step.status == StepStatus.FAILED
    assert step.items is not None
    assert (step.items.succeeded, step.items.cancelled) == (2, 1)


def test_cancelling_another_job_of_the_scope_touches_no_item() -> None:
    start_workflow(SCOPE, "fan-2", "itemcancel.fanout")
    run_jobs_inline(queues=["default"])
    scope = WorkflowScope(SCOPE)
    job_id = JobScope(SCOPE).list(handler="itemcancel.triple")[0].job_id
    # The same job id in another scope is another job: nothing of this run changes.
    other = JobScope("another-tenant")
    with pytest.raises(LookupError):
        other.cancel(job_id)
    snap = run_workflow(SCOPE, "fan-2", clock=TestClock())
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == [3, 6, 9]
    assert scope.get("fan-2").step("triple").items.succeeded == 3


def test_an_item_job_cancelled_before_its_handler_ran_ends_its_item() -> None:
    # A worker holds the job in its look-ahead (claimed, its handler not started);
    # the scope's caller cancels it, and the worker gives it back: Cancelled.
    start_workflow(SCOPE, "fan-3", "itemcancel.fanout")
    run_jobs_inline(queues=["default"])
    job = JobScope(SCOPE).list(handler="itemcancel.triple")[2]
    claim = execution.try_start(job.scope_hash, job.job_id, worker_id="look-ahead")
    assert claim is not None
    assert JobScope(SCOPE).cancel(job.job_id) == CancelOutcome.REQUESTED
    outcome = execution.release(claim.token)
    assert outcome == FinishOutcome.CANCELLED
    finished_attempt(claim, outcome, retry_scheduled=False)  # as the worker does

    snap = run_workflow(SCOPE, "fan-3", clock=TestClock())
    assert snap.output == {
        "key": "triple",
        "type": "Cancelled",
        "message": "1 of 3 items failed; item 2: its job was cancelled",
    }


@workflow("itemcancel.wide", version=1)
def wide(wf: WorkflowContext) -> Any:
    return wf.map("triple", triple, list(range(wf.input["items"])))


def cancel_statements(items: int, running: int, *, every: bool = False) -> list[str]:
    """Cancel a run (of a scope of its own) whose map has ``items`` item jobs,
    ``running`` of them Running: the statements that wrote the jobs' table (with
    ``every``, all the cancel's statements)."""
    scope = f"{SCOPE}-{items}"
    start_workflow(scope, "wide", "itemcancel.wide", {"items": items})
    run_jobs_inline(queues=["default"])  # the advance: the items' jobs are queued
    jobs = JobScope(scope).list(handler="itemcancel.triple", limit=items)
    started = [execution.try_start(job.scope_hash, job.job_id, "w") for job in jobs[:running]]
    assert all(started)
    with CaptureQueriesContext(connection) as queries:
        assert WorkflowScope(scope).cancel("wide") == CancelOutcome.CANCELLED
    statuses = [
        (job.status, job.cancel_requested)
        for job in JobScope(scope).list(handler="itemcancel.triple", limit=items)
    ]
    assert sorted(statuses) == sorted(
        [(JobStatus.RUNNING, True)] * running + [(JobStatus.CANCELLED, False)] * (items - running)
    )
    return [
        q["sql"]
        for q in queries.captured_queries
        if every or (q["sql"].lstrip().upper().startswith("UPDATE") and "jobs_job" in q["sql"])
    ]


def test_a_cancelled_runs_item_jobs_are_cancelled_in_a_few_statements_however_many():
    """One statement per item job was 10,000 statements for a 10,000-item map: the
    queued ones end Cancelled (and the ``then`` job that statement queued, in a
    second), the running ones are asked to stop, the items their jobs recorded keep
    their results, and the run's wake-ups are dropped: one statement each, whatever
    the map's size."""
    small = cancel_statements(6, 2)
    large = cancel_statements(60, 20)
    assert len(large) == len(small) <= 5, large


def test_a_cancel_makes_as_many_statements_for_a_thousand_items_as_for_ten():
    """Every statement of the cancel of a waiting run, its map's item jobs Queued:
    the run, its children, its items and their jobs, its checkpoints, its wake-ups
    (25 on PostgreSQL, 27 on SQLite), whatever the map's size."""
    ten = cancel_statements(10, 0, every=True)
    thousand = cancel_statements(1000, 0, every=True)
    assert len(thousand) == len(ten) < 30, thousand
