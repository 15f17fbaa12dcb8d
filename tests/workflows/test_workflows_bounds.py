"""Bounded work: a map's items are bounded (``WORKFLOWS["MAX_MAP_ITEMS"]``, a typed
error at the call), a large map is queued in one bulk submit with its checkpoint on
PostgreSQL and in batches on SQLite (items and their jobs in bulk, each batch its
own transaction), its results' size is checked as items end, and a
resume that could only fail the same way says so."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from jobs import JobStatus
from jobs.models import Batch, Job
from jobs.types import FinishOutcome
from tests.conftest import in_own_connection, is_postgres, run_concurrently
from tests.support.workflows import later_clock
from workflows import (
    RunStatus,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    activity,
    start_workflow,
    store,
    workflow,
)
from workflows.exceptions import ResumeWouldFail, TooManyItems
from workflows.models import WorkflowItem, WorkflowRun, WorkflowStep
from workflows.testing import TestClock, run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-bounds"


@activity("bounds.echo", retries=2)
def echo(value: Any) -> Any:
    return value


@workflow("bounds.echoes", version=1)
def echoes(wf: WorkflowContext) -> Any:
    return wf.map("echo", echo, wf.input)


@activity("bounds.pad")
def pad(size: int) -> str:
    return "x" * size


@workflow("bounds.pads", version=1)
def pads(wf: WorkflowContext) -> Any:
    return wf.map("pad", pad, wf.input)


@workflow("bounds.caught", version=1)
def caught(wf: WorkflowContext) -> Any:
    try:
        return wf.map("echo", echo, wf.input)
    except TooManyItems as exc:
        return f"too many: {exc}"


def test_a_map_over_the_item_bound_is_a_typed_error_at_the_call_and_queues_nothing(settings):
    settings.WORKFLOWS = {"MAX_MAP_ITEMS": 3}
    start_workflow(SCOPE, "many-1", "bounds.echoes", [1, 2, 3, 4])
    snap = run_workflow(SCOPE, "many-1")
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "echo"
    assert snap.error.startswith(
        "TooManyItems: map 'echo': 4 items, more than WORKFLOWS['MAX_MAP_ITEMS'] (3)"
    )
    assert not WorkflowStep.objects.exists()
    assert not WorkflowItem.objects.exists()
    assert not Job.objects.filter(handler="bounds.echo").exists()
    # The body can catch it; a map within the bound runs.
    start_workflow(SCOPE, "many-2", "bounds.caught", [1, 2, 3, 4])
    assert run_workflow(SCOPE, "many-2").output.startswith("too many: map 'echo': 4 items")
    start_workflow(SCOPE, "many-3", "bounds.echoes", [1, 2, 3])
    assert run_workflow(SCOPE, "many-3").output == [1, 2, 3]


def test_a_large_map_is_queued_with_its_checkpoint_in_one_bulk_submit_on_postgresql():
    items = list(range(1200))
    start_workflow(SCOPE, "bulk-1", "bounds.echoes", items)
    with CaptureQueriesContext(connection) as queries:
        run_workflows_inline(max_attempts_run=1)
    # (A job's claim or finish, which may insert a batch's ``then`` job, is left out.)
    inserts = [
        q["sql"] for q in queries if "INSERT INTO" in q["sql"] and "UPDATE jobs_job" not in q["sql"]
    ]
    item_inserts = [sql for sql in inserts if "workflows_workflowitem" in sql]
    # (In a fair queue the batch also takes its places from a lane: not a job insert.)
    job_inserts = [sql for sql in inserts if "INSERT INTO jobs_job " in sql]
    batch_inserts = [sql for sql in inserts if "INSERT INTO jobs_batch " in sql]
    # One jobs batch of every item: its row with the checkpoint and its first 100
    # items (their jobs start at once), then the rest, which join it: in one insert
    # of the items and one of their jobs on PostgreSQL; 500 per transaction on SQLite
    # (its jobs inserted in chunks of its limit of bound parameters).
    if is_postgres():
        assert (len(batch_inserts), len(job_inserts), len(item_inserts)) == (1, 2, 2)
    else:
        assert (len(batch_inserts), len(item_inserts)) == (1, 4)
        assert 4 <= len(job_inserts) <= 12, job_inserts
    assert Job.objects.filter(handler="bounds.echo", status=JobStatus.QUEUED).count() == len(items)


def test_a_large_map_is_queued_in_batches_each_committed_on_its_own(monkeypatch):
    # (A map's first 100 items go with its checkpoint, then on SQLite 500 per
    # transaction, the rest at once on PostgreSQL.)
    monkeypatch.setattr(store, "first_items", lambda: 2)
    monkeypatch.setattr(store, "items_per_transaction", lambda: 2)
    seen_by_others: list[int] = []
    real = store.insert_items

    def insert_items(step: Any, *args: Any, start: int = 0, **kwargs: Any) -> str:
        # What another connection sees as each batch is queued: the batches before.
        count = in_own_connection(lambda: WorkflowItem.objects.count())
        (outcome,) = run_concurrently(count)
        seen_by_others.append(outcome.value)
        return real(step, *args, start=start, **kwargs)

    monkeypatch.setattr(store, "insert_items", insert_items)
    start_workflow(SCOPE, "batches-1", "bounds.echoes", [10, 11, 12, 13, 14])
    run_workflows_inline(max_attempts_run=1)
    assert seen_by_others == [0, 2, 4]
    jobs = Job.objects.filter(handler="bounds.echo")
    assert jobs.count() == WorkflowItem.objects.count() == 5
    assert run_workflow(SCOPE, "batches-1").output == [10, 11, 12, 13, 14]


def test_a_driver_stopped_between_batches_is_replayed_to_queue_the_rest(monkeypatch):
    monkeypatch.setattr(store, "first_items", lambda: 2)
    monkeypatch.setattr(store, "items_per_transaction", lambda: 2)
    real = store.insert_items
    calls: list[int] = []

    def insert_items(step: Any, *args: Any, start: int = 0, **kwargs: Any) -> str:
        calls.append(start)
        if len(calls) == 2:  # the driver dies as it queues the second batch
            raise OperationalError("the connection was lost")
        return real(step, *args, start=start, **kwargs)

    monkeypatch.setattr(store, "insert_items", insert_items)
    start_workflow(SCOPE, "stopped-1", "bounds.echoes", [1, 2, 3, 4, 5])
    clock = TestClock()
    (advance,) = run_workflows_inline(clock=clock, max_attempts_run=1)
    assert advance.outcome is FinishOutcome.REQUEUED  # an outage: tried again
    step = WorkflowStep.objects.get()
    assert (step.status, step.item_count, store.items_queued(step)) == ("running", 5, 2)
    # The first batch's items end before the rest is queued: the run is not woken.
    for item in WorkflowItem.objects.all():
        store.end_item(item, StepStatus.SUCCEEDED, clock.now, result_json=str(item.index + 1))
    assert not Job.objects.filter(job_id__contains=":items:").exists()
    snap = run_workflow(SCOPE, "stopped-1", clock=clock)
    assert snap.output == [1, 2, 3, 4, 5]
    assert calls == [0, 2, 2, 4]
    assert WorkflowItem.objects.count() == 5
    # The rest joined the batch staged with the first items, which counted them.
    assert list(Batch.objects.values_list("total", "pending")) == [(5, 0)]
    assert Job.objects.filter(handler="bounds.echo", batch_id__isnull=False).count() == 5


def test_results_too_large_fail_the_map_as_items_end_not_after_all_ran(settings):
    settings.WORKFLOWS = {"MAX_VALUE_BYTES": 200}
    # Ten results of 42 bytes: the fifth makes the list at least 226 bytes.
    start_workflow(SCOPE, "big-1", "bounds.pads", [40] * 10)
    clock = later_clock()
    run_workflows_inline(clock=clock, max_attempts_run=1)
    ran = run_workflows_inline(clock=clock, max_attempts_run=5)
    assert [run.outcome for run in ran] == [FinishOutcome.SUCCEEDED] * 4 + [FinishOutcome.FAILED]
    assert "ResultsTooLarge: its result (42 bytes) makes the results of the map's 10" in (
        ran[4].error
    )
    item = WorkflowItem.objects.get(index=4)
    assert (item.status, item.error_type, item.attempts) == ("failed", "ResultsTooLarge", 1)
    snap = run_workflow(SCOPE, "big-1", clock=clock)
    assert snap.status == RunStatus.FAILED
    assert snap.step("pad").status == StepStatus.FAILED
    assert "ResultsTooLarge" in snap.error
    # A failed step: a resume runs it again (with a bound raised, it fits).
    settings.WORKFLOWS = {"MAX_VALUE_BYTES": 1000}
    WorkflowScope(SCOPE).resume("big-1")
    assert run_workflow(SCOPE, "big-1", clock=clock).output == ["x" * 40] * 10


def test_small_results_fit_their_share_without_a_query(settings):
    settings.WORKFLOWS = {"MAX_VALUE_BYTES": 200}
    start_workflow(SCOPE, "small-1", "bounds.pads", [1] * 10)
    clock = later_clock()
    run_workflows_inline(clock=clock, max_attempts_run=1)
    with CaptureQueriesContext(connection) as queries:
        run_workflows_inline(clock=clock, max_attempts_run=1)
    assert not [q for q in queries if "SUM(" in q["sql"].upper()]
    assert run_workflow(SCOPE, "small-1", clock=clock).output == ["x"] * 10


def test_a_resume_that_would_fail_the_same_way_says_so_and_changes_nothing(settings):
    start_workflow(SCOPE, "big-2", "bounds.pads", [40] * 10)
    clock = later_clock()
    run_workflows_inline(clock=clock, max_attempts_run=1)
    run_workflows_inline(clock=clock, max_attempts_run=10)  # every item recorded
    assert set(Job.objects.filter(handler="bounds.pad").values_list("status", flat=True)) == {
        JobStatus.SUCCEEDED
    }
    settings.WORKFLOWS = {"MAX_VALUE_BYTES": 200}  # a bound lowered meanwhile
    failed = run_workflow(SCOPE, "big-2", clock=clock)
    assert failed.status == RunStatus.FAILED
    assert failed.step("pad").status == StepStatus.RUNNING
    before = list(WorkflowRun.objects.values())
    with pytest.raises(ResumeWouldFail, match=r"map 'pad' are 431 bytes of JSON"):
        WorkflowScope(SCOPE).resume("big-2")
    assert list(WorkflowRun.objects.values()) == before
    settings.WORKFLOWS = {"MAX_VALUE_BYTES": 1000}
    assert WorkflowScope(SCOPE).resume("big-2").status == RunStatus.WAITING
    assert run_workflow(SCOPE, "big-2", clock=clock).output == ["x" * 40] * 10
