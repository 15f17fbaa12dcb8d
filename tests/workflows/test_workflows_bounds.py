"""Bounded work: a map's items are bounded (``WORKFLOWS["MAX_MAP_ITEMS"]``, a typed
error at the call), a large map is queued in one bulk submit with its checkpoint
(items and their jobs in bulk), its results' size is checked as items end, and a
resume that could only fail the same way says so."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs import JobStatus
from jobs.models import Job
from jobs.types import FinishOutcome
from tests.conftest import is_postgres
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


def test_a_large_map_is_queued_with_its_checkpoint_in_one_bulk_submit():
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
    # One jobs batch: its row and one insert of every job (SQLite splits the items
    # and the jobs by its limit of bound parameters).
    assert len(batch_inserts) == 1
    assert len(job_inserts) == 1 if is_postgres() else 1 <= len(job_inserts) <= 4, job_inserts
    assert 1 <= len(item_inserts) <= 8
    assert Job.objects.filter(handler="bounds.echo", status=JobStatus.QUEUED).count() == len(items)


def test_a_map_an_older_version_left_partly_queued_is_replayed_to_queue_the_rest(monkeypatch):
    # An older version queued a large map in several transactions; its driver
    # stopped after the first: two of five items queued.
    real = store.insert_items
    calls: list[int] = []

    def insert_items(run: Any, step: Any, spec: Any, args: list[str], start: int = 0) -> None:
        calls.append(start)
        real(run, step, spec, args[:2] if len(calls) == 1 else args, start=start)

    monkeypatch.setattr(store, "insert_items", insert_items)
    start_workflow(SCOPE, "stopped-1", "bounds.echoes", [1, 2, 3, 4, 5])
    clock = TestClock()
    run_workflows_inline(clock=clock, max_attempts_run=1)
    step = WorkflowStep.objects.get()
    assert (step.status, step.item_count, store.items_queued(step)) == ("running", 5, 2)
    # The first items end before the rest is queued: the run is not woken.
    for item in WorkflowItem.objects.all():
        store.end_item(item, StepStatus.SUCCEEDED, clock.now, result_json=str(item.index + 1))
    assert not Job.objects.filter(job_id__contains=":items:").exists()
    # Woken all the same (a signal, a timer: here by hand), its replay queues the rest.
    with transaction.atomic():
        store.wake(step.run_id, 0, "test", now=clock.now)
    snap = run_workflow(SCOPE, "stopped-1", clock=clock)
    assert snap.output == [1, 2, 3, 4, 5]
    assert calls == [0, 2]
    assert WorkflowItem.objects.count() == 5


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
